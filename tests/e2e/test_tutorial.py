"""The tutorial (docs/tutorial.md) as a user follows it: its script makes a table, then each `icebatch` command
it shows runs in that order, in a new folder, as typed (the project's home found, not given), to the labels."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"


def _steps() -> list[tuple[str, str]]:
    """The page's python scripts and icebatch commands, in the page's order."""
    steps: list[tuple[str, str]] = []
    for language, body in re.findall(r"```(python|bash)\n(.*?)```", TUTORIAL.read_text(), flags=re.S):
        if language == "python":
            steps.append(("python", body))
            continue
        lines = [line.split("  #", 1)[0].strip() for line in body.splitlines()]
        steps += [("icebatch", line) for line in lines if line.startswith("icebatch ")]
    return steps


def test_the_tutorial_takes_a_new_table_to_its_labels_as_written(tmp_path: Path) -> None:
    project = tmp_path / "shop"
    project.mkdir()
    above = [f for f in project.parents if (f / ".icebatch").is_dir()]
    assert not above, f"{above[0]}/.icebatch is above the test's temporary folder: the test cannot run here"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ICEBATCH_", "PYICEBERG_"))}
    steps = _steps()
    assert [s for kind, s in steps if kind == "icebatch"][:2] == [
        "icebatch init shop.reviews --consumer sentiment",
        "icebatch validate",
    ]
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    # given a new folder, when each step of the page runs in it as typed
    for kind, step in steps:
        if kind == "python":
            (project / "step.py").write_text(step)
            command = [sys.executable, "step.py"]
        else:
            command = [sys.executable, "-m", "icebatch.tools.cli", *shlex.split(step)[1:]]
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=project, timeout=900)
        # then each succeeds
        assert done.returncode == 0, f"{step}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        outputs[step.split("  ")[0]] = done
    # and the job's terminal output is icebatch's own: what it will do, its phases, progress, the report once,
    # where the full log is; none of Ray's, vLLM's or the handlers' lines, which are in that log
    job = outputs["icebatch job run --consumer sentiment"]
    assert [line for line in job.stderr.splitlines() if not line.startswith("[icebatch] ")] == [], job.stderr
    for phase in (
        "the full log (Ray, vLLM, icebatch's records): ",
        "run sentiment-",
        ": 3 rows of shop.reviews",
        "starting Ray",
        "] Ray up (",
        "engine ready: first answers after",
        "labelling 3 rows on cpu",
        "3/3 rows 100.0%",
    ):
        assert job.stderr.count(phase) == 1, (phase, job.stderr)
    assert job.stdout.count("BATCH SUMMARY") == 1 and job.stdout.count("[report] ") == 1, job.stdout
    assert "INFO" not in job.stdout and "WARNING" not in job.stdout, job.stdout
    log = Path(job.stderr.split("the full log (Ray, vLLM, icebatch's records): ", 1)[1].split(";", 1)[0])
    assert log.is_relative_to(project / ".icebatch") and "ledger commit" in log.read_text()
    # and the labels are there: one verdict per review, the run listed with its cost, the page written
    results = outputs["icebatch results --consumer sentiment"].stdout
    assert all(review in results for review in ("r1", "r2", "r3")), results
    assert (project / "costs.html").is_file()
    again = subprocess.run(
        [sys.executable, "-m", "icebatch.tools.cli", "runs", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
        timeout=120,
    )
    [run] = json.loads(again.stdout)["runs"]
    assert (run["consumer"], run["status"], run["rows"]) == ("sentiment", "completed", 3) and run["cost_usd"] > 0
    # and, as the page says, a second run finds nothing new
    second = subprocess.run(
        [sys.executable, "-m", "icebatch.tools.cli", "job", "run", "--consumer", "sentiment"],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
        timeout=600,
    )
    assert second.returncode == 0, second.stderr[-3000:]
