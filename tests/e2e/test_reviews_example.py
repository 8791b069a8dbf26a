"""The product-reviews example (examples/product-reviews/) as its README says to run it: its lines, in order, as
typed, in a copy of the folder, through the same CLI users have; then `icebatch init` on its table proposes what
its shipped task reads."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "product-reviews"


def _lines() -> list[str]:
    """The README's commands (python and icebatch lines of its bash blocks), comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", (EXAMPLE / "README.md").read_text(), flags=re.S)
    lines = [line.split("  #", 1)[0].strip() for body in blocks for line in body.splitlines()]
    return [line for line in lines if line.startswith(("python ", "icebatch "))]


def _run(line: str, project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    words = shlex.split(line)
    command = (
        [sys.executable, *words[1:]]
        if words[0] == "python"
        else [sys.executable, "-m", "icebatch.tools.cli", *words[1:]]
    )
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=project, timeout=900)


def test_the_reviews_example_runs_as_its_readme_says(tmp_path: Path) -> None:
    # given a copy of the example folder (no state in it) and a shell with no icebatch or pyiceberg settings
    project = tmp_path / "product-reviews"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns(".icebatch", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ICEBATCH_", "PYICEBERG_"))}
    lines = _lines()
    assert lines[:2] == ["python make_table.py", "icebatch validate"] and "icebatch launch" in lines, lines
    out: dict[str, str] = {}
    # when each line runs in it, in order, then each succeeds
    for line in lines:
        done = _run(line, project, env)
        assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        out[line] = out.get(line, "") + done.stdout
    # and a launch of so few rows waited for one that pays (the cost gate), saying so in the table's own words
    assert (
        "decision                      : wait" in out["icebatch launch"] and "20 reviews" not in out["icebatch launch"]
    )
    # and the first forced launch labelled the 20 reviews, the second only the 12 new ones, in the table's own words
    launches = out["icebatch launch --force"]
    assert launches.count("submission                    : ran in-process: completed") == 2, launches
    assert "tickets" not in launches and "20 reviews" in launches and "12 reviews" in launches, launches
    # and the unhappy reviews' verdicts came with their text, one each, and nothing else
    unhappy = list(csv.DictReader(io.StringIO(out['icebatch results --where "stars <= 2" --format csv'])))
    assert unhappy and all(int(r["stars"]) <= 2 and r["product"] for r in unhappy)
    assert {r["quality"] for r in unhappy} <= {"positive", "negative", "mixed", "not_mentioned"}
    # and every review has exactly one current verdict
    every = _run("icebatch results --limit 1000 --json", project, env)
    rows = json.loads(every.stdout)["rows"]
    assert sorted(r["source_id"] for r in rows) == [f"rv-{i:06d}" for i in range(32)]
    # and the history holds the two runs, of 20 and 12 reviews, both completed
    assert out["icebatch runs"].count(" completed ") == 2, out["icebatch runs"]
    history = json.loads(_run("icebatch runs --json", project, env).stdout)["runs"]
    assert sorted((r["status"], r["rows"]) for r in history) == [("completed", 12), ("completed", 20)], history


def test_init_on_the_example_table_proposes_what_its_task_reads(tmp_path: Path) -> None:
    # given the example's table
    project = tmp_path / "product-reviews"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns(".icebatch", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ICEBATCH_", "PYICEBERG_"))}
    assert _run("python make_table.py", project, env).returncode == 0
    # when `icebatch init` scaffolds a consumer of it in a subfolder of the project (its home found above)
    draft = project / "draft"
    draft.mkdir()
    done = _run("icebatch init shop.reviews --consumer aspects", draft, env)
    assert done.returncode == 0, done.stderr
    # then it proposes the shipped task's id column, and text columns the shipped task reads
    scaffold = yaml.safe_load((draft / "tasks" / "aspects.yaml").read_text())
    shipped = yaml.safe_load((EXAMPLE / "tasks" / "aspects.yaml").read_text())
    assert scaffold["id_column"] == shipped["id_column"] == "review_id"
    assert set(scaffold["input_columns"]) <= set(shipped["input_columns"]), (scaffold, shipped)
