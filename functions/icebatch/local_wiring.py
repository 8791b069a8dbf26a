"""The embedded default's plumbing: an in-process event bus wired like the AWS application."""

from __future__ import annotations

from icebatch.bus import LocalBus
from icebatch.settings import Settings


def local_bus(settings: Settings) -> LocalBus:
    """A LocalBus under ICEBATCH_HOME with the template's rules (completion/failure -> reporter)."""
    return LocalBus(settings.home_abs)
