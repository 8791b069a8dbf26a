"""Commands that look before anything is spent: validate."""

from __future__ import annotations

import argparse

from icebatch.core.settings import Settings
from icebatch.tools.cli.common import consumer_option, print_json, selected


def cmd_validate(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.core.errors import EXIT_PERMANENT
    from icebatch.tools.validate import validate

    verdicts = validate(settings, selected(settings, args.consumer))
    if args.json:
        print_json([v.to_dict() for v in verdicts])
    else:
        for v in verdicts:
            if v.ok:
                print(f"{v.consumer}: ok ({'; '.join(v.checked)})")
            for check, message in v.problems:
                print(f"{v.consumer}: {check}: {message}")
    return 0 if all(v.ok for v in verdicts) else EXIT_PERMANENT


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "validate",
        help="check every consumer against its table, results and model, before any job",
        description="For each consumer: the catalog, the source table and its identity (the table "
        "its ledger follows), the task's columns in the source's current schema (by field id: renames "
        "are followed, a missing or dropped column is a problem), the results table's columns, the "
        "model (where it is said to be, and a context as long as ICEBATCH_MAX_MODEL_LEN). One line per "
        "problem; exit status 2 when there is any. The launcher refuses a consumer that fails the "
        "source, identity or column checks (invalid_task, source_replaced).",
    )
    consumer_option(p)
    p.add_argument("--json", action="store_true", help="one JSON list, a consumer each")
    p.set_defaults(handler=cmd_validate)
