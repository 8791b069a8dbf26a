"""`icebatch validate`: every consumer checked against what it will meet, before anything is spent.

What `dbt debug` is to dbt. For each consumer, in order (a check that cannot be made stops that consumer's):
the catalog, the source table, its identity (the table the ledger follows), the task's columns in the source's
current schema (by field id: ``icebatch.core.ledger.columns``), the results table's columns against the task's,
the model (where it is said to be, and a context as long as ``ICEBATCH_MAX_MODEL_LEN``), and on kuberay its
weights against the GPU worker's memory. Each problem is one line naming the consumer and what to fix; the
launcher makes the same source, identity, column and GPU-memory checks before it submits anything
(``invalid_task``, ``source_replaced``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icebatch.core.errors import IcebatchError
from icebatch.core.untrusted import one_line

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icebatch.core.consumers import Consumer
    from icebatch.core.ledger import ResultsLedger
    from icebatch.core.settings import Settings


@dataclass
class Verdict:
    consumer: str
    checked: list[str] = field(default_factory=list)  # what passed, in order
    problems: list[tuple[str, str]] = field(default_factory=list)  # (check, what to fix)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "consumer": self.consumer,
            "ok": self.ok,
            "checked": self.checked,
            "problems": [{"check": c, "message": m} for c, m in self.problems],
        }


class _Stop(Exception):
    """A check failed that the next ones need."""


def validate(settings: Settings, consumers: list[Consumer]) -> list[Verdict]:
    return [_validate(settings, c) for c in consumers]


def _validate(settings: Settings, consumer: Consumer) -> Verdict:
    from icebatch.core.ledger import ResultsLedger

    verdict = Verdict(consumer.name)

    def check(name: str, step: Callable[[], str]) -> str:
        try:
            said = step()
        except IcebatchError as e:
            verdict.problems.append((name, one_line(str(e), 1000)))
            raise _Stop from e
        verdict.checked.append(f"{name}: {said}")
        return said

    try:
        from icebatch.core.catalog import open_catalog

        catalog: Any = None

        def opened() -> str:
            nonlocal catalog
            catalog = open_catalog(settings, control_plane=True)
            return settings.catalog.catalog_type

        check("catalog", opened)
        ledger = ResultsLedger(catalog, consumer)
        check("source", lambda: _source(ledger))
        source = ledger.source()
        check("ledger", lambda: _ledger(ledger))
        progress = ledger.progress()
        check("identity", lambda: _identity(ledger, source, progress.watermark))
        check("columns", lambda: _columns(ledger, source, progress.watermark))
        check("results", lambda: _results(ledger, consumer))
        check("model", lambda: _model(settings, consumer))
        if settings.top.backend == "kuberay":
            check("gpu memory", lambda: _fits(settings, consumer))
    except _Stop:
        pass
    return verdict


def _source(ledger: ResultsLedger) -> str:
    ledger.source()
    return ledger.source_table


def _ledger(ledger: ResultsLedger) -> str:
    watermark = ledger.progress().watermark
    return "nothing processed yet" if watermark.source_snapshot_id is None else f"at {watermark.source_snapshot_id}"


def _identity(ledger: ResultsLedger, source: Table, watermark: Any) -> str:
    from icebatch.core.ledger.backlog import same_table

    same_table(
        watermark.source_uuid,
        watermark.source_uuid_at,
        source.metadata,
        source_table=ledger.source_table,
        consumer=ledger.consumer.name,
    )
    return f"table {source.metadata.table_uuid} (format v{source.metadata.format_version})"


def _columns(ledger: ResultsLedger, source: Table, watermark: Any) -> str:
    read = ledger.columns(source, watermark)
    renamed = read.renamed
    moved = f"; renamed in the source: {', '.join(f'{t} is now {s}' for s, t in renamed.items())}" if renamed else ""
    return f"{len(read.columns)} columns by field id{moved}"


def _results(ledger: ResultsLedger, consumer: Consumer) -> str:
    """The results table's columns can take the task's answers (a column of another type cannot)."""
    from icebatch.core.errors import InvalidTaskError
    from icebatch.core.ledger.results_table import results_schema

    table = ledger.results()
    if table is None:
        return f"{consumer.results_table} (created by the first run)"
    have = {f.name: f.field_type for f in table.schema().fields}
    clashes = [
        f"{f.name} is {have[f.name]}, the task answers {f.field_type}"
        for f in results_schema(consumer.task).fields
        if f.name in have and have[f.name] != f.field_type
    ]
    if clashes:
        raise InvalidTaskError(
            f"results table {consumer.results_table!r} has columns the task's answers do not fit: "
            f"{'; '.join(clashes)}. Fix: give the consumer another results table, or the task another output "
            "property name"
        )
    return f"{consumer.results_table}"


def _model(settings: Settings, consumer: Consumer) -> str:
    """Where the model is said to be, and a context as long as ICEBATCH_MAX_MODEL_LEN."""
    from icebatch_job.stages.model import check_model, model_fix

    from icebatch.core.errors import InvalidTaskError

    source = consumer.model_source(settings)
    if not source:
        return "the tiny local model (built on first use)"
    check_model(settings, source, fix=model_fix(settings, consumer))
    config = _local_config(source)
    if config is None:
        return f"{source} (its context is checked by the engine at start)"
    longest = config.get("max_position_embeddings")
    wanted = settings.engine.max_model_len
    if isinstance(longest, int) and longest < wanted:
        raise InvalidTaskError(
            f"model {source} holds at most {longest} tokens (max_position_embeddings) but ICEBATCH_MAX_MODEL_LEN is "
            f"{wanted} (prompt + max_tokens {consumer.task.max_tokens}): lower ICEBATCH_MAX_MODEL_LEN to {longest} or "
            "less, or choose a model with a longer context"
        )
    return f"{source} (context {longest if isinstance(longest, int) else '?'} >= {wanted})"


def _fits(settings: Settings, consumer: Consumer) -> str:
    """The model's weights against the GPU worker's memory, as the launcher checks them (``invalid_task``)."""
    from icebatch.control.model_files import model_problem
    from icebatch.core.errors import InvalidTaskError

    if problem := model_problem(consumer, settings):
        raise InvalidTaskError(problem)
    return "the weights fit the GPU worker (or the model is sized by the engine at start)"


def _local_config(source: str) -> dict[str, Any] | None:
    path = Path(source) / "config.json"
    if source.startswith(("s3://", "gs://", "hf://")) or not path.is_file():
        return None
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None
