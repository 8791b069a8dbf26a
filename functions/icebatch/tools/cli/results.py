"""`icebatch results`: the verdicts themselves, and how to query them elsewhere (DuckDB, Athena, Spark)."""

from __future__ import annotations

import argparse
import shutil
from typing import Any

from icebatch.core.errors import TableNotFoundError
from icebatch.core.settings import Settings
from icebatch.tools.cli.common import bounded_int, consumer_option, one, print_json

STATUSES = ("ok", "invalid_output", "inference_error", "empty_input")  # icebatch_job.commit.results.STATUSES
TEXT_WIDTH = 60  # a cell's characters at most, in the table (--json has them whole)


def cmd_results(args: argparse.Namespace, settings: Settings) -> int:
    from pyiceberg.expressions import And, EqualTo

    from icebatch.core.catalog import open_catalog
    from icebatch.core.ledger import ResultsLedger

    consumer = one(settings, args.consumer)
    ledger = ResultsLedger(open_catalog(settings), consumer)
    table = ledger.results()
    if table is None:
        raise TableNotFoundError(f"{consumer.results_table} does not exist yet: the consumer's first run creates it")
    where: Any = EqualTo(term="task_version", value=consumer.task_version)
    if args.status:
        where = And(where, EqualTo(term="status", value=args.status))
    columns = ["source_id", "status", *consumer.task.output_schema["properties"], "error", "run_id"]
    rows = table.scan(row_filter=where, selected_fields=tuple(columns), limit=args.limit).to_arrow().to_pylist()
    if args.json:
        print_json({"consumer": consumer.name, "results_table": consumer.results_table,
                    "task_version": consumer.task_version, "rows": rows})  # fmt: skip
        return 0
    print(_table(rows, columns) if rows else f"no {args.status or ''} verdicts of task version {consumer.task_version}")
    print(_elsewhere(consumer.results_table, table.metadata_location, consumer.task_version))
    return 0


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Rows as aligned columns, each cell on one line and cut to fit (the terminal's width at most)."""
    shown = [c for c in columns if any(r.get(c) is not None for r in rows)]
    cells = [[_cell(r.get(c)) for c in shown] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(shown)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(shown, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    width = shutil.get_terminal_size((200, 24)).columns
    return "\n".join(line[:width].rstrip() for line in lines)


def _cell(value: Any) -> str:
    text = "" if value is None else " ".join(str(value).split())
    return text if len(text) <= TEXT_WIDTH else text[: TEXT_WIDTH - 1] + "…"


def _elsewhere(table: str, metadata: str, version: int) -> str:
    return (
        f"\n(some rows, in no particular order; all of them elsewhere, e.g.\n"
        f"  DuckDB: SELECT * FROM iceberg_scan('{metadata}') WHERE task_version = {version};\n"
        f"  Athena or Spark on Glue: SELECT * FROM {table} WHERE task_version = {version};)"
    )


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "results",
        help="look at a consumer's verdicts (its results table, current task version)",
        description="Print some of a consumer's result rows for its current task version: the source row's id, "
        "the status (ok, invalid_output, inference_error, empty_input), the verdict columns, the error and the "
        "run. --json prints them whole as one JSON document. The results table is an ordinary Iceberg table: "
        "the output ends with how to query it from DuckDB, Athena or Spark.",
    )
    consumer_option(p, "the consumer (needed when several are declared)")
    p.add_argument("--status", choices=STATUSES, help="only rows with this status")
    p.add_argument("--limit", type=bounded_int(1, 100_000), default=20, help="rows at most (default 20)")
    p.add_argument("--json", action="store_true", help="one JSON document: the consumer, its table, the rows")
    p.set_defaults(handler=cmd_results)
