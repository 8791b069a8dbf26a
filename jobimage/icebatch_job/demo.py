"""`make demo` / `icebatch demo`: the whole flow on this machine, with the same handlers as on AWS.

1. the tiny model (built once, cached under ICEBATCH_HOME),
2. a backlog: generated tickets appended over several commits to the local Iceberg table,
3. the backlog as the launcher sees it (metadata only),
4. the launcher handler invoked with sam/events/schedule.json: the local backend runs the job here
   (Ray Data + vLLM on CPU), the completion event goes through the local bus to the reporter handler,
   which prints the cost report and files it under ICEBATCH_HOME/reports,
5. the launcher again: nothing new, no job.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from icebatch.settings import Settings

SCHEDULE_EVENT = Path(__file__).resolve().parents[2] / "sam" / "events" / "schedule.json"


def _schedule_event() -> dict[str, Any]:
    if SCHEDULE_EVENT.exists():
        data: dict[str, Any] = json.loads(SCHEDULE_EVENT.read_text())
        return data
    return {"trigger": "schedule", "schedule": "nightly"}


def run_demo(settings: Settings, *, tickets: int = 300, batches: int = 5, out: Callable[[str], None] = print) -> int:
    from icebatch.catalog import open_catalog
    from icebatch.handlers import use_settings
    from icebatch.invoke import invoke
    from icebatch.ledger import open_ledger

    from icebatch_job.model import resolve_model
    from icebatch_job.tickets import ensure_source_table, generate

    started = time.monotonic()

    def step(n: int, text: str) -> None:
        out(f"\n==> {n}/5 {text}")

    step(1, "the model")
    model = resolve_model(settings)
    out(
        f"    {model}"
        + ("  (the tiny local model: random weights, schema-valid answers)" if not settings.model_source else "")
    )

    step(2, f"{tickets} new support tickets in {batches} commits to {settings.source_table}")
    table = ensure_source_table(open_catalog(settings), settings.source_table)
    generate(table, tickets=tickets, batches=batches, seed=None,
             on_snapshot=lambda i, n, sid: out(f"    commit {i}/{batches}: {n} tickets -> snapshot {sid}"))  # fmt: skip

    step(3, "the backlog, from Iceberg metadata only")
    backlog = open_ledger(settings, control_plane=True).backlog()
    mark = backlog.watermark_snapshot_id or "(none yet: first run)"
    out(f"    {backlog.rows} rows in {backlog.snapshots} snapshots after watermark {mark}")

    use_settings(settings)
    try:
        step(
            4,
            f"the launcher with {SCHEDULE_EVENT.name}: the local backend runs the job here (progress on "
            "stderr, its log under jobs/), the completion event reaches the reporter, which prints the report",
        )
        first = invoke("launcher", _schedule_event(), logs_to_stderr=True)["decision"]
        out(f"    launcher decision: {first['decision']} ({first['reason']}) -> job {first.get('job_name')}: "
            f"{first.get('submission')}")  # fmt: skip

        step(5, "the launcher again")
        second = invoke("launcher", _schedule_event(), logs_to_stderr=True)["decision"]
        out(f"    launcher decision: {second['decision']} ({second['reason']})")
    finally:
        use_settings(None)

    ok = (
        first["decision"] == "launch"
        and "completed" in (first.get("submission") or "")
        and second["decision"] == "skip"
        and second["backlog_rows"] == 0
    )
    minutes = (time.monotonic() - started) / 60
    if ok:
        catalog = settings.catalog_props()["uri"]
        out(f"\nDone in {minutes:.1f} min. Results: {settings.results_table} ({catalog})")
        out(f"Reports: {settings.reports_dir}")
        return 0
    out(f"\nThe demo did not go as expected after {minutes:.1f} min: see the decisions above and the log on stderr.")
    return 1
