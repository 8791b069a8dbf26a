"""A run's log under the home: what the job starts writes there, the person's terminal gets icebatch's lines only
(``icebatch.tools.run_log``, ``icebatch.core.terminal.console``); driven in a real process with real child processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

PROGRAM = textwrap.dedent("""
    import logging, subprocess, sys
    from pathlib import Path
    from icebatch.core.terminal import console
    from icebatch.tools.run_log import to_run_log

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    print("before: stdout")
    with to_run_log(Path(sys.argv[1])):
        console.phase("a phase")
        console.say("the report")
        print("a library's print")
        logging.getLogger("ray").warning("a library's record")
        subprocess.run(["sh", "-c", "echo child stdout; echo child stderr >&2"], check=True)
        subprocess.Popen(["sh", "-c", "sleep 0.5; echo a grandchild that outlives the block"])
    print("after: stdout")
    print("after: stderr", file=sys.stderr)
""")


def test_what_the_run_starts_goes_to_its_log_and_the_terminal_gets_icebatchs_lines(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    # given a process that opens a run log, says a phase and a report line, and lets libraries and children write
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(log)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # then the terminal holds icebatch's lines and what was written outside the block, nothing else
    assert done.stdout.splitlines() == ["before: stdout", "the report", "after: stdout"]
    assert done.stderr.splitlines() == ["[icebatch] a phase", "after: stderr"]
    # and the log holds what the libraries and the children wrote, even a child still writing after the block
    subprocess.run(["sleep", "1"], check=True)
    text = log.read_text()
    for line in (
        "a library's print",
        "WARNING:ray:a library's record",
        "child stdout",
        "child stderr",
        "a grandchild that outlives the block",
    ):
        assert line in text, text
    assert "the report" not in text and "a phase" not in text
