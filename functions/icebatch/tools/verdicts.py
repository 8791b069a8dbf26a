"""A consumer's current verdicts beside the source rows they judge: what ``icebatch results`` shows.

The results table holds one current verdict per source id and task version (superseded and removed ones are
deleted in the run that replaces them). Each verdict is shown with the columns its task's prompt read, taken
from the source table as it is now (followed by field id: a renamed column is shown under the task's name).

``where`` is a filter in pyiceberg's syntax (``quality = 'negative' and stars <= 2``, ``summary like 'late%'``)
over the verdict columns and those prompt columns. Rows are shown by source id, the first ``limit``. Over the
results table's columns only, the filter is pushed down to the results scan, which reads the verdicts' ids
first and then the shown ones whole, and only the shown rows' source rows are read (by id); once it names a
prompt column, the source's id and prompt columns are read whole and joined first: work in proportion to the
table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icebatch.core.errors import ConfigError
from icebatch.core.ledger.results_table import SOURCE_ID_COLUMN, id_texts, source_id_type

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from icebatch.core.consumers import Consumer
    from icebatch.core.ledger.columns import SourceColumns

_FIRST_INPUT_FIELD_ID = 1_000_000  # the prompt columns' ids in the joined schema: past any results column's


@dataclass(frozen=True)
class Shown:
    columns: tuple[str, ...]  # source_id, status, the verdict columns, the prompt columns, error, (raw_output), run_id
    rows: list[dict[str, Any]]  # sorted by source_id
    joined_whole: bool  # the filter named a prompt column: the source was read whole


def current_verdicts(
    results: Table,
    source: Table,
    consumer: Consumer,
    reads: SourceColumns,
    *,
    status: str | None = None,
    where: str | None = None,
    limit: int = 20,
) -> Shown:
    """Up to ``limit`` current verdicts of the consumer's task version, with their prompt columns."""
    from pyiceberg.expressions import AlwaysFalse, And, EqualTo, In

    inputs = _input_names(consumer, results.schema())
    verdicts = ("source_id", "status", *consumer.task.output_schema["properties"])
    failed = ("raw_output",) if status in ("invalid_output", "inference_error") else ()  # what the model said
    columns = (*verdicts, *inputs.values(), "error", *failed, "run_id")
    base: BooleanExpression = EqualTo(term="task_version", value=consumer.task_version)
    if status:
        base = And(base, EqualTo(term="status", value=status))
    wanted = (*verdicts, "error", *failed, "run_id")
    id_name = consumer.task.id_column
    filter_ = _parse(where, results.schema(), inputs, reads, source.schema(), _id_names(consumer, reads, results))
    if filter_ is None or filter_.results_only:
        row_filter = base if filter_ is None else And(base, filter_.expression)
        first = _sorted(results.scan(row_filter=row_filter, selected_fields=("source_id",)).to_arrow()).slice(0, limit)
        ids = first.column("source_id").to_pylist()
        shown = In(term="source_id", literals=ids) if ids else AlwaysFalse()
        found = results.scan(row_filter=And(row_filter, shown), selected_fields=wanted).to_arrow()
        joined = _join(found, _source_rows(source, reads, id_name, inputs, found.column("source_id")), inputs)
        return Shown(columns, _sorted(joined.select(list(columns))).to_pylist(), False)
    named = tuple(dict.fromkeys((*wanted, *(n for n in filter_.names if n not in inputs.values()))))
    found = results.scan(row_filter=base, selected_fields=named).to_arrow()
    joined = _join(found, _source_rows(source, reads, id_name, inputs, None), inputs)
    kept = joined.filter(filter_.arrow())
    return Shown(columns, _sorted(kept.select(list(columns))).slice(0, limit).to_pylist(), True)


def _id_names(consumer: Consumer, reads: SourceColumns, results: Table) -> set[str]:
    """The names a ``--where`` may call ``source_id`` by: the task's id column, and the source's name for it (now, and
    as the results table recorded it), unless the results table has a column of that name."""
    by_task = {r.task_name: r.source_name for r in reads.columns}
    id_column = consumer.task.id_column
    names = {id_column, by_task.get(id_column, ""), results.properties.get(SOURCE_ID_COLUMN)}
    taken = {f.name for f in results.schema().fields}
    return {n for n in names if n and n not in taken}


def _input_names(consumer: Consumer, results_schema: Schema) -> dict[str, str]:
    """The task's prompt columns (not its id) -> their names in the output: the task's, or ``input_<name>``
    where the results table has a column of that name."""
    taken = {f.name for f in results_schema.fields}
    task = consumer.task
    return {c: (f"input_{c}" if c in taken else c) for c in task.input_columns if c != task.id_column}


@dataclass(frozen=True)
class _Filter:
    expression: BooleanExpression  # unbound, over the output's names
    results_only: bool  # names no prompt column: can be pushed down to the results scan
    joined: Schema  # the results columns and the prompt columns, as the output names them
    names: tuple[str, ...] = ()  # the columns it names

    def arrow(self) -> Any:
        from pyiceberg.expressions.visitors import bind
        from pyiceberg.io.pyarrow import expression_to_pyarrow

        return expression_to_pyarrow(bind(self.joined, self.expression, case_sensitive=True))


