"""The pruned Lambda bundle really runs the launcher (what `sam build` ships, minus Docker)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from icebatch.catalog import open_catalog
from icebatch.settings import Settings
from icebatch_job.tickets import ensure_source_table, generate

pytestmark = pytest.mark.functional
ROOT = Path(__file__).resolve().parents[2]


def test_a_launch_decision_runs_from_the_pruned_bundle(settings: Settings, tmp_path: Path) -> None:
    from bench.launcher_weight import build_bundle

    generate(ensure_source_table(open_catalog(settings), settings.source_table), tickets=20, batches=2, seed=1)
    bundle, runtime, _ = build_bundle(tmp_path / "build")
    code = (
        "import sys, json; sys.path[:0] = sys.argv[2:]; from icebatch.invoke import invoke; "
        "r = invoke('launcher', json.load(open(sys.argv[1]))); "
        "assert 'pyarrow' not in sys.modules; print(json.dumps(r['decision']))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code, str(ROOT / "sam/events/schedule.json"), str(bundle), str(runtime)],
        capture_output=True,
        text=True,
        timeout=180,
        env={
            "ICEBATCH_HOME": str(settings.home),
            "ICEBATCH_DRY_RUN": "true",
            "AWS_DEFAULT_REGION": "us-east-1",
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    decision = json.loads(done.stdout.strip().splitlines()[-1])
    assert (decision["decision"], decision["backlog_rows"]) == ("dry_run", 20)
