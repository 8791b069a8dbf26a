"""The ``icebatch`` command line.

Every command reads the same settings (``ICEBATCH_*`` environment variables, see ``icebatch config``)
and the same consumers file, and calls the same code the Lambdas and the job run. Errors are one line on
stderr with the fix; exit statuses are in ``icebatch.core.errors`` (0 done, 1 the job failed, 2 bad input
or configuration, 3 a dependency is unavailable, 5 the job's range was already covered). With ``--json`` a
failure is also one JSON document on stdout (``icebatch.core.terminal.command_line``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from icebatch import __version__
from icebatch.core.settings import Settings
from icebatch.core.terminal.command_line import StrictParser, run_cli
from icebatch.tools.cli import checks, data, init, jobs, launch, meta, results, runs
from icebatch.tools.cli.common import Handler

EPILOG = """\
Your own table: `icebatch init NAMESPACE.TABLE` in a new folder writes a consumer and a task to edit.

Typical session on a laptop (no AWS, no GPU):
  icebatch generate --tickets 300 --batches 5 --seed 7   # a backlog of support tickets
  icebatch validate                                       # every consumer can run: table, columns, model
  icebatch backlog                                        # what waits, per consumer, from metadata only
  icebatch estimate                                       # what draining it would cost
  icebatch launch --trigger schedule                      # the launcher decides and runs the jobs
  icebatch report                                         # the cost report of the latest run
  icebatch runs                                           # every run, however it ended, with its cost

Configuration comes from ICEBATCH_* environment variables (`icebatch config` lists them all) and the
consumers file: ICEBATCH_CONSUMERS_FILE, else the project's consumers.yaml (`icebatch init` writes it beside the
project's .icebatch/), else the example's (consumers/consumers.yaml in the installed icebatch package).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = StrictParser(
        prog="icebatch",
        description="Incremental, event-driven LLM labelling of an Iceberg table: generate data, inspect the "
        "backlog, estimate, launch and run jobs, read cost reports.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level to stderr")
    parser.add_argument("--version", action="version", version=f"icebatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in (init, checks, data, results, runs, launch, jobs, meta):
        group.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli("icebatch", build_parser(), argv, _run, status_of=_job_status)


def _run(args: argparse.Namespace) -> int:
    from icebatch.tools.cli.home import with_home

    settings = with_home(Settings.from_env(), args.command)
    with _home_for_the_command(settings):
        return _run_with(args, settings)


@contextmanager
def _home_for_the_command(settings: Settings) -> Iterator[None]:
    """The home and the consumers file found (``with_home``) in the environment while the command runs: the
    handlers it invokes and the processes it starts read their settings from there."""
    found = {"ICEBATCH_HOME": str(settings.home)}
    if settings.launch.consumers_file is not None:
        found["ICEBATCH_CONSUMERS_FILE"] = str(settings.launch.consumers_file)
    before = {name: os.environ.get(name) for name in found}
    os.environ.update(found)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run_with(args: argparse.Namespace, settings: Settings) -> int:
    level = logging.DEBUG if args.verbose else getattr(logging, settings.top.log_level.upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    _quiet_libraries(args.verbose)
    from icebatch.core.terminal.command_line import quiet_handler_records

    handler: Handler = args.handler
    with quiet_handler_records(logging.getLevelName(level)):
        return handler(args, settings)


def _job_status(error: BaseException) -> int | None:
    from icebatch_job.cli import stalled_status  # `icebatch job run` ends as `python -m icebatch_job run` does

    return stalled_status(error)


def _quiet_libraries(verbose: bool) -> None:
    if verbose:
        return
    for name in ("botocore", "urllib3", "pyiceberg", "kubernetes", "filelock", "fsspec"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")


if __name__ == "__main__":
    sys.exit(main())
