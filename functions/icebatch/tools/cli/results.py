"""`icebatch results`: the verdicts themselves, and how to query them elsewhere (DuckDB, Athena, Spark)."""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from typing import Any

from icebatch.core.errors import TableNotFoundError
from icebatch.core.ledger.results_table import STATUSES
from icebatch.core.settings import Settings
from icebatch.tools.cli.common import bounded_int, consumer_option, one, print_json, text

TEXT_WIDTH = 60  # a cell's characters at most, in the table (--json has them whole)


def cmd_results(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.core.catalog import open_catalog
    from icebatch.core.ledger import ResultsLedger
    from icebatch.tools.verdicts import current_verdicts

    consumer = one(settings, args.consumer)
    ledger = ResultsLedger(open_catalog(settings), consumer)
    table = ledger.results()
    if table is None:
        raise TableNotFoundError(f"{consumer.results_table} does not exist yet: the consumer's first run creates it")
    source = ledger.source()
    reads = ledger.columns(source, ledger.watermark())
    shown = current_verdicts(table, source, consumer, reads, status=args.status, where=args.where, limit=args.limit)
    form = "json" if args.json else args.format
    if form == "json":
        print_json(
            {
                "consumer": consumer.name,
                "results_table": consumer.results_table,
                "task_version": consumer.task_version,
                "columns": list(shown.columns),
                "rows": shown.rows,
            }
        )
    elif form == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=shown.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: _csv_value(v) for k, v in row.items()} for row in shown.rows)
    elif shown.rows:
        print(_table(shown.rows, list(shown.columns)))
        print(_elsewhere(consumer.results_table, table.metadata_location, consumer.task_version))
    else:
        print(
            f"no {args.status + ' ' if args.status else ''}verdicts of task version {consumer.task_version}"
            f"{' where ' + args.where if args.where else ''}"
        )
    return 0


def _csv_value(value: Any) -> Any:
    """A cell as CSV holds it: booleans as true/false, nested values as JSON, the rest as they print."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value, default=str, ensure_ascii=False)
    return value


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
        f"\n(the first rows by source id; all of them elsewhere, e.g.\n"
        f"  DuckDB: SELECT * FROM iceberg_scan('{metadata}') WHERE task_version = {version};\n"
        f"  Athena or Spark on Glue: SELECT * FROM {table} WHERE task_version = {version};)"
    )


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "results",
        help="look at a consumer's verdicts (its results table, current task version)",
        description="Print a consumer's current verdicts (its task version's), by source id: the source row's id, "
        "the status (ok, invalid_output, inference_error, empty_input), the verdict columns, the columns the "
        "task's prompt read (from the source table as it is now), the error and the run. --format json or csv "
        "prints them whole. The results table is an ordinary Iceberg table: the table form ends with how to "
        "query it from DuckDB, Athena or Spark.",
        epilog="""examples:
  icebatch results --consumer triage                         # the first 20, as a table
  icebatch results --status invalid_output --limit 100       # what the model answered that did not parse
  icebatch results --where "urgency = 'high' and channel = 'email'" --format csv > high.csv
--where takes pyiceberg's filter syntax (=, !=, <, <=, in (...), like 'a%', is null, and, or, not; strings
in single quotes) over the verdict columns, the prompt columns and the id (source_id, or the source's name for
it: "ticket_id < 'T-5'"; it keeps the source's type where that is a string or an integer). Over verdict
columns and the id only, it is pushed down to the results table and only the shown rows' source rows are
read; naming a prompt column reads the source's id and prompt columns whole.""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    consumer_option(p, "the consumer (needed when several are declared)")
    p.add_argument("--status", choices=STATUSES, help="only rows with this status")
    p.add_argument("--where", type=text(2000), metavar="FILTER", help="only rows this filter keeps (below)")
    p.add_argument("--limit", type=bounded_int(1, 100_000), default=20, help="rows at most (default 20)")
    form = p.add_mutually_exclusive_group()
    form.add_argument(
        "--format",
        choices=("table", "json", "csv"),
        default="table",
        help="table (cells cut to fit), json (one document: the consumer, its table, the columns, the "
        "rows) or csv (a header line, then one line a row)",
    )
    form.add_argument("--json", action="store_true", help="the same as --format json")
    p.set_defaults(handler=cmd_results)
