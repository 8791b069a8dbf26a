"""Commands about the tables: generate tickets, the backlog, estimates, the ledger, reports of runs."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from functools import cache, partial
from typing import TYPE_CHECKING, Any

from icebatch.core.costs.money import usd
from icebatch.core.costs.report import watermark_text
from icebatch.core.errors import PermanentError
from icebatch.core.settings import Settings
from icebatch.tools.cli.common import (
    bounded_int,
    bounded_seconds,
    consumer_option,
    duration,
    one,
    print_json,
    selected,
    text,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from icebatch.core.consumers import Consumer
    from icebatch.core.costs.estimate import CostCheck
    from icebatch.core.costs.lease import Member
    from icebatch.core.ledger import Pending, RunRecord


def cmd_generate(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch_job.example.tickets import ensure_source_table, generate

    from icebatch.core.catalog import open_catalog

    table = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    batches = min(args.batches, args.tickets)  # a snapshot holds at least one ticket

    def report(i: int, size: int, sid: int) -> None:
        print(f"batch {i}/{batches}: appended {size} tickets -> snapshot {sid}", flush=True)

    ids = generate(
        table, tickets=args.tickets, batches=batches, seed=args.seed, interval=args.interval, on_snapshot=report
    )
    print(f"{settings.catalog.source_table}: {args.tickets} tickets in {len(ids)} snapshot(s)")
    return 0


def pending_dict(p: Pending | None, *, end_expired: bool = False) -> dict[str, Any] | None:
    """A run part way through its range, as ``backlog --json`` and ``ledger runs --json`` show it (``end_expired``:
    its range's end snapshot is gone, and the next run closes it: ``ResultsLedger._close``)."""
    if p is None:
        return None
    return {
        "end_expired": end_expired,
        "run_id": p.run_id,
        "from_snapshot_exclusive": p.from_snapshot_exclusive,
        "to_snapshot_inclusive": p.to_snapshot_inclusive,
        "range_rows": p.range_rows,
        "rows_committed": p.rows_committed,
        "chunks": p.chunks,
        "attempts": p.attempts,
    }


def cmd_backlog(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.core.costs.estimate import cost_check, estimate_run
    from icebatch.core.costs.lease import Member
    from icebatch.core.ledger import open_ledger

    found, stale, costs, members, held = [], set(), {}, [], {}
    now = datetime.now(UTC)
    for c in selected(settings, args.consumer):
        ledger = open_ledger(settings, c, control_plane=True)
        progress, source = ledger.progress(), ledger.source()
        backlog = ledger.backlog(watermark=progress.watermark, source=source)
        found.append((c, backlog, progress.pending))
        if progress.pending is not None and ledger.end_expired(progress.pending, source):
            stale.add(c.name)
        runs = ledger.runs()
        costs[c.name] = cost_check(backlog.rows, c, runs, settings) if progress.pending is None else None
        if costs[c.name] is not None:
            members.append(Member(c, backlog.rows, runs))
            cost = estimate_run(backlog.rows, c, runs, settings).usd if c.budget is not None else 0.0
            if refusal := _budget_refusal(c, backlog.rows, cost, partial(_spent_today, c, runs, settings, now)):
                held[c.name] = refusal
    together = _priced_together(members, costs, settings, held)
    if args.json:
        print_json(
            [
                {
                    **b.to_dict(),
                    "task_version": c.task_version,
                    "in_progress": pending_dict(p, end_expired=c.name in stale),
                    "cost_gate": check.to_dict() if (check := costs[c.name]) else None,
                    "priced_with": list(together.get(c.name, ())),
                }
                for c, b, p in found
            ]
        )
        return 0
    for c, b, p in found:
        age = b.oldest_pending_age_seconds()
        print(f"consumer              : {c.name} ({c.task.name} v{c.task_version})")
        print(f"source table          : {b.source_table}")
        print(f"watermark snapshot    : {watermark_text(b.watermark_snapshot_id)}")
        print(f"current snapshot      : {b.current_snapshot_id or '(empty table)'}")
        print(f"backlog rows          : {b.rows} in {b.snapshots} snapshot(s)")
        print(f"oldest unprocessed age: {'-' if age is None else duration(age)}")
        if b.skipped:
            print(
                f"rewritten             : {b.skipped_rows} rows added by overwrite snapshots (matched by content: "
                "only changed and new ones go to the model)"
            )
        if b.deleted_rows:
            print(
                f"deleted in the source : {b.deleted_rows} rows since the watermark (the next run removes their "
                "verdicts)"
            )
        if b.gap:
            print(
                "expired history       : snapshots after the watermark were expired; their rows are found among the "
                "live files (by data sequence number; format v1: all of them) and matched by content"
            )
        if (check := costs[c.name]) is not None:
            print(f"cost gate             : {check.summary()}{_with_others(together.get(c.name), held.get(c.name))}")
        if p is not None:
            print(f"in progress           : {p.describe()} (to snapshot {p.to_snapshot_inclusive})")
        if c.name in stale:
            print(
                "                        its range's end snapshot was expired: the next run closes it where it is "
                "and takes the rest of its rows, matched by content"
            )
        print()
    return 0


def _priced_together(
    members: list[Member], checks: dict[str, CostCheck | None], settings: Settings, held: dict[str, str]
) -> dict[str, tuple[str, ...]]:
    """As the launcher prices them: each consumer's run with the others of its model (one job), its check replaced in
    ``checks``; consumer -> the others. A consumer its budget holds back (``held``) is priced alone, and the others
    without its rows (``icebatch.control.launcher.decide_together``)."""
    from icebatch.core.costs.lease import shared_prices

    together = {}
    for name, (check, others) in shared_prices([m for m in members if m.consumer.name not in held], settings).items():
        checks[name], together[name] = check, others
    return together


def _spent_today(consumer: Consumer, runs: Sequence[RunRecord], settings: Settings, now: datetime) -> float:
    """What the consumer's runs and failed attempts cost today, as its budget counts it."""
    from icebatch.control.failure_records import failures_on_record
    from icebatch.core.costs.estimate import spent_on, start_of

    return spent_on(now, runs, settings, failures_on_record(settings, [consumer.name], since=start_of(now)))


def _budget_refusal(consumer: Consumer, rows: int, cost: float, spent: Callable[[], float]) -> str:
    """Why the consumer's budget refuses a run of ``rows`` estimated at ``cost`` ("" when it allows it), as the
    launcher's gate says; ``spent`` (today's spending) is read only for a daily budget."""
    from icebatch.control.gate import over_budget

    budget = consumer.budget
    if budget is None or rows <= 0:
        return ""
    refusal = over_budget(
        cost, spent() if budget.max_usd_per_day is not None else 0.0, budget.max_usd_per_run, budget.max_usd_per_day
    )
    return refusal.reason if refusal else ""


def _with_others(others: tuple[str, ...] | None, held: str | None = None) -> str:
    if held:
        return f" (priced alone: {held})"
    return f" (priced with {', '.join(others)}'s rows: one job)" if others else ""


def cmd_estimate(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.core.costs.estimate import cost_check, estimate_run
    from icebatch.core.costs.lease import Member
    from icebatch.core.ledger import open_ledger

    now = datetime.now(UTC)
    out, seen, held = [], [], {}
    for consumer in selected(settings, args.consumer):
        ledger = open_ledger(settings, consumer, control_plane=True)
        runs = ledger.runs()
        backlog = ledger.backlog()
        estimate = estimate_run(backlog.rows, consumer, runs, settings)
        spent_today = cache(partial(_spent_today, consumer, runs, settings, now))  # read once: shown, and the budget's
        check = cost_check(backlog.rows, consumer, runs, settings)
        seen.append((consumer, runs, backlog, check, estimate, spent_today()))
        if refusal := _budget_refusal(consumer, backlog.rows, estimate.usd, spent_today):
            held[consumer.name] = refusal
    checks = {c.name: check for c, _, _, check, _, _ in seen}
    members = [Member(c, b.rows, r) for c, r, b, check, _, _ in seen if check]
    together = _priced_together(members, checks, settings, held)
    for consumer, _, backlog, _, estimate, spent in seen:
        check = checks[consumer.name]
        budget = consumer.budget
        out.append(
            {
                **estimate.to_dict(),
                "cost_gate": check.to_dict() if check else None,
                "cost_gate_summary": (
                    f"{check.summary()}{_with_others(together.get(consumer.name), held.get(consumer.name))}"
                    if check
                    else None
                ),
                "priced_with": list(together.get(consumer.name, ())),
                "watermark_snapshot_id": backlog.watermark_snapshot_id,
                "current_snapshot_id": backlog.current_snapshot_id,
                "spent_today_usd": round(spent, 4),
                "max_usd_per_run": budget.max_usd_per_run if budget else None,
                "max_usd_per_day": budget.max_usd_per_day if budget else None,
            }
        )
    if args.json:
        print_json(out)
        return 0
    for e in out:
        per_run = usd(e["max_usd_per_run"])
        per_day = usd(e["max_usd_per_day"])
        print(f"consumer              : {e['consumer']} (task version {e['task_version']})")
        print(f"rows                  : {e['rows']:,} (after watermark {watermark_text(e['watermark_snapshot_id'])})")
        print(f"tokens (estimated)    : {e['input_tokens']:,} in, {e['output_tokens']:,} out ({e['basis']})")
        print(
            f"GPUs, GPU-hours       : {e['gpus']}, {e['gpu_hours']:.3f} "
            f"(at ${e['usd_per_hour']}/h, {e['instance_type']})"
        )
        print(f"cost (estimated)      : {usd(e['usd'])}; budget {per_run} per run, {per_day} per day")
        print(f"spent today           : {usd(e['spent_today_usd'])}")
        if e["cost_gate_summary"]:
            print(f"cost gate             : {e['cost_gate_summary']}")
        print()
    return 0


def cmd_ledger_runs(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.core.ledger import Key, open_ledger

    rows, in_progress = [], []
    for consumer in selected(settings, args.consumer):
        ledger = open_ledger(settings, consumer, control_plane=True)
        if (pending := pending_dict(ledger.pending())) is not None:
            in_progress.append({"consumer": consumer.name, **pending})
        for r in ledger.runs()[: args.limit]:
            rows.append(
                {
                    "consumer": consumer.name,
                    "run_id": r.run_id,
                    "task_version": r.task_version,
                    "committed_at_ms": r.committed_at_ms,
                    "from_snapshot_exclusive": r.from_snapshot_exclusive,
                    "to_snapshot_inclusive": r.to_snapshot_inclusive,
                    "rows": int(r.number(Key.ROWS)),
                    "rows_error": int(r.number(Key.ROWS_ERROR)),
                    "output_tokens": int(r.number(Key.OUTPUT_TOKENS)),
                    "chunks": int(r.number(Key.CHUNK, 1)),
                    "attempts": int(r.number(Key.ATTEMPTS, 1)),
                    "corrupt": r.corrupt,
                    "closed": r.closed_reason,
                    "reset_reason": r.text(Key.RESET_REASON) or None,
                }
            )
    if args.json:
        print_json({"runs": rows, "in_progress": in_progress})
        return 0
    for p in in_progress:
        print(
            f"{p['consumer']:<10} {p['run_id']:<36} in progress: {p['rows_committed']:,} of {p['range_rows']:,} rows "
            f"committed in {p['chunks']} chunk(s) by {p['attempts']} attempt(s)"
        )
    if not rows:
        print("no runs completed yet")
    for row in rows:
        if row["corrupt"] is not None:
            print(f"{row['consumer']:<10} {row['run_id']:<36} unreadable: {row['corrupt']}")
            continue
        start = "none" if row["from_snapshot_exclusive"] is None else row["from_snapshot_exclusive"]
        if row["reset_reason"] is not None:
            print(
                f"{row['consumer']:<10} {row['run_id']:<36} v{row['task_version']} reset to "
                f"{row['to_snapshot_inclusive'] or 'none'}: {row['reset_reason']}"
            )
            continue
        if row["closed"] is not None:
            print(
                f"{row['consumer']:<10} {row['run_id']:<36} v{row['task_version']} closed part way "
                f"(rows={row['rows']}): {row['closed']}"
            )
            continue
        print(
            f"{row['consumer']:<10} {row['run_id']:<36} v{row['task_version']} {start} -> "
            f"{row['to_snapshot_inclusive']}  rows={row['rows']} errors={row['rows_error']} "
            f"output_tokens={row['output_tokens']} chunks={row['chunks']} attempts={row['attempts']}"
        )
    return 0


def cmd_ledger_reset(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.core.errors import IcebatchError
    from icebatch.core.ledger import open_ledger

    consumer = one(settings, args.consumer)
    ledger = open_ledger(settings, consumer)
    source = ledger.source()
    target = None if args.to_snapshot == "none" else int(args.to_snapshot)
    if target is not None and source.metadata.snapshot_by_id(target) is None:
        raise PermanentError(f"snapshot {target} is not in {consumer.source_table}'s metadata")
    try:
        current: int | str | None = ledger.progress().watermark.source_snapshot_id
    except IcebatchError:  # the histories a reset is the fix for (expired, corrupt)
        current = "unreadable"
    again = None if args.new_source or isinstance(current, str) else labelled_again(source, current, target)
    who = f"{consumer.name} (task version {consumer.task_version})"
    moves = f"from {current if isinstance(current, str) else watermark_text(current)} to {args.to_snapshot}"
    if args.dry_run:
        relabel = f"; about {again:,} rows already labelled would be sent to the model again" if again else ""
        print(f"dry run: {who}: the watermark would move {moves}{relabel}; nothing recorded", flush=True)
        return 0
    if again and not args.yes:
        raise PermanentError(
            f"not done: moving {who}'s watermark back {moves} sends about {again:,} rows already "
            "labelled to the model again (each gets another verdict): see it with --dry-run, "
            "do it with --yes"
        )
    sid = ledger.reset(target, reason=args.reason, new_source=args.new_source)
    follows = (
        ""
        if args.new_source is None
        else (
            f"; now follows the new {consumer.source_table}, the old table's verdicts "
            f"{'kept' if args.new_source == 'keep-results' else 'deleted'}"
        )
    )
    print(f"{who}: watermark set to {args.to_snapshot} (ledger snapshot {sid}){follows}")
    return 0


def labelled_again(source: Any, watermark: int | None, target: int | None) -> int:
    """About how many labelled rows a reset from ``watermark`` back to ``target`` sends to the model again (0: it
    does not move back): the source's rows at the watermark less those at the target, from snapshot summaries."""
    meta = source.metadata
    at_watermark = meta.snapshot_by_id(watermark) if watermark is not None else None
    at_target = meta.snapshot_by_id(target) if target is not None else None
    if at_watermark is None or (at_target is not None and at_target.sequence_number >= at_watermark.sequence_number):
        return 0

    def total(snapshot: Any) -> int:
        summary = snapshot.summary if snapshot is not None else None
        return int(summary["total-records"]) if summary is not None and "total-records" in summary else 0

    return max(total(at_watermark) - total(at_target), 0)


def cmd_report(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.core.costs.report import completed_text
    from icebatch.tools.history import completed_from_ledger

    event = completed_from_ledger(settings, selected(settings, args.consumer), args.run_id)
    if args.json:
        print_json(event.model_dump(mode="json"))
    else:
        print(completed_text(event, prices=settings.cost.batch_prices()))
    return 0


def snapshot_or_none(value: str) -> str:
    """A snapshot id (an Iceberg long: digits, 0 to 2^63-1) or `none`."""
    if value == "none":
        return value
    try:
        bounded_int(0, 2**63 - 1)(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{value[:40]!r} is not a snapshot id (digits) or `none`") from None
    return value


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "generate",
        help="append generated support tickets to the source table",
        description="Append realistic support tickets, one snapshot per batch (creates the table if "
        "needed). Prints each snapshot id.",
    )
    p.add_argument("--tickets", type=bounded_int(1, 10_000_000), required=True, help="total number of tickets")
    p.add_argument(
        "--batches",
        type=bounded_int(1, 100_000),
        default=1,
        help="number of snapshots, at most one per ticket (default: 1)",
    )
    p.add_argument("--interval", type=bounded_seconds(86400), default=0.0, help="seconds to wait between batches")
    p.add_argument("--seed", type=bounded_int(0, 2**31), default=None, help="make the tickets reproducible")
    p.set_defaults(handler=cmd_generate)

    p = sub.add_parser(
        "backlog",
        help="rows waiting for each consumer (metadata only)",
        description="How many rows were appended after each consumer's watermark (for its current "
        "task version), computed from snapshot summaries without reading data files, and how long the "
        "oldest has waited.",
    )
    consumer_option(p)
    p.add_argument("--json", action="store_true", help="one JSON list, a consumer each")
    p.set_defaults(handler=cmd_backlog)

    p = sub.add_parser(
        "estimate",
        help="what the next run would cost, before anything is launched",
        description="Rows, estimated input/output tokens, GPUs, GPU-hours and $ of each consumer's "
        "current backlog — a whole backfill after a task version bump — against its budget. Tokens per "
        "row come from the consumer's last runs of this task version, else from the task "
        "(a prior).",
    )
    consumer_option(p)
    p.add_argument("--json", action="store_true", help="one JSON list, a consumer each")
    p.set_defaults(handler=cmd_estimate)

    add_ledger_parser(sub)

    p = sub.add_parser(
        "report",
        help="a run's cost report, rebuilt from the ledger (default: the latest run)",
        description="Print the INCREMENTAL STATE / BATCH SUMMARY / TOKENOMICS report of a committed run "
        "from the ledger: its snapshot summary (totals, tokens, engine and job time) and its result "
        "rows "
        "(label breakdown). No event or report file is needed.",
    )
    p.add_argument("run_id", nargs="?", help="run id (see `icebatch ledger runs`); default: the latest")
    consumer_option(p, "look only at this consumer's runs (default: every consumer's)")
    p.add_argument("--json", action="store_true", help="the report as the 'Batch Job Completed' detail (JSON)")
    p.set_defaults(handler=cmd_report)


def add_ledger_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``icebatch ledger runs|reset``."""
    p = sub.add_parser("ledger", help="the consumers' committed runs and watermarks")
    lsub = p.add_subparsers(dest="ledger_command", metavar="ACTION", required=True)
    q = lsub.add_parser("runs", help="committed runs, newest first")
    consumer_option(q)
    q.add_argument("--limit", type=bounded_int(1, 10_000), default=20, help="runs per consumer (default 20)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(handler=cmd_ledger_runs)
    q = lsub.add_parser(
        "reset",
        help="move a consumer's watermark by hand (a rollback, an expiry, a backfill's start)",
        description="Record a new watermark for the consumer's current task version, without results. "
        "Rows after it will be processed by the next run; rows before it will not. Use `none` to "
        "process the whole table again. A reset that moves the watermark back over labelled rows "
        "sends them to the model again and needs --yes; --dry-run says what it would do.",
    )
    consumer_option(q, "the consumer (needed when several are declared)")
    q.add_argument("--to-snapshot", type=snapshot_or_none, required=True, help="source snapshot id, or `none`")
    q.add_argument("--reason", type=text(500), required=True, help="recorded in the ledger (at most 500 characters)")
    q.add_argument(
        "--new-source",
        choices=("keep-results", "drop-results"),
        default=None,
        help="the source table was dropped and created again (another table UUID): follow the new one, "
        "and keep or delete the old table's verdicts (deleted in the same commit)",
    )
    q.add_argument(
        "--dry-run",
        action="store_true",
        help="say what the reset would do (and how many labelled rows "
        "it would send to the model again), and record nothing",
    )
    q.add_argument(
        "--yes",
        action="store_true",
        help="needed for a reset that moves the watermark back over "
        "rows already labelled: they get another verdict each",
    )
    q.set_defaults(handler=cmd_ledger_reset)
