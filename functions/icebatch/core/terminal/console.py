"""Where icebatch's own lines for a person go — what a run will do, its phases, progress, the report — apart
from the records of what it runs (Ray, vLLM, the handlers' logs).

By default both are this process's stdout and stderr. ``icebatch job run`` (``icebatch.tools.run_log``) sends
the process's file descriptors 1 and 2 to the run's log under the home, which Ray's and vLLM's processes
inherit, and points the console at the terminal: the terminal shows icebatch's lines only, the log has
everything (``-v`` leaves the terminal as it is).
"""

from __future__ import annotations

import sys
from typing import TextIO

_streams: tuple[TextIO, TextIO] | None = None


def out() -> TextIO:
    """The person's stdout (the report)."""
    return _streams[0] if _streams is not None else sys.stdout


def err() -> TextIO:
    """The person's stderr (phases, progress)."""
    return _streams[1] if _streams is not None else sys.stderr


def current() -> tuple[TextIO, TextIO] | None:
    """Where the console points now (None: the process's own streams), to restore later."""
    return _streams


def redirect(streams: tuple[TextIO, TextIO] | None) -> None:
    """Point the console at these (stdout, stderr), or back at the process's own (None)."""
    global _streams
    _streams = streams


def say(text: str) -> None:
    """A line of the report (stdout of the console)."""
    print(text, file=out(), flush=True)


def phase(message: str) -> None:
    """A phase of a run as it happens: ``[icebatch] message`` (stderr of the console)."""
    print(f"[icebatch] {message}", file=err(), flush=True)
