"""`make demo` / `icebatch demo`: the whole flow on this machine, with the same handlers as on AWS.

1. the tiny model (built once, cached under ICEBATCH_HOME),
2. a backlog: generated tickets appended over several commits to the local Iceberg table,
3. the backlog and the estimate of each consumer (metadata only),
4. the launcher handler invoked once with sam/events/schedule.json: the consumers share one model, so the local
   backend runs one job for both here (Ray Data + vLLM on CPU, one engine: ``icebatch_job.shared``), each run's
   completion event goes through the local bus to the reporter handler, which prints that consumer's cost report
   (its share of the job by tokens) and files it under ICEBATCH_HOME/reports,
5. the launcher again: nothing new, no job,
6. a new version of a task: its consumer must label the whole table again (a backfill); the estimate
   says what that costs, and the launcher refuses it while it exceeds the consumer's budget,
7. a few more tickets in one commit, and its Glue event (sam/events/glue-table-change.json), for consumers that
   launch on any commit whose run costs at most $0.02 per 1k rows: the cost gate waits, saying what the run would
   cost per 1k rows (start-up included) and how many more rows would make it pay,
8. the same rows, for consumers whose rows may wait at most a second (to show it): the launcher launches their run
   anyway, in one job, and each report says what it cost against the ceiling it was launched above.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from icebatch.core.consumers import Consumer, load_consumers, read_consumers_file
from icebatch.core.costs.money import usd
from icebatch.core.settings import Settings

REPO = Path(__file__).resolve().parents[3]
SCHEDULE_EVENT = REPO / "sam" / "events" / "schedule.json"
COMMIT_EVENT = REPO / "sam" / "events" / "glue-table-change.json"
STEPS = 8


def _schedule_event() -> dict[str, Any]:
    if SCHEDULE_EVENT.exists():
        data: dict[str, Any] = json.loads(SCHEDULE_EVENT.read_text())
        return data
    return {"trigger": "schedule", "schedule": "nightly"}


def _commit_event(table: str) -> dict[str, Any]:
    """A Glue commit event for ``table`` (the SAM event file's, outside a clone a manual launch as an append)."""
    if COMMIT_EVENT.exists():
        event: dict[str, Any] = json.loads(COMMIT_EVENT.read_text())
        namespace, name = table.split(".")
        event["detail"] = {**event["detail"], "databaseName": namespace, "tableName": name}
        return event
    return {"action": "launch", "as_trigger": "append"}


class Demo:
    def __init__(self, settings: Settings, out: Callable[[str], None]) -> None:
        self.settings = settings
        self.out = out
        self.consumers = load_consumers(settings)

    def step(self, n: int, text: str) -> None:
        self.out(f"\n==> {n}/{STEPS} {text}")

    def launch(self, settings: Settings | None = None, event: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        from icebatch.tools.invoke import invoke

        response = invoke("launcher", event or _schedule_event(), settings or self.settings, logs_to_stderr=True)
        if response["status"] != "ok":
            raise RuntimeError(f"the launcher answered {response['status']}: {response.get('reason')}")
        for d in response["decisions"]:
            job = f" -> job {d['job_name']}: {d['submission']}" if d.get("job_name") else ""
            self.out(f"    {d['consumer']}: {d['decision']} ({d['reason']}){job}")
        decisions: list[dict[str, Any]] = response["decisions"]
        return decisions

    def model(self) -> None:
        from icebatch_job.stages.model import resolve_model

        model = resolve_model(self.settings)
        tiny = (
            "  (the tiny local model: random weights, schema-valid answers)"
            if not self.settings.engine.model_source
            else ""
        )
        self.out(f"    {model}{tiny}")

    def tickets(self, tickets: int, batches: int) -> None:
        from icebatch_job.example.tickets import ensure_source_table, generate

        from icebatch.core.catalog import open_catalog

        table = ensure_source_table(open_catalog(self.settings), self.settings.catalog.source_table)
        generate(
            table,
            tickets=tickets,
            batches=batches,
            seed=None,
            on_snapshot=lambda i, n, sid: self.out(f"    commit {i}/{batches}: {n} tickets -> snapshot {sid}"),
        )

    def estimates(self, consumers: list[Consumer], settings: Settings | None = None) -> list[dict[str, Any]]:
        from icebatch.core.costs.estimate import estimate_run
        from icebatch.core.ledger import open_ledger

        s = settings or self.settings
        out = []
        for c in consumers:
            ledger = open_ledger(s, c, control_plane=True)
            e = estimate_run(ledger.backlog().rows, c, ledger.runs(), s).to_dict()
            budget = c.budget.max_usd_per_run if c.budget else None
            self.out(
                f"    {c.name} (v{c.task_version}): {e['rows']} rows, ~{e['output_tokens']:,} output tokens, "
                f"{e['gpu_hours']:.3f} GPU-hours, {usd(e['usd'])} "
                f"(budget per run: {budget}; {e['basis']})"
            )
            out.append(e)
        return out

    def table_rows(self) -> int:
        """The source table's rows now (its current snapshot's summary): a backfill labels every one."""
        from icebatch.core.catalog import open_catalog

        snapshot = open_catalog(self.settings).load_table(self.settings.catalog.source_table).current_snapshot()
        total = snapshot.summary.get("total-records") if snapshot is not None and snapshot.summary else None
        return int(total or 0)

    def new_version(self, name: str, budget: float) -> Settings:
        """A copy of the consumers file whose task ``name`` is one version up, with a smaller budget."""

        def bump(entry: dict[str, Any], task: dict[str, Any]) -> None:
            if entry["name"] == name:
                task["version"] += 1
                entry["budget"] = {"max_usd_per_run": budget}

        return self.consumers_copy("demo-consumers", bump)

    def gated(self, ceiling: float) -> Settings:
        """A copy of the consumers file where any commit may launch a run, if it costs at most ``ceiling`` per 1k
        rows (the example's thresholds would hold a small commit back before the gate looked at it)."""

        def gate(entry: dict[str, Any], _task: dict[str, Any]) -> None:
            entry.update(backlog_threshold=1, max_usd_per_1k_rows=ceiling)

        return self.consumers_copy("demo-consumers-gated", gate)

    def stale(self, ceiling: float, seconds: int) -> Settings:
        """``gated``, and rows may wait at most ``seconds``: the launcher launches a run that does not pay."""

        def gate(entry: dict[str, Any], _task: dict[str, Any]) -> None:
            entry.update(backlog_threshold=1, max_usd_per_1k_rows=ceiling, max_staleness_seconds=seconds)

        return self.consumers_copy("demo-consumers-stale", gate)

    def consumers_copy(self, folder_name: str, change: Callable[[dict[str, Any], dict[str, Any]], None]) -> Settings:
        """Settings with a copy of the consumers file (and its tasks) under the home, each entry and task changed."""
        import yaml

        from icebatch.core.consumers import DEFAULT_CONSUMERS_FILE

        source = self.settings.launch.consumers_file or DEFAULT_CONSUMERS_FILE
        folder = self.settings.home / folder_name
        folder.mkdir(parents=True, exist_ok=True)
        spec = yaml.safe_load(source.read_text())
        for entry in spec["consumers"]:
            task = json.loads((source.parent / entry["task"]).read_text())
            change(entry, task)
            (folder / Path(entry["task"]).name).write_text(json.dumps(task))
            entry["task"] = Path(entry["task"]).name
        (folder / "consumers.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        return self.settings.with_overrides(consumers_file=folder / "consumers.yaml")


def went_as_expected(
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    backfill_estimate: dict[str, Any],
    third: list[dict[str, Any]],
    fourth: list[dict[str, Any]],
    fifth: list[dict[str, Any]],
    *,
    bumped: str,
    table_rows: int,
) -> bool:
    """The story's checks: every consumer launched and completed, then nothing new, then a backfill of the whole
    table (every row it holds, this demo's and earlier demos' in the same home) estimated and refused, then a small
    commit held by the cost gate for every consumer, then the same rows launched anyway once past their staleness."""
    return (
        bool(first)
        and all(d["decision"] == "launch" for d in first)
        and all("completed" in (d.get("submission") or "") for d in first)
        and all(d["decision"] == "skip" and d["backlog_rows"] == 0 for d in second)
        and backfill_estimate["rows"] == table_rows
        and next(d for d in third if d["consumer"] == bumped)["over_budget"]
        and bool(fourth)
        and all(d["decision"] == "wait" and (d["rows_to_pay"] or math.inf) > d["backlog_rows"] for d in fourth)
        and bool(fifth)
        and all(d["decision"] == "launch" and "completed" in (d.get("submission") or "") for d in fifth)
    )


def run_demo(settings: Settings, *, tickets: int = 300, batches: int = 5, out: Callable[[str], None] = print) -> int:
    started = time.monotonic()
    demo = Demo(settings, out)
    names = ", ".join(c.name for c in demo.consumers)
    demo.step(1, "the model")
    demo.model()
    demo.step(2, f"{tickets} new support tickets in {batches} commits to {settings.catalog.source_table}")
    demo.tickets(tickets, batches)
    demo.step(3, f"the backlog of each consumer ({names}) and its estimate, from Iceberg metadata only")
    demo.estimates(demo.consumers)
    demo.step(
        4,
        f"one launcher invocation with {SCHEDULE_EVENT.name}: consumers of one model share a job, run here with one "
        "engine (progress on stderr, logs under jobs/); each run's completion event reaches the reporter",
    )
    first = demo.launch()
    demo.step(5, "the launcher again")
    second = demo.launch()
    bumped = demo.consumers[0].name
    demo.step(6, f"{bumped}'s task gets a new version: a backfill of the whole table, within a budget of $0.01")
    backfill = demo.new_version(bumped, budget=0.01)
    estimate = demo.estimates(read_consumers_file(backfill.launch.consumers_file or Path(), backfill)[:1], backfill)
    third = demo.launch(backfill)
    table_rows = demo.table_rows()  # what the backfill must label: every row before step 7's
    demo.step(
        7,
        f"{COMMIT_EVENT.name}: one commit of 40 tickets, for consumers that launch on any commit whose run "
        "costs at most $0.02 per 1k rows (a run this small pays mostly for its start-up)",
    )
    demo.tickets(40, 1)
    fourth = demo.launch(demo.gated(0.02), event=_commit_event(settings.catalog.source_table))
    demo.step(
        8,
        "the same rows, for consumers whose rows may wait at most 1 s (to see it happen): past it, the launcher "
        "launches the run that does not pay, in one job for both, and says so",
    )
    fifth = demo.launch(demo.stale(0.02, seconds=1), event=_commit_event(settings.catalog.source_table))
    ok = went_as_expected(first, second, estimate[0], third, fourth, fifth, bumped=bumped, table_rows=table_rows)
    minutes = (time.monotonic() - started) / 60
    if not ok:
        out(
            f"\nThe demo did not go as expected after {minutes:.1f} min: see the decisions above and the log on stderr."
        )
        return 1
    out(f"\nDone in {minutes:.1f} min. Results: one table per consumer ({settings.catalog_props()['uri']})")
    out(f"Reports: {settings.reports_dir}")
    out("Every run and its cost: `icebatch runs`; spend per day: `icebatch costs`; the verdicts: `icebatch results`")
    return 0
