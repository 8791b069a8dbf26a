"""The tests exercise this clone's code, whichever clone the shared venv's editable install points at."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import icebatch
import icebatch_job

ROOT = Path(__file__).resolve().parents[2]


def test_the_test_process_and_its_subprocesses_import_this_clone() -> None:
    # given the venv shared by every clone of the lock (its editable install may point elsewhere)
    # when the tests, and a process they start, import the packages
    code = "import icebatch, icebatch_job; print(icebatch.__file__); print(icebatch_job.__file__)"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    # then every import resolves inside this clone
    for path in [icebatch.__file__, icebatch_job.__file__, *child.stdout.split()]:
        assert Path(str(path)).resolve().is_relative_to(ROOT), path
