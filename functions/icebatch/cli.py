"""The ``icebatch`` command line.

Every command reads the same settings (``ICEBATCH_*`` environment variables, see ``icebatch config``)
and calls the same code the Lambdas and the job run. Errors are one line on stderr with the fix; the
exit status is 0 on success, 2 for a permanent error (bad input or configuration), 3 for a transient
one (a dependency is unavailable: retry), 1 for anything unexpected.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from icebatch.errors import IcebatchError, PermanentError, TransientError
from icebatch.settings import Settings

EPILOG = """\
Typical session on a laptop (no AWS, no GPU):
  icebatch generate --tickets 300 --batches 5 --seed 7   # a backlog of support tickets
  icebatch backlog                                        # what waits, from metadata only
  icebatch launch --trigger schedule                      # the launcher decides and runs the job
  icebatch report                                         # the cost report of the latest run

Configuration comes from ICEBATCH_* environment variables: `icebatch config` lists them all.
"""

Handler = Callable[[argparse.Namespace, Settings], int]


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


# --------------------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------------------
def cmd_generate(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch_job.tickets import ensure_source_table, generate

    from icebatch.catalog import open_catalog

    table = ensure_source_table(open_catalog(settings), settings.source_table)

    def report(i: int, size: int, sid: int) -> None:
        print(f"batch {i}/{args.batches}: appended {size} tickets -> snapshot {sid}", flush=True)

    ids = generate(
        table,
        tickets=args.tickets,
        batches=args.batches,
        seed=args.seed,
        interval=args.interval,
        on_snapshot=report,
    )
    print(f"{settings.source_table}: {args.tickets} tickets in {len(ids)} snapshot(s)")
    return 0


def cmd_backlog(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.ledger import open_ledger

    backlog = open_ledger(settings, control_plane=True).backlog()
    data = backlog.to_dict()
    if args.json:
        _print_json(data)
        return 0
    age = data["oldest_unprocessed_age_seconds"]
    print(f"consumer              : {backlog.consumer}")
    print(f"source table          : {backlog.source_table}")
    print(f"watermark snapshot    : {backlog.watermark_snapshot_id or '(none: nothing processed yet)'}")
    print(f"current snapshot      : {backlog.current_snapshot_id or '(empty table)'}")
    print(f"backlog rows          : {backlog.rows} in {backlog.snapshots} snapshot(s)")
    print(f"oldest unprocessed age: {'-' if age is None else _duration(age)}")
    if backlog.skipped:
        print(f"not processed         : {backlog.skipped_rows} rows added by overwrite snapshots")
    return 0


def cmd_ledger_runs(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.ledger import open_ledger

    runs = open_ledger(settings, control_plane=True).runs()[: args.limit]
    rows = [
        {
            "run_id": r.run_id,
            "committed_at_ms": r.committed_at_ms,
            "from_snapshot_exclusive": r.from_snapshot_exclusive,
            "to_snapshot_inclusive": r.to_snapshot_inclusive,
            "rows": int(r.number("rows")),
            "rows_error": int(r.number("rows-error")),
            "output_tokens": int(r.number("output-tokens")),
        }
        for r in runs
    ]
    if args.json:
        _print_json(rows)
    elif not rows:
        print("no runs committed yet")
    else:
        for r in rows:
            print(
                f"{r['run_id']:<36} {r['from_snapshot_exclusive']} -> {r['to_snapshot_inclusive']}  "
                f"rows={r['rows']} errors={r['rows_error']} output_tokens={r['output_tokens']}"
            )
    return 0


def cmd_ledger_reset(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.ledger import open_ledger

    ledger = open_ledger(settings)
    target = None if args.to_snapshot == "none" else int(args.to_snapshot)
    if target is not None and ledger.source().metadata.snapshot_by_id(target) is None:
        raise PermanentError(f"snapshot {target} is not in {settings.source_table}'s metadata")
    sid = ledger.reset(target, reason=args.reason)
    print(f"{settings.consumer}: watermark set to {args.to_snapshot} (ledger snapshot {sid})")
    return 0


def cmd_job_run(args: argparse.Namespace, settings: Settings) -> int:
    import signal

    from icebatch_job.job import JobInterrupted, JobRequest, run_job

    def on_sigterm(signum: int, frame: Any) -> None:
        raise JobInterrupted()

    signal.signal(signal.SIGTERM, on_sigterm)
    request = JobRequest(
        run_id=args.run_id,
        from_snapshot="watermark" if args.from_snapshot is None else _snapshot_arg(args.from_snapshot),
        to_snapshot=None if args.to_snapshot is None else int(args.to_snapshot),
        limit=args.limit,
        rayjob_name=args.rayjob_name,
    )
    emit = (lambda _text: None) if args.json else print
    result = run_job(settings, request, out=emit)
    if args.json:
        _print_json(result.to_json())
    return {"completed": 0, "nothing_new": 0, "conflict": 5, "failed": 1}[result.status]


def _snapshot_arg(value: str) -> int | None:
    return None if value == "none" else int(value)


def cmd_model_tiny(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch_job.tiny_model import build_tiny_model

    path = build_tiny_model(settings.tiny_model_dir, force=args.force)
    print(path)
    return 0


def _apply_cli_settings(settings: Settings, dry_run: bool) -> None:
    """Handlers build their settings from the environment: hand them this process's view."""
    from icebatch.handlers import use_settings

    use_settings(settings.with_overrides(dry_run=True) if dry_run else settings)


