"""``--json`` means stdout is exactly one JSON document: everything else goes to stderr meanwhile.

Redirecting ``sys.stdout`` is not enough for the job: Ray forwards its workers' output (vLLM's engine
logs to stdout) to the driver's file descriptor 1, and child processes inherit it. So descriptor 1
itself points at stderr while the block runs; the caller prints its document after the block.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from icebatch.core.terminal import console


@contextlib.contextmanager
def stdout_kept_for_json(enabled: bool) -> Iterator[None]:
    """While the block runs (when ``enabled``), anything written to stdout goes to stderr."""
    if not enabled:
        yield
        return
    with _console_kept_for_json(), _descriptor_1_to_stderr():
        yield


@contextlib.contextmanager
def _console_kept_for_json() -> Iterator[None]:
    """The console's report lines (``icebatch.core.terminal.console.say``) go to its stderr too."""
    previous = console.current()
    console.redirect((console.err(), console.err()))
    try:
        yield
    finally:
        console.redirect(previous)


@contextlib.contextmanager
def _descriptor_1_to_stderr() -> Iterator[None]:
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 (a daemon): Python-level output is all there is to move
        with contextlib.redirect_stdout(sys.stderr):
            yield
        return
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)
