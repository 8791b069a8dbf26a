"""``--json``: stdout is exactly one JSON document, whatever else the process and its children write."""

from __future__ import annotations

import json
import subprocess
import sys

NOISY = """
import json, os, subprocess, sys
from icebatch.core.terminal.json_stdout import stdout_kept_for_json
with stdout_kept_for_json(True):
    print("python-level noise")
    os.write(1, b"descriptor-level noise (Ray forwarding a worker's output)\\n")
    subprocess.run([sys.executable, "-c", "print('a child process (the engine) printing')"], check=True)
print(json.dumps({"ok": True}))
print("after the block, stdout is stdout again", file=sys.stderr)
"""


def test_everything_but_the_document_goes_to_stderr() -> None:
    # given a command that prints, writes to descriptor 1 and starts a child that prints, all under --json
    # when it runs as its own process
    done = subprocess.run([sys.executable, "-c", NOISY], capture_output=True, text=True, check=True)
    # then stdout holds the one document and nothing else
    assert json.loads(done.stdout) == {"ok": True}
    assert done.stdout.strip() == '{"ok": true}'
    # and the noise is on stderr, not lost
    for noise in ("python-level noise", "descriptor-level noise", "a child process (the engine) printing"):
        assert noise in done.stderr


LINGERING = """
import atexit, json, os, subprocess, sys
from icebatch.core.terminal.json_stdout import stdout_kept_for_json_until_exit
# what still runs once the document is out: Ray's shutdown at exit, its last forwarded lines, a child
atexit.register(lambda: os.write(1, b"a worker's last line, forwarded as Ray shuts down at exit\\n"))
document = stdout_kept_for_json_until_exit(True)
print("python-level noise")
subprocess.run([sys.executable, "-c", "print('a child process (the engine) printing')"], check=True)
print(json.dumps({"ok": True}), file=document, flush=True)
print("after the document, python-level")
os.write(1, b"after the document, descriptor-level\\n")
"""


def test_a_process_that_runs_on_after_its_document_keeps_stdout_to_the_document() -> None:
    # given a job that prints its document and then goes on (Ray shut down at exit, its workers' last lines)
    # when it runs as its own process
    done = subprocess.run([sys.executable, "-c", LINGERING], capture_output=True, text=True, check=True)
    # then stdout holds the one document and nothing else, whatever was written after it
    assert done.stdout.strip() == '{"ok": true}', done.stdout
    # and everything else is on stderr, not lost
    for noise in ("python-level noise", "the engine", "after the document, python-level", "descriptor-level", "Ray"):
        assert noise in done.stderr, noise


FAILING = """
import atexit, os, sys
from icebatch.core.terminal.command_line import run_cli, StrictParser
from icebatch.core.errors import TransientError
from icebatch.core.terminal.json_stdout import stdout_kept_for_json_until_exit

atexit.register(lambda: os.write(1, b"a worker's last line, forwarded as Ray shuts down at exit\\n"))

def body(args):
    stdout_kept_for_json_until_exit(args.json)
    print("the job's noise")
    raise TransientError("the catalog is unreachable")

parser = StrictParser(prog="job")
parser.add_argument("--json", action="store_true")
sys.exit(run_cli("job", parser, ["--json"], body))
"""


def test_a_process_that_fails_after_moving_stdout_prints_its_error_document_there() -> None:
    # given a job that moved stdout for its document, then failed (a dependency unavailable), with more at exit
    done = subprocess.run([sys.executable, "-c", FAILING], capture_output=True, text=True)
    # then stdout is its one error document, with the exit status the error means
    assert done.returncode == 3, done.stderr
    document = json.loads(done.stdout)
    assert document["error"]["type"] == "TransientError" and "unreachable" in document["error"]["message"]
    # and the rest is on stderr: the line a person reads, the noise, what ran at exit
    assert "the catalog is unreachable" in done.stderr and "the job's noise" in done.stderr and "Ray" in done.stderr
