"""Driving the ledger the way the job does, with a deterministic rule-based labeller instead of an LLM.

The labeller is a real producer of result rows (the ledger protocol does not care who labels); the LLM
pipeline has its own tests.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from icebatch.core.ledger import CommitResult, ResultsLedger, RunPlan
from icebatch.core.ledger.results_table import results_arrow_schema
from icebatch.core.task import TaskSpec
from icebatch_job.columns import SOURCE_FILE, SOURCE_HASH, SOURCE_POS
from icebatch_job.commit.chunks import Attempt, ChunkCommitter, ChunkPolicy, run_totals
from icebatch_job.commit.results import RunStats, result_row
from icebatch_job.plan.source import read_rows
from icebatch_job.plan.work import last_commit, plan_work, source_id_field
from pyiceberg.table import Table

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


def answer(task: TaskSpec, row: dict) -> dict:
    """The rule-based verdict: the example's triage rules for its task, or else a schema-valid answer of any task
    (an enum's first value, the first input column's text, zero, false)."""
    properties = task.output_schema["properties"]
    if set(properties) == set(TASK.output_schema["properties"]):
        return label(row)
    text = str(row.get(task.input_columns[0]) or "")[:120]
    simple = {"string": text, "integer": 0, "number": 0.0, "boolean": False}
    return {name: p["enum"][0] if "enum" in p else simple[p["type"]] for name, p in properties.items()}


def labelled(
    plan: RunPlan, batches: Iterable[pa.Table], task: TaskSpec = TASK, *, error: str | None = None
) -> Iterator[pa.Table]:
    """Result rows of the rows read, by the rule-based labeller (``error``: each row an engine error of that text,
    as Ray Data LLM's error column carries it, and no answer)."""
    schema = results_arrow_schema(task)
    now = datetime.now(UTC)
    for batch in batches:
        rows = [
            result_row(
                source_id=t[task.id_column],
                source_file=t[SOURCE_FILE],
                source_pos=t[SOURCE_POS],
                source_hash=t[SOURCE_HASH],
                run_id=plan.run_id,
                task=task,
                processed_at=now,
                model="rules",
                raw_output=None if error else json.dumps(answer(task, t)),
                inference_error=error,
                num_input_tokens=len(str(t.get(task.truncate_column or task.input_columns[-1]) or "")) // 4,
                num_generated_tokens=24,
                llm_seconds=0.0,
            )
            for t in batch.to_pylist()
        ]
        yield pa.Table.from_pylist(rows, schema=schema)


class Crash(BaseException):
    """Stands for the process dying at a chosen point."""


def dies_after(rows: int) -> Callable[[Iterator[pa.Table]], Iterator[pa.Table]]:
    """A transform of the source rows that kills the run once ``rows`` rows have gone through."""

    def transform(batches: Iterator[pa.Table]) -> Iterator[pa.Table]:
        seen = 0
        for b in batches:
            for one in b.to_batches(max_chunksize=1):
                if seen == rows:
                    raise Crash(f"killed after {rows} rows")
                seen += 1
                yield pa.Table.from_batches([one])

    return transform


class KilledAtCommit(ResultsLedger):
    """A ledger whose process dies at its ``nth`` chunk commit: the chunk's data files written and the commit not
    sent (``landed=False``), or the commit taken by the catalog and the job not yet told (``landed=True``)."""

    def __init__(self, ledger: ResultsLedger, nth: int, *, landed: bool) -> None:
        super().__init__(ledger.catalog, ledger.consumer)
        self.nth, self.landed, self.commits = nth, landed, 0

    def commit_chunk(self, *args: Any, **kwargs: Any) -> CommitResult:
        self.commits += 1
        if self.commits == self.nth and not self.landed:
            raise Crash(f"killed before commit {self.nth}, its data files written")
        result = super().commit_chunk(*args, **kwargs)
        if self.commits == self.nth:
            raise Crash(f"killed once commit {self.nth} landed")
        return result


@dataclass(frozen=True)
class ExecutedRun:
    plan: RunPlan
    stats: RunStats
    commit: CommitResult


def run_once(
    ledger: ResultsLedger,
    *,
    plan: RunPlan | None = None,
    transform: Callable[[Iterator[pa.Table]], Iterator[pa.Table]] | None = None,
    chunk_rows: int = 10**6,
    typed_ids: bool = True,
    seconds: float = 0.0,
) -> ExecutedRun | None:
    """What the job does with a plan, with the rule-based labeller: the rows not yet done, in chunks.
    ``typed_ids=False``: a results table the run creates holds ids as text, as one made before ids kept their type.
    ``seconds``: the attempt took this much longer (as a job with an engine does: its cost is then more than 0)."""
    source = ledger.source()
    plan = plan or ledger.plan(source=source)
    if plan is None:
        return None
    task = ledger.consumer.task
    plan, work = plan_work(ledger, plan, task, source)
    attempt = Attempt((plan.resume.attempts if plan.resume else 0) + 1, secrets.token_hex(4))
    committer = ChunkCommitter(
        ledger,
        plan,
        task,
        start=work.progress,
        range_rows=work.range_rows,
        policy=ChunkPolicy(chunk_rows),
        attempt=attempt,
        totals=lambda stats, redone: run_totals(
            plan, stats, redone, attempt_seconds=attempt.seconds + seconds, model="rules"
        ),
        finalize=last_commit(ledger, plan, task, source, work),
        source_id=source_id_field(source, plan, task.id_column) if typed_ids else None,
    )
    batches: Iterator[pa.Table] = iter(read_rows(work.planned, work.skip))
    if transform is not None:
        batches = transform(batches)
    for rows in labelled(plan, batches, task):
        committer.add(rows)
    commit = committer.finish()
    return ExecutedRun(plan, committer.stats, commit)


def ledger_ids(ledger: ResultsLedger) -> list[str]:
    table = ledger.results()
    return [] if table is None else table.scan(selected_fields=("source_id",)).to_arrow()["source_id"].to_pylist()


def source_ids(ledger: ResultsLedger) -> list[str]:
    return ledger.source().scan(selected_fields=("ticket_id",)).to_arrow()["ticket_id"].to_pylist()


def expire_all_but_current(table: Table) -> None:
    """Table maintenance: expire every snapshot but the current one."""
    current = table.metadata.current_snapshot_id
    table.maintenance.expire_snapshots().by_ids(
        [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != current]
    ).commit()