def _parse(
    where: str | None,
    results_schema: Schema,
    inputs: dict[str, str],
    reads: SourceColumns,
    source_schema: Schema,
    id_names: set[str],
) -> _Filter | None:
    if where is None:
        return None
    from pyiceberg.expressions.parser import parse
    from pyiceberg.expressions.visitors import bind, extract_field_ids
    from pyiceberg.schema import Schema
    from pyiceberg.types import StringType

    as_text = isinstance(source_id_type(results_schema), StringType)  # a results table made before ids kept their type
    try:
        expression = _renamed(parse(where), id_names, as_text)
    except Exception as e:  # pyparsing's ParseException, pyiceberg's ValueError for a bad literal
        raise ConfigError(
            f"--where {where[:80]!r} does not parse: {str(e)[:200]} (e.g. \"status = 'ok' and "
            'stars <= 2"; strings in single quotes)'
        ) from e
    by_task = {r.task_name: r for r in reads.columns}
    extra = [
        source_schema.find_field(by_task[c].field_id).model_copy(
            update={"field_id": _FIRST_INPUT_FIELD_ID + i, "name": name, "required": False}
        )
        for i, (c, name) in enumerate(inputs.items())
    ]
    joined = Schema(*results_schema.fields, *extra)
    try:
        bind(results_schema, expression, case_sensitive=True)
        return _Filter(expression, True, joined)
    except (ValueError, TypeError):  # a column it lacks, or a literal its column cannot take: the joined one says
        pass
    try:
        bound = bind(joined, expression, case_sensitive=True)
    except (ValueError, TypeError) as e:  # TypeError: a literal of another type (`status = 1`)
        names = ", ".join(f.name for f in joined.fields)
        raise ConfigError(f"--where {where[:80]!r}: {str(e)[:160]}; the columns: {names[:600]}") from e
    named = tuple(joined.find_column_name(i) or "" for i in sorted(extract_field_ids(bound)))
    return _Filter(expression, False, joined, named)


def _renamed(expression: BooleanExpression, names: set[str], as_text: bool) -> BooleanExpression:
    """``expression`` with every reference to one of ``names`` made a reference to ``source_id`` (``as_text``: with its
    values as text, for a results table made before ids kept their type)."""
    from pyiceberg.expressions import And, LiteralPredicate, Not, Or, Reference, SetPredicate, UnaryPredicate
    from pyiceberg.expressions.literals import literal

    def value(v: Any) -> Any:
        return literal(str(v.value)) if as_text else v

    e: Any = expression
    if isinstance(e, And | Or):
        return type(e)(_renamed(e.left, names, as_text), _renamed(e.right, names, as_text))
    if isinstance(e, Not):
        return Not(_renamed(e.child, names, as_text))
    if not isinstance(getattr(e, "term", None), Reference) or e.term.name not in names | {"source_id"}:
        return expression
    if isinstance(e, LiteralPredicate):
        return type(e)(Reference("source_id"), value(e.literal))
    if isinstance(e, SetPredicate):
        return type(e)(Reference("source_id"), {value(v) for v in e.literals})
    if isinstance(e, UnaryPredicate):
        return type(e)(Reference("source_id"))
    return expression


def _source_rows(
    source: Table, reads: SourceColumns, id_name: str, inputs: dict[str, str], ids: pa.ChunkedArray | None
) -> pa.Table:
    """The source's id (as text, ``__id``) and prompt columns (output names) of ``ids``, or of every live row."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.expressions import AlwaysTrue, In
    from pyiceberg.types import IntegerType, LongType, StringType

    by_task = {r.task_name: r for r in reads.columns}
    id_read = by_task[id_name]
    id_type = source.schema().find_field(id_read.field_id).field_type
    row_filter: Any = AlwaysTrue()
    if ids is not None:
        texts = [t for t in pc.unique(id_texts(ids)).to_pylist() if t is not None]
        if not texts:
            return pa.table({"__id": pa.array([], pa.string()), **{n: pa.array([]) for n in inputs.values()}})
        if isinstance(id_type, StringType):
            row_filter = In(term=id_read.source_name, literals=texts)
        elif isinstance(id_type, IntegerType | LongType):
            row_filter = In(term=id_read.source_name, literals=[int(t) for t in texts if t.lstrip("-").isdigit()])
    names = (id_read.source_name, *(by_task[c].source_name for c in inputs))
    read = source.scan(row_filter=row_filter, selected_fields=names).to_arrow()  # in the schema's order
    columns = {"__id": pc.cast(read.column(id_read.source_name), pa.string())}
    columns |= {name: read.column(by_task[c].source_name) for c, name in inputs.items()}
    return pa.table(columns)


def _join(verdicts: pa.Table, rows: pa.Table, inputs: dict[str, str]) -> pa.Table:
    """Each verdict with its source row's prompt columns (nulls where the row is gone: a run removes it next)."""
    import pyarrow.compute as pc

    at = pc.index_in(id_texts(verdicts.column("source_id")), value_set=rows.column("__id"))
    out = verdicts
    for name in inputs.values():
        out = out.append_column(name, rows.column(name).take(at))
    return out


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([("source_id", "ascending")])
