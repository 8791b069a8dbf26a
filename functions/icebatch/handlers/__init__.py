"""Lambda entry points: thin handlers that parse an event, call one function and return.

Settings are built once per container from the environment (``current_settings``). Embedding code
(the CLI, the local bus, tests) hands its own with ``use_settings``.
"""

from __future__ import annotations

from icebatch.settings import Settings

_settings: Settings | None = None

# Metrics counting permanent errors: answered without a retry (a retry cannot succeed), so no dead letter
# records them. They are published with the `service` dimension alone, which template.yaml's alarms watch
# (per-consumer figures carry an extra dimension set).
PERMANENT_ERROR_METRICS = {
    "launcher": ("LaunchErrors", "InvalidEvents"),
    "reporter": ("ReportErrors", "InvalidEvents"),
}


def current_settings() -> Settings:
    global _settings
    if _settings is None:
        _settings = Settings.from_env()
    return _settings


def use_settings(settings: Settings | None) -> None:
    """Make the handlers use these settings (None: read the environment again on next use)."""
    global _settings
    _settings = settings
