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
