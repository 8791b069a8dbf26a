"""`make demo` as a test: a fresh ICEBATCH_HOME, the real engine on CPU, the same handlers as on AWS."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from icebatch.ledger import open_ledger
from icebatch.settings import Settings

pytestmark = pytest.mark.e2e


def test_the_demo_runs_the_whole_flow_then_finds_nothing_new(tmp_path: Path) -> None:
    home = tmp_path / ".icebatch"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEBATCH_")}
    done = subprocess.run(
        [sys.executable, "-m", "icebatch.cli", "demo", "--tickets", "200", "--batches", "4"],
        capture_output=True,
        text=True,
        env={**env, "ICEBATCH_HOME": str(home)},
        timeout=900,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    # every step, in order
    positions = [out.index(f"==> {n}/5") for n in range(1, 6)]
    assert positions == sorted(positions)
    assert out.count("tickets -> snapshot") == 4 and "200 rows in 4 snapshots" in out
    # the job ran (progress on stderr), the report reached the reporter and was printed and filed
    assert "rows" in done.stderr and "100.0%" in done.stderr
    assert "[report] icebatch triage: 200 tickets, $" in out
    for block in ("INCREMENTAL STATE", "BATCH SUMMARY", "TOKENOMICS"):
        assert block in out
    assert "launcher decision: launch (scheduled drain of 200 rows)" in out and "ran in-process: completed" in out
    assert "launcher decision: skip (nothing new since the watermark)" in out
    assert len(list((home / "reports").glob("*.completed.txt"))) == 1
    assert "BATCH SUMMARY" in next((home / "jobs").glob("*.log")).read_text()
    # and the ledger holds every ticket once
    ledger = open_ledger(Settings(home=home))
    ids = ledger.results().scan(selected_fields=("source_id",)).to_arrow()["source_id"].to_pylist()
    assert len(ids) == len(set(ids)) == 200 and ledger.backlog().rows == 0
