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


class RefusedError(TransientError):
    """The deployment refuses a call (a role without the grant, a resource gone, a key disabled): retrying cannot
    help until an operator fixes it, so the input is kept: raised, retried by the platform a bounded number of
    times, then kept in the on-failure destination, to be re-driven once fixed."""


class ConfigError(PermanentError):
    """A setting is missing or invalid."""


class TableNotFoundError(PermanentError):
    """A table named in the settings does not exist in the catalog."""


class CatalogUnavailableError(TransientError):
    """The catalog could not be reached."""


class WatermarkError(PermanentError):
    """The consumer's watermark is unreadable or no longer in the source table's history."""


class SourceReplacedError(WatermarkError):
    """The catalog's source table is another table (another UUID) than the one the consumer's ledger follows."""


class WatermarkConflictError(IcebatchError):
    """Another run advanced the watermark first; this run's output was discarded."""


class CommitOutcomeUnknownError(TransientError):
    """A commit failed in a way that leaves its outcome unknown, and looking for it did not settle it."""


class InvalidEventError(PermanentError):
    """An event does not match any accepted shape."""


class TaskSpecError(PermanentError):
    """The task spec (prompt, output schema, sampling) is invalid."""


class InvalidTaskError(PermanentError):
    """The consumer's task cannot run against its source table as it is now (a column missing or dropped)."""


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


# Exit statuses of the command lines (icebatch, python -m icebatch_job), documented in docs/operating.md.
EXIT_OK = 0
EXIT_FAILED = 1  # the job failed ("Batch Job Failed" was emitted), or an unexpected error
EXIT_PERMANENT = 2  # bad input or configuration: the message says what to fix
EXIT_TRANSIENT = 3  # a dependency is unavailable: retry later
EXIT_OTHER = 4  # another icebatch error (e.g. a commit conflict outside a job)
EXIT_CONFLICT = 5  # the job found its range already covered by another run: nothing to do
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # stdout's reader went away (`| head`): 128 + SIGPIPE, as a command killed by it


def exit_status(error: BaseException) -> tuple[int, str]:
    """(status, one-line message prefix) for an error that ends a command."""
    if isinstance(error, PermanentError):
        return EXIT_PERMANENT, "error"
    if isinstance(error, TransientError):
        return EXIT_TRANSIENT, "unavailable (retry later)"
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    return EXIT_OTHER, "failed"
