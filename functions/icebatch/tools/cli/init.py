"""``icebatch init``: a project for a table of the user's."""

from __future__ import annotations

import argparse
from pathlib import Path

from icebatch.core.settings import Settings
from icebatch.tools.cli.common import text

CONSUMER_HELP = "the consumer's name (lower case, digits and '-', at most 20; default: label)"


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "init",
        help="a project for a table of yours: a consumer and a task to edit",
        description="Read TABLE's schema from the configured catalog and write, in the current "
        "folder, consumers.yaml (one consumer of TABLE) and tasks/<consumer>.yaml (a prompt over the "
        "table's text columns and an example output schema), ready to edit; and the home, .icebatch/. "
        "Commands run in this folder or below it then use both (the home and consumers.yaml are "
        "found as git finds .git). Nothing is overwritten without --force. Next: edit the task, "
        "`icebatch validate`, `icebatch backlog`, `icebatch launch --dry-run`.",
    )
    p.add_argument("table", type=text(255), metavar="TABLE", help="the source table, NAMESPACE.NAME")
    p.add_argument("--consumer", type=text(20), default="label", metavar="NAME", help=CONSUMER_HELP)
    p.add_argument(
        "--id-column",
        type=text(255),
        metavar="COLUMN",
        help="the column that identifies a row "
        "(default: the table's identifier field, else a column called id or *_id)",
    )
    p.add_argument(
        "--input-columns",
        type=text(2000),
        metavar="A,B",
        help="the columns the prompt reads (default: the table's text columns, at most 4)",
    )
    p.add_argument("--force", action="store_true", help="overwrite consumers.yaml and the task file")
    p.set_defaults(handler=cmd_init)


def cmd_init(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.core.catalog import load_table, open_catalog
    from icebatch.core.consumers import CONSUMER_NAME, read_consumers_file
    from icebatch.core.errors import ConfigError
    from icebatch.core.settings import table_identifier
    from icebatch.tools.scaffold import scaffold

    try:
        table_name = table_identifier(args.table)
    except ValueError as e:
        raise ConfigError(f"TABLE: {e}") from e
    table = load_table(
        open_catalog(settings),
        table_name,
        what="table",
        fix="check its name and the catalog (ICEBATCH_CATALOG_TYPE, ICEBATCH_CATALOG_URI, `icebatch config`)",
    )
    if not CONSUMER_NAME.match(args.consumer):  # before it names a file: `../x` is no consumer
        raise ConfigError(f"--consumer {args.consumer[:40]!r}: {CONSUMER_HELP}")
    inputs = tuple(c.strip() for c in args.input_columns.split(",") if c.strip()) if args.input_columns else ()
    root = Path.cwd()
    made = scaffold(
        table.schema(), table_name, args.consumer, id_column=args.id_column, input_columns=inputs, root=root
    )
    consumers, task = root / "consumers.yaml", root / made.task_path
    existing = [p for p in (consumers, task) if p.exists()]
    if existing and not args.force:
        raise ConfigError(f"{existing[0]} exists: edit it, or run `icebatch init` again with --force to replace it")
    task.parent.mkdir(parents=True, exist_ok=True)
    task.write_text(made.task_yaml)
    consumers.write_text(made.consumers_yaml)
    read_consumers_file(consumers, settings)  # as every command will read them: a scaffold that loads
    Path(settings.home).mkdir(parents=True, exist_ok=True)
    print(
        f"wrote {consumers.name} (consumer {made.consumer} of {table_name}) and {made.task_path}: "
        f"id {made.id_column}, prompt over {', '.join(made.input_columns)}"
    )
    print(
        "next: edit the task's prompt and output schema, then `icebatch validate`, `icebatch backlog`, "
        f"`icebatch launch --dry-run --force` (the RayJob it would submit), `icebatch job run --consumer "
        f"{made.consumer}` (label the rows here), `icebatch results --consumer {made.consumer}`"
    )
    return 0
