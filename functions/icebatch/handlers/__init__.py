"""Lambda entry points: thin handlers that parse an event, call one function and return.

Settings are built once per container from the environment (``current_settings``). Embedding code
(the CLI, the local bus, tests) hands its own with ``use_settings``.
"""

from __future__ import annotations

from icebatch.settings import Settings

_settings: Settings | None = None


def current_settings() -> Settings:
    global _settings
    if _settings is None:
        _settings = Settings.from_env()
    return _settings


def use_settings(settings: Settings | None) -> None:
    """Make the handlers use these settings (None: read the environment again on next use)."""
    global _settings
    _settings = settings
