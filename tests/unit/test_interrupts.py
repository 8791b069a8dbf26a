"""Graceful preemption's signal handler (process/interrupts.py), in a process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_CHILD = """
import io
import os
import signal
import sys

from icebatch_job.process.interrupts import Interrupts, JobInterrupted


class Stderr(io.RawIOBase):  # stderr whose writes run Python code (a tee, a log shipper): the signal lands inside
    signalled = False

    def writable(self):
        return True

    def fileno(self):
        return 2

    def write(self, data):
        if not Stderr.signalled:
            Stderr.signalled = True
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, stderr's buffer locked by this write
        return os.write(2, bytes(data))


sys.stderr = io.TextIOWrapper(io.BufferedWriter(Stderr()), write_through=True)
interrupts = Interrupts(drain_seconds=60)
interrupts.install()
try:
    with interrupts.critical():
        print("a failpoint's line", file=sys.stderr, flush=True)
except JobInterrupted as e:
    print(f"stopped {e}", flush=True)
"""


def test_a_signal_that_lands_inside_a_print_to_stderr_still_stops_the_job_cleanly() -> None:
    # given a job whose main thread is inside a print to stderr when SIGTERM comes (the handler says so on stderr)
    child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60)
    # then the handler's line and the print's both land, and the job stops as a first signal stops it, no traceback
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout == "stopped by SIGTERM; the next attempt resumes the run\n"
    assert "a second signal exits at once" in child.stderr and "a failpoint's line" in child.stderr
    assert "Traceback" not in child.stderr and "reentrant" not in child.stderr


def test_sigint_is_handled_as_sigterm_is() -> None:
    # given the job's interrupts installed (in a process of its own: the handlers are the process's)
    code = (
        "import signal\n"
        "from icebatch_job.process.interrupts import Interrupts\n"
        "Interrupts(drain_seconds=60).install()\n"
        "on_int, on_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)\n"
        "print(on_int == on_term, callable(on_int))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    # then Ctrl-C takes the path a pod's SIGTERM takes (the hygiene tier ends a running job with SIGTERM only)
    assert done.stdout.split() == ["True", "True"], done.stderr
