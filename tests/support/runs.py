"""Driving the ledger the way the job does, with a deterministic rule-based labeller instead of an LLM.

The labeller is a real producer of result rows (the ledger protocol does not care who labels); the LLM
pipeline has its own tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from icebatch.core.ledger import CommitResult, ResultsLedger, RunPlan
from icebatch.core.task import TaskSpec
from icebatch_job.results import RunStats, result_row, results_arrow_schema
from icebatch_job.runner import commit_results, write_results
from icebatch_job.source import exact_row_count, iter_batches

from tests.support.consumers import triage

TASK = triage().task


def label(ticket: dict) -> dict:
    text = f"{ticket.get('subject') or ''} {ticket.get('body') or ''}".lower()
    category = next(
        (
            c
            for k, c in [
                ("refund", "billing"),
                ("charge", "billing"),
                ("log in", "account_access"),
                ("slow", "performance"),
                ("missing", "data_loss"),
                ("cancel", "cancellation"),
            ]
            if k in text
        ),
        "other",
    )
    return {
        "sentiment": "negative" if "!" in text or "urgent" in text else "neutral",
        "urgency": "high" if category in ("data_loss", "account_access") else "medium",
        "category": category,
        "summary": (ticket.get("subject") or "(no subject)")[:120],
    }


def labelled(plan: RunPlan, batches: Iterable[pa.RecordBatch], task: TaskSpec = TASK) -> Iterator[pa.RecordBatch]:
    schema = results_arrow_schema(task)
    now = datetime.now(UTC)
    for batch in batches:
        rows = [
            result_row(
                source_id=t["ticket_id"],
                run_id=plan.run_id,
                task=task,
                processed_at=now,
                model="rules",
                raw_output=json.dumps(label(t)),
                num_input_tokens=len(t.get("body") or "") // 4,
                num_generated_tokens=24,
                llm_seconds=0.0,
            )
            for t in batch.to_pylist()
        ]
        yield pa.RecordBatch.from_pylist(rows, schema=schema)


@dataclass(frozen=True)
class ExecutedRun:
    plan: RunPlan
    stats: RunStats
    commit: CommitResult


def run_once(
    ledger: ResultsLedger,
    *,
    plan: RunPlan | None = None,
    transform: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]] | None = None,
) -> ExecutedRun | None:
    """What the job does with a plan, with the rule-based labeller: write the rows, commit them."""
    plan = plan or ledger.plan()
    if plan is None:
        return None
    source = ledger.source()
    batches = iter_batches(source, plan)
    if transform is not None:
        batches = transform(batches)
    task = ledger.consumer.task
    stats = RunStats(task.label_fields)
    files = write_results(ledger, task, labelled(plan, batches, task), stats)
    commit = commit_results(
        ledger, plan, files, stats, stats.totals(model="rules"), exact_rows=exact_row_count(source, plan)
    )
    return ExecutedRun(plan, stats, commit)


def ledger_ids(ledger: ResultsLedger) -> list[str]:
    table = ledger.results()
    return [] if table is None else table.scan(selected_fields=("source_id",)).to_arrow()["source_id"].to_pylist()


def source_ids(ledger: ResultsLedger) -> list[str]:
    return ledger.source().scan(selected_fields=("ticket_id",)).to_arrow()["ticket_id"].to_pylist()
