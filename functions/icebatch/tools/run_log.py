"""A run's full log under the home, with the terminal kept for icebatch's own lines (``core.terminal.console``).

While ``to_run_log(path)`` is open, this process's file descriptors 1 and 2 write to ``path``: Python's
``sys.stdout``/``sys.stderr``, every logging handler on them, Ray's forwarded worker output, and every process
started meanwhile (Ray's, vLLM's engine core and model worker inherit them) end up in the log, whatever writes
them. The console writes to the terminal through duplicates of the descriptors as they were.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from icebatch.core.settings import Settings, ensure_folder
from icebatch.core.terminal import console


def run_log_path(settings: Settings, what: str) -> Path:
    """``$ICEBATCH_HOME/logs/<what>-<UTC time>.log`` (the folder made)."""
    folder = settings.home / "logs"
    ensure_folder(folder)
    return folder / f"{what}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}.log"


@contextmanager
def to_run_log(path: Path) -> Iterator[Path]:
    """Descriptors 1 and 2 to ``path`` while the block runs, unless the records are wanted live (``-v``, or
    ``ICEBATCH_LOG_LEVEL=DEBUG``: the root logger at DEBUG), when nothing moves."""
    if logging.getLogger().isEnabledFor(logging.DEBUG):
        yield path
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    before = {1: saved[0], 2: saved[1]}
    terminal = [_terminal(sys.stdout, before), _terminal(sys.stderr, before)]
    opened = [t for t, was in zip(terminal, (sys.stdout, sys.stderr), strict=True) if t is not was]
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        console.redirect((terminal[0], terminal[1]))
        yield path
    finally:
        console.redirect(None)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log_fd):
            os.close(fd)
        for stream in opened:
            stream.close()


def _terminal(stream: TextIO, before: dict[int, int]) -> TextIO:
    """What writes where ``stream`` wrote before: a new stream on a duplicate of its descriptor as it was, or,
    where Python's stream is on no descriptor (a test's capture), that stream itself."""
    try:
        fd = stream.fileno()
        if fd in before:
            return os.fdopen(os.dup(before[fd]), "w", buffering=1)
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        pass
    return stream
