"""Commands that call the Lambda handlers here, as `sam local invoke` would: launch, invoke."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from icebatch.core.costs.report import watermark_text
from icebatch.core.errors import EXIT_OK, EXIT_PERMANENT
from icebatch.core.settings import Settings
from icebatch.core.terminal.json_stdout import stdout_kept_for_json
from icebatch.tools.cli.common import consumer_option, print_json

DECISION_KEYS = (
    "consumer",
    "task_version",
    "trigger",
    "origin",
    "table",
    "watermark_snapshot_id",
    "current_snapshot_id",
    "backlog_rows",
    "oldest_unprocessed_age_seconds",
    "threshold",
    "estimate_usd",
    "usd_per_1k_rows",
    "ceiling_usd_per_1k_rows",
    "ceiling_basis",
    "rows_to_pay",
    "active_job",
    "decision",
    "reason",
    "job_name",
    "gpus",
    "submission",
)


def print_decisions(response: dict[str, Any], *, as_json: bool, show_manifests: bool) -> int:
    import yaml

    from icebatch.control.gate import REFUSALS

    refused = any(d.get("decision") in REFUSALS for d in response.get("decisions", []))
    status = EXIT_PERMANENT if response.get("status") in {"rejected", "error"} or refused else EXIT_OK
    if as_json:
        print_json(response)
        return status
    if response.get("status") in {"rejected", "error"}:
        print(f"icebatch: error: {response.get('reason')}", file=sys.stderr)
        return status
    shown_jobs: set[str] = set()  # a shared job's manifest is each of its consumers': printed once
    for decision, manifest in zip(response["decisions"], response["manifests"], strict=True):
        for key in DECISION_KEYS:
            value = decision.get(key)
            shown = watermark_text(value) if key == "watermark_snapshot_id" else "-" if value is None else value
            print(f"{key:<30}: {shown}")
        name = str(manifest["metadata"]["name"]) if manifest else ""
        if show_manifests and manifest and name in shown_jobs:
            print(f"--- RayJob manifest: {name}, printed above (one job for several consumers) ---")
        elif show_manifests and manifest:
            print("--- RayJob manifest (kubectl apply -f - would create it) ---")
            print(yaml.safe_dump(manifest, sort_keys=False), end="")
            shown_jobs.add(name)
        print()
    for d in response["decisions"]:  # a consumer that cannot run: its reason says what to fix
        if d.get("decision") in REFUSALS:
            print(f"icebatch: error: {d['consumer']}: {d['decision']}: {d['reason']}", file=sys.stderr)
    return status


def cmd_launch(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.tools.invoke import invoke

    event: dict[str, Any] = {
        "action": "launch",
        "force": args.force,
        "dry_run": args.dry_run,
        "as_trigger": args.trigger,
    }
    if args.consumer:
        event["consumer"] = args.consumer
    with stdout_kept_for_json(args.json):
        response = invoke("launcher", event, settings, logs_to_stderr=True)
    return print_decisions(response, as_json=args.json, show_manifests=args.dry_run)


def cmd_invoke(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.tools.invoke import invoke, load_event

    event = load_event(Path(args.event))
    if args.function == "launcher":
        s = settings.with_overrides(dry_run=True) if args.dry_run else settings
        with stdout_kept_for_json(args.json):
            response = invoke("launcher", event, s, logs_to_stderr=True)
        return print_decisions(response, as_json=args.json, show_manifests=args.dry_run)
    with stdout_kept_for_json(args.json):  # stdout carries only the handler's response (as `sam local invoke`)
        response = invoke(args.function, event, settings, logs_to_stderr=True)
    if args.json:
        print_json(response)
    if response.get("status") in {"rejected", "error"}:
        if not args.json:
            print(f"icebatch: error: {response.get('reason')}", file=sys.stderr)
        return EXIT_PERMANENT
    if not args.json:
        print(f"{args.function}: {response.get('status')} ({response.get('subject', '')})")
    return EXIT_OK


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "launch",
        help="ask the launcher to decide (and launch) now, for every consumer",
        description="Build a manual event and call the launcher handler with it, exactly as Lambda would. Prints "
        "one decision record per consumer: trigger, table, watermark and current snapshot, backlog, threshold, "
        "estimate, active job, decision and reason. With --dry-run nothing is submitted and the RayJob manifests "
        "that would be created are printed (whatever the backend), for review before deploying.",
        epilog="examples:\n  icebatch launch --dry-run                    # what would happen now, and the manifests\n"
        "  icebatch launch --trigger schedule           # behave like the nightly schedule (drain everything)\n"
        "  icebatch launch --consumer triage --force    # launch one consumer even below its threshold\n"
        "After ICEBATCH_MAX_ATTEMPTS failed jobs from the same watermark, launches stop until an operator has\n"
        "looked: fix the cause, then `icebatch ledger reset` or delete the failed jobs' records/RayJobs.\n"
        "A run whose estimate exceeds the consumer's budget is refused: `icebatch estimate` shows it.\n"
        "A consumer that cannot run as it stands (invalid_task: a column its task reads is missing or dropped,\n"
        "or, on kuberay, its model's weights do not fit the GPU worker;\n"
        "source_replaced: its source table was dropped and created again) is refused with exit status 2.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--trigger",
        choices=["schedule", "append", "manual"],
        default="manual",
        help="evaluate as this trigger (default manual: threshold rules unless --force)",
    )
    consumer_option(p, "only this consumer (default: every consumer)")
    p.add_argument("--force", action="store_true", help="launch even below the threshold (backlog must be > 0)")
    p.add_argument("--dry-run", action="store_true", help="decide and print the manifests; submit nothing")
    p.add_argument("--json", action="store_true", help="one JSON object: status, decision records, manifests")
    p.set_defaults(handler=cmd_launch)

    p = sub.add_parser(
        "invoke",
        help="feed an event file to a Lambda handler (like `sam local invoke -e FILE`, no Docker)",
        description="Call a handler with the JSON event in FILE and a local Lambda context. The event files in "
        "sam/events/ are the ones `sam local invoke` uses. An event for another table is a decision ('ignored', "
        "exit 0); a malformed event is a one-line error (exit 2).",
    )
    p.add_argument("function", choices=["launcher", "reporter"])
    p.add_argument("--event", "-e", required=True, metavar="FILE", help="JSON event file")
    p.add_argument("--dry-run", action="store_true", help="launcher: never submit")
    p.add_argument("--json", action="store_true", help="print the handler's full response, alone on stdout")
    p.set_defaults(handler=cmd_invoke)
