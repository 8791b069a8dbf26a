"""A flat family of named errors. Each message says what happened and what to do.

Permanent errors (bad input, bad config) derive from ``PermanentError``: handlers log them and do not
ask the platform to retry. Transient ones derive from ``TransientError`` and are re-raised.
"""

from __future__ import annotations


class IcebatchError(Exception):
    """Base of every error icebatch raises on purpose."""


class PermanentError(IcebatchError):
    """Retrying the same input cannot succeed."""


class TransientError(IcebatchError):
    """A dependency is briefly unavailable; the platform should retry."""


class ConfigError(PermanentError):
    """A setting is missing or invalid."""


class TableNotFoundError(PermanentError):
    """A table named in the settings does not exist in the catalog."""


class CatalogUnavailableError(TransientError):
    """The catalog could not be reached."""


class WatermarkError(PermanentError):
    """The consumer's watermark is unreadable or no longer in the source table's history."""


class WatermarkConflictError(IcebatchError):
    """Another run advanced the watermark first; this run's output was discarded."""


class CommitOutcomeUnknownError(TransientError):
    """A commit failed in a way that leaves its outcome unknown, and looking for it did not settle it."""


class InvalidEventError(PermanentError):
    """An event does not match any accepted shape."""


class TaskSpecError(PermanentError):
    """The task spec (prompt, output schema, sampling) is invalid."""


class ManifestInvalidError(PermanentError):
    """A RayJob manifest was rejected by the API server's schema validation."""


class ClusterPermissionError(PermanentError):
    """The Kubernetes API refused the request (RBAC / EKS access entry)."""


class ClusterUnavailableError(TransientError):
    """The Kubernetes API (or Ray's job API) could not be reached."""


class ModelUnavailableError(PermanentError):
    """The model source cannot be loaded."""


class IncompleteRunError(TransientError):
    """A run produced fewer or more result rows than its range holds; nothing was committed."""


class TooManyErrorsError(TransientError):
    """Too many rows of a run failed in the engine or endpoint; nothing was committed."""
