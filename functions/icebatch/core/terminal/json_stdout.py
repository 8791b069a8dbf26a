"""``--json`` means stdout is exactly one JSON document: everything else goes to stderr meanwhile.

Redirecting ``sys.stdout`` is not enough for the job: Ray forwards its workers' output (vLLM's engine
logs to stdout) to the driver's file descriptor 1, and child processes inherit it. So descriptor 1
itself points at stderr while the block runs; the caller prints its document after the block.

A process that still runs code after its document (the job: Ray shut down at exit, its workers' last lines
forwarded by then) uses ``stdout_kept_for_json_until_exit``: descriptor 1 stays on stderr until the process
ends, and the document goes to the real stdout through a descriptor of its own.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TextIO

from icebatch.core.terminal import console


@contextlib.contextmanager
def stdout_kept_for_json(enabled: bool) -> Iterator[None]:
    """While the block runs (when ``enabled``), anything written to stdout goes to stderr."""
    if not enabled:
        yield
        return
    with _console_kept_for_json(), _descriptor_1_to_stderr():
        yield


_document: TextIO | None = None  # the real stdout, once stdout_kept_for_json_until_exit moved descriptor 1


def stdout_kept_for_json_until_exit(enabled: bool) -> TextIO:
    """From now until the process ends (when ``enabled``), anything written to stdout goes to stderr; the stream
    returned is the real stdout, for the one document (the console's stdout when not ``enabled``). A command
    that fails meanwhile prints its error document there too (``document_stream``)."""
    global _document
    if not enabled:
        return console.out()
    if _document is None:
        sys.stdout.flush()
        try:
            _document = os.fdopen(os.dup(1), "w", closefd=True)
        except OSError:  # no descriptor 1 (a daemon): nothing reads a document
            _document = open(os.devnull, "w")  # noqa: SIM115 (open until the process ends)
            return _document
        os.dup2(2, 1)
        console.redirect((console.err(), console.err()))
    return _document


def document_stream() -> TextIO:
    """Where a command's one JSON document goes: the real stdout, wherever descriptor 1 points now."""
    return _document or sys.stdout


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
