"""The embedded default's plumbing: an in-process event bus wired like the AWS application.

The rules are the template's (``icebatch.rules``): completion/failure events reach the reporter
handler, called exactly as Lambda would call it; its notifier prints the report and writes it under
``$ICEBATCH_HOME/reports``.
"""

from __future__ import annotations

from typing import Any

from icebatch.bus import LocalBus
from icebatch.rules import PATTERNS
from icebatch.settings import Settings


def local_bus(settings: Settings) -> LocalBus:
    """A LocalBus under ICEBATCH_HOME with the template's completion/failure -> reporter rule."""

    def reporter(event: dict[str, Any]) -> Any:
        from icebatch.handlers import current_settings, use_settings
        from icebatch.invoke import invoke

        previous = current_settings()
        use_settings(settings)
        try:
            result = invoke("reporter", event, logs_to_stderr=True)
        finally:
            use_settings(previous)
        if result.get("status") in {"rejected", "error"}:
            raise RuntimeError(f"reporter: {result.get('reason')}")
        return result

    bus = LocalBus(settings.home_abs)
    bus.subscribe(PATTERNS["reporter"], reporter)
    return bus