def _print_decision(response: dict[str, Any], *, as_json: bool, show_manifest: bool) -> int:
    import yaml

    decision = response.get("decision") or {}
    if decision.get("decision") in {"rejected", "error"} and not as_json:
        print(f"icebatch: error: {decision.get('reason')}", file=sys.stderr)
        return 2
    if as_json:
        _print_json(response)
    else:
        keys = ("trigger", "origin", "table", "consumer", "watermark_snapshot_id", "current_snapshot_id",
                "backlog_rows", "oldest_unprocessed_age_seconds", "threshold", "active_job", "decision", "reason",
                "job_name", "gpus", "submission")  # fmt: skip
        for k in keys:
            if k in decision:
                print(f"{k:<30}: {decision[k]}")
        if show_manifest and response.get("manifest"):
            print("--- RayJob manifest (kubectl apply -f - would create it) ---")
            print(yaml.safe_dump(response["manifest"], sort_keys=False), end="")
    return 2 if decision.get("decision") in {"rejected", "error"} else 0


def cmd_launch(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.invoke import invoke

    _apply_cli_settings(settings, args.dry_run)
    event = {"action": "launch", "force": args.force, "dry_run": args.dry_run, "as_trigger": args.trigger}
    return _print_decision(
        invoke("launcher", event, logs_to_stderr=True), as_json=args.json, show_manifest=args.dry_run
    )


def cmd_invoke(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.invoke import invoke, load_event

    event = load_event(Path(args.event))
    if args.function == "launcher":
        _apply_cli_settings(settings, args.dry_run)
        return _print_decision(
            invoke("launcher", event, logs_to_stderr=True), as_json=args.json, show_manifest=args.dry_run
        )
    import contextlib

    use_settings_for_handlers(settings)
    # with --json, stdout carries only the handler's response (what `sam local invoke` prints)
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        response = invoke(args.function, event, logs_to_stderr=True)
    if args.json:
        _print_json(response)
    if response.get("status") in {"rejected", "error"}:
        if not args.json:
            print(f"icebatch: error: {response.get('reason')}", file=sys.stderr)
        return 2
    if not args.json:
        print(f"{args.function}: {response.get('status')} ({response.get('subject', '')})")
    return 0


def use_settings_for_handlers(settings: Settings) -> None:
    from icebatch.handlers import use_settings

    use_settings(settings)


def cmd_report(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch_job.history import completed_from_ledger

    from icebatch.report import completed_text

    event = completed_from_ledger(settings, args.run_id)
    if args.json:
        _print_json(event.model_dump(mode="json"))
    else:
        print(completed_text(event))
    return 0


def cmd_contracts(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch import contracts

    if args.action == "write":
        changed = contracts.write()
        print("\n".join(f"wrote eventbridge/{c}" for c in changed) or "eventbridge/ is up to date")
        return 0
    stale = contracts.check()
    if stale:
        print("out of date (run `icebatch contracts write`): " + ", ".join(stale), file=sys.stderr)
        return 1
    print("eventbridge/ matches the code")
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch_job.demo import run_demo

    return run_demo(settings, tickets=args.tickets, batches=args.batches)


def config_markdown() -> str:
    """The README's configuration table (a test keeps the README equal to this)."""
    names = Settings.env_names()
    defaults = Settings.model_construct().model_dump()
    rows = ["| variable | default | what |", "| --- | --- | --- |"]
    for field, var in names.items():
        info = Settings.model_fields[field]
        default = defaults[field]
        shown = (
            ""
            if default is None or default == {}
            else f"`{json.dumps(default) if isinstance(default, (list, dict)) else default}`"
        )
        rows.append(f"| `{var}` | {shown} | {(info.description or '').replace('|', '/')} |")
    return "\n".join(rows)


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    names = Settings.env_names()
    values = settings.model_dump(by_alias=False)
    if args.markdown:
        print(config_markdown())
        return 0
    if args.json:
        _print_json({names[k]: v for k, v in values.items()})
        return 0
    for field, var in names.items():
        desc = Settings.model_fields[field].description or ""
        print(f"{var:<40} = {values[field]!s:<28} {desc}")
    print(f"{'(derived) results table':<40} = {settings.results_table}")
    return 0


# --------------------------------------------------------------------------------------------------
# parser
# --------------------------------------------------------------------------------------------------
def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="icebatch",
        description="Incremental, event-driven LLM labelling of an Iceberg table: generate data, inspect the "
        "backlog, launch and run jobs, read cost reports.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "generate",
        help="append generated support tickets to the source table",
        description="Append realistic support tickets, one snapshot per batch (creates the table if needed). "
        "Prints each snapshot id.",
    )
    p.add_argument("--tickets", type=int, required=True, help="total number of tickets to append")
    p.add_argument("--batches", type=int, default=1, help="number of snapshots (default: 1)")
    p.add_argument("--interval", type=float, default=0.0, help="seconds to wait between batches")
    p.add_argument("--seed", type=int, default=None, help="make the tickets reproducible")
    p.set_defaults(handler=cmd_generate)

    p = sub.add_parser(
        "backlog",
        help="rows waiting for this consumer (metadata only)",
        description="How many rows were appended after the consumer's watermark, computed from snapshot "
        "summaries without reading data files, and how long the oldest has waited.",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(handler=cmd_backlog)

    p = sub.add_parser("ledger", help="the consumer's committed runs and watermark")
    lsub = p.add_subparsers(dest="ledger_command", metavar="ACTION", required=True)
    q = lsub.add_parser("runs", help="committed runs, newest first")
    q.add_argument("--limit", type=int, default=20)
    q.add_argument("--json", action="store_true")
    q.set_defaults(handler=cmd_ledger_runs)
    q = lsub.add_parser(
        "reset",
        help="move the watermark by hand (after a rollback or snapshot expiry)",
        description="Record a new watermark without results. Rows after it will be processed by the next "
        "run; rows before it will not. Use `none` to reprocess the whole table.",
    )
    q.add_argument("--to-snapshot", required=True, help="source snapshot id, or `none`")
    q.add_argument("--reason", required=True, help="recorded in the ledger")
    q.set_defaults(handler=cmd_ledger_reset)

    p = sub.add_parser("job", help="the data-plane job (what a RayJob runs)")
    jsub = p.add_subparsers(dest="job_command", metavar="ACTION", required=True)
    q = jsub.add_parser(
        "run",
        help="read new rows, label them with the LLM, commit results + watermark",
        description="Run one job against the configured catalog: plan the range after the watermark, stream "
        "it through the LLM, commit the results with the new watermark in one commit, print the "
        "INCREMENTAL STATE / BATCH SUMMARY / TOKENOMICS blocks and emit a completion event. With nothing "
        "new it prints `new tickets : 0` and starts no engine. Exit status: 0 done or nothing new, 5 "
        "another run covered the range first, 1 failed (a 'Batch Job Failed' event was emitted).",
    )
    q.add_argument("--limit", type=int, help="process at most N rows (whole snapshots, at least one)")
    q.add_argument("--json", action="store_true", help="print one JSON summary instead of the report")
    q.add_argument("--run-id", help="run id (the launcher passes one; default: generated)")
    q.add_argument("--from-snapshot", help="expected watermark (`none` for the first run); refused if stale")
    q.add_argument("--to-snapshot", help="last source snapshot to include (default: current)")
    q.add_argument("--rayjob-name", help="recorded in the events (set by the RayJob)")
    q.set_defaults(handler=cmd_job_run)

    p = sub.add_parser("model", help="the local tiny model")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    q = msub.add_parser(
        "tiny",
        help="build the tiny random-weight Llama used on machines without a GPU (cached)",
        description="Build (once) a tiny Llama with random weights and a tokenizer trained on generated "
        "tickets under $ICEBATCH_HOME/models/tiny-llama, and print its path.",
    )
    q.add_argument("--force", action="store_true", help="rebuild even if it exists")
    q.set_defaults(handler=cmd_model_tiny)

    p = sub.add_parser(
        "launch",
        help="ask the launcher to decide (and launch) now",
        description="Build a manual event and call the launcher handler with it, exactly as Lambda would. "
        "Prints the decision record: trigger, table, watermark and current snapshot, backlog, threshold, "
        "active job, decision and reason. With --dry-run nothing is submitted and the RayJob manifest that "
        "would be created is printed (whatever the backend), so it can be reviewed before deploying.",
        epilog="examples:\n  icebatch launch --dry-run            # what would happen now, and the manifest\n"
        "  icebatch launch --trigger schedule    # behave like the nightly schedule (drain everything)\n"
        "  icebatch launch --force               # launch even below the threshold\n"
        "After ICEBATCH_MAX_ATTEMPTS failed jobs from the same watermark, launches stop until an operator has\n"
        "looked: fix the cause, then `icebatch ledger reset` or delete the failed jobs' records/RayJobs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--trigger",
        choices=["schedule", "append", "manual"],
        default="manual",
        help="evaluate as this trigger (default manual: threshold rules unless --force)",
    )
    p.add_argument("--force", action="store_true", help="launch even below the threshold (backlog must be > 0)")
    p.add_argument("--dry-run", action="store_true", help="decide and print the manifest; submit nothing")
    p.add_argument("--json", action="store_true", help="one JSON object: decision record and manifest")
    p.set_defaults(handler=cmd_launch)

    p = sub.add_parser(
        "invoke",
        help="feed an event file to a Lambda handler (like `sam local invoke -e FILE`, no Docker)",
        description="Call a handler with the JSON event in FILE and a local Lambda context. The event files "
        "in sam/events/ are the ones `sam local invoke` uses. An event for another table is a decision "
        "('ignored', exit 0); a malformed event is a one-line error (exit 2).",
    )
    p.add_argument("function", choices=["launcher", "reporter"])
    p.add_argument("--event", "-e", required=True, metavar="FILE", help="JSON event file")
    p.add_argument("--dry-run", action="store_true", help="launcher: never submit")
    p.add_argument("--json", action="store_true", help="print the handler's full response")
    p.set_defaults(handler=cmd_invoke)

    p = sub.add_parser(
        "report",
        help="a run's cost report, rebuilt from the ledger (default: the latest run)",
        description="Print the INCREMENTAL STATE / BATCH SUMMARY / TOKENOMICS report of a committed run from "
        "the ledger: its snapshot summary (totals, tokens, engine and job time) and its result rows (label "
        "breakdown). No event or report file is needed.",
    )
    p.add_argument("run_id", nargs="?", help="run id (see `icebatch ledger runs`); default: the latest")
    p.add_argument("--json", action="store_true", help="the report as the 'Batch Job Completed' detail (JSON)")
    p.set_defaults(handler=cmd_report)

    p = sub.add_parser("contracts", help="write or check eventbridge/ (schemas, patterns, schedules) from the code")
    p.add_argument("action", choices=["write", "check"])
    p.set_defaults(handler=cmd_contracts)

    p = sub.add_parser(
        "demo",
        help="the whole flow on this machine: tickets -> launcher -> job -> report (what `make demo` runs)",
        description="Build the tiny model, append generated tickets, invoke the launcher handler with "
        "sam/events/schedule.json (the local backend runs the job here, on CPU), let the completion event "
        "reach the reporter (the report is printed and filed under $ICEBATCH_HOME/reports), then invoke "
        "the launcher again to show that nothing new means no job.",
    )
    p.add_argument("--tickets", type=int, default=300)
    p.add_argument("--batches", type=int, default=5)
    p.set_defaults(handler=cmd_demo)

    p = sub.add_parser("config", help="list every setting, its environment variable and current value")
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", action="store_true", help="the README's table of settings and defaults")
    p.set_defaults(handler=cmd_config)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
        logging.basicConfig(
            level=logging.DEBUG if args.verbose else getattr(logging, settings.log_level.upper(), logging.INFO),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        _quiet_libraries(args.verbose)
        handler: Handler = args.handler
        return handler(args, settings)
    except PermanentError as e:
        print(f"icebatch: error: {e}", file=sys.stderr)
        return 2
    except TransientError as e:
        print(f"icebatch: unavailable (retry later): {e}", file=sys.stderr)
        return 3
    except IcebatchError as e:
        print(f"icebatch: {e}", file=sys.stderr)
        return 4
    except KeyboardInterrupt:
        print("icebatch: interrupted", file=sys.stderr)
        return 130


def _quiet_libraries(verbose: bool) -> None:
    if verbose:
        return
    for name in ("botocore", "urllib3", "pyiceberg", "kubernetes", "filelock", "fsspec"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")


if __name__ == "__main__":
    sys.exit(main())
