"""`icebatch runs` and `icebatch costs`: the run history and the spend per day (``icebatch.tools.runs``)."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from icebatch.core.costs.money import usd
from icebatch.core.errors import PermanentError
from icebatch.core.settings import Settings
from icebatch.core.untrusted import summarize
from icebatch.tools.cli.common import bounded_int, consumer_option, duration, print_json, selected

if TYPE_CHECKING:
    from icebatch.core.consumers import Consumer
    from icebatch.tools.runs import DaySpend, RunRow

NOTE_WIDTH = 70


def _history(
    settings: Settings, name: str | None, since: datetime | None = None
) -> tuple[list[Consumer], list[RunRow]]:
    from icebatch.core.ledger import open_ledger
    from icebatch.tools.runs import history

    consumers = selected(settings, name)
    ledgers = {c.name: open_ledger(settings, c, control_plane=True) for c in consumers}
    return consumers, history(settings, consumers, ledgers, since=since)


def cmd_runs(args: argparse.Namespace, settings: Settings) -> int:
    if args.runs_command == "show":
        return cmd_runs_show(args, settings)
    _, rows = _history(settings, args.consumer)
    rows = rows[: args.limit]
    if args.json:
        print_json({"runs": [r.to_dict() for r in rows]})
        return 0
    if not rows:
        print("no runs yet: `icebatch launch` (or `icebatch job run`) starts one")
        return 0
    print(
        f"{'ENDED (UTC)':<20} {'CONSUMER':<12} {'RUN':<36} {'STATUS':<11} {'ROWS':>7} {'TRIES':>5} "
        f"{'DURATION':>9} {'COST':>9}  NOTE"
    )
    for r in rows:
        ended = (r.ended_at or "(part way)").replace("T", " ")[:19]
        took = duration(r.seconds) if r.seconds else "-"
        print(
            f"{ended:<20} {r.consumer:<12} {r.run_id:<36} {r.status:<11} {r.rows:>7,} {r.attempts or '-':>5} "
            f"{took:>9} {_usd(r.cost_usd):>9}  {r.note[:NOTE_WIDTH]}"
        )
    return 0


def cmd_runs_show(args: argparse.Namespace, settings: Settings) -> int:
    _, rows = _history(settings, args.consumer)
    mine = [r for r in rows if r.run_id == args.run_id]
    if not mine:
        raise PermanentError(
            f"no run {summarize(args.run_id, 80)!r} in the ledger or the event log; `icebatch runs` lists them"
        )
    if args.json:
        print_json({"run_id": args.run_id, "records": [r.to_dict() for r in mine]})
        return 0
    for r in mine:
        print(
            f"{r.status:<11} {r.consumer} task v{r.task_version}  range ({_snap(r.from_snapshot)}, "
            f"{_snap(r.to_snapshot)}]"
        )
        print(
            f"  started {r.started_at or '-'}  ended {r.ended_at or '(running)'}  "
            f"{duration(r.seconds) if r.seconds else '-'}"
        )
        print(f"  rows {r.rows:,} (errors {r.rows_error:,})  attempts {r.attempts}  cost {_usd(r.cost_usd)}")
        if r.note:
            print(f"  {r.note}")
    if any(r.status in ("completed", "resumed", "closed") for r in mine):
        print(f"the cost report: `icebatch report {args.run_id}`")
    return 0


def cmd_costs(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.tools.runs import spend_per_day

    since = datetime.now(UTC) - args.since
    consumers, rows = _history(settings, args.consumer, since)
    days = spend_per_day(rows, consumers, since)
    if args.html:
        _write_page(args.html, settings, consumers, days, since)
    if args.json:
        print_json(
            {
                "since": since.isoformat(timespec="seconds"),
                "days": [d.to_dict() for d in days],
                "total_usd": sum(d.cost_usd for d in days),
            }
        )
        return 0
    if not days:
        print(f"nothing spent since {since:%Y-%m-%d %H:%M} UTC")
        if args.html:
            print(f"charts: {args.html} (open it in a browser)")
        return 0
    print(f"{'DAY (UTC)':<11} {'CONSUMER':<12} {'RUNS':>5} {'FAILED':>6} {'ROWS':>8} {'SPENT':>9} {'BUDGET/DAY':>10}")
    for d in days:
        print(
            f"{d.day:<11} {d.consumer:<12} {d.runs:>5} {d.failed_attempts:>6} {d.rows:>8,} {_usd(d.cost_usd):>9} "
            f"{_budget(d):>10}"
        )
    print(f"total since {since:%Y-%m-%d %H:%M} UTC: {_usd(sum(d.cost_usd for d in days))}")
    if args.html:
        print(f"charts: {args.html} (open it in a browser)")
    return 0


def _write_page(
    path: Path, settings: Settings, consumers: list[Consumer], days: list[DaySpend], since: datetime
) -> None:
    from icebatch.tools.costs_page import Page, render
    from icebatch.tools.decision_log import backlog_points

    names = [c.name for c in consumers]
    page = Page(
        title=f"icebatch costs: {settings.top.deployment}",
        since=since,
        now=datetime.now(UTC),
        consumers=names,
        days=days,
        backlog=backlog_points(settings.home, names, since),
    )
    try:
        path.write_text(render(page))
    except OSError as e:
        raise PermanentError(
            f"cannot write the page to {summarize(str(path), 200)}: {e.strerror}; "
            "give --html a file in a folder that exists"
        ) from e


def _usd(value: float) -> str:
    return usd(value)


def _snap(value: int | None) -> str:
    return "none" if value is None else str(value)


def _budget(d: DaySpend) -> str:
    if d.budget_usd is None:
        return "-"
    return f"{d.cost_usd / d.budget_usd:.0%} of {usd(d.budget_usd)}"


def since(value: str) -> timedelta:
    """An argparse type: a look-back like `30d` or `12h` (1 hour to 3,660 days)."""
    match = re.fullmatch(r"([1-9][0-9]{0,5})([dh])", value)
    span = None if match is None else timedelta(**{"days" if match[2] == "d" else "hours": int(match[1])})
    if span is None or not timedelta(hours=1) <= span <= timedelta(days=3660):
        raise argparse.ArgumentTypeError(f"{summarize(value, 40)!r} is not a look-back like 30d or 12h")
    return span


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "runs",
        help="every run of every consumer: completed, in progress, failed, closed, resets",
        description="The run history, newest first: the ledger's runs (completed, resumed after a "
        "failed attempt, closed part way, resets with their reason, the one in progress) and the "
        "attempts that failed, were interrupted or stalled (the local event log; on AWS those are in "
        "the reporter's SNS reports). Cost is GPU lifetime at the run's recorded rate, as the reports "
        "give it.",
    )
    consumer_option(p, "only this consumer's runs (default: every consumer's)")
    p.add_argument("--limit", type=bounded_int(1, 10_000), default=50, help="lines at most (default 50)")
    p.add_argument("--json", action="store_true", help="one JSON document: {runs: [...]}")
    p.set_defaults(handler=cmd_runs, runs_command=None)
    rsub = p.add_subparsers(dest="runs_command", metavar="show RUN", title="one run")
    q = rsub.add_parser("show", help="one run: its attempts, range, rows, cost")
    q.add_argument("run_id", metavar="RUN", help="a run id (`icebatch runs` lists them)")
    consumer_option(q, "look only at this consumer's runs")
    q.add_argument("--json", action="store_true")
    q = sub.add_parser(
        "costs",
        help="spend per consumer per day, against its daily budget",
        description="What each consumer spent per UTC day: its completed and closed runs (the "
        "reports' figure, which the daily budget is held to) and failed attempts that committed "
        "nothing.",
    )
    q.add_argument("--since", type=since, default=timedelta(days=30), help="look back this far: 30d (default), 12h")
    consumer_option(q, "only this consumer")
    q.add_argument("--json", action="store_true")
    q.add_argument(
        "--html",
        metavar="FILE",
        type=Path,
        help="also write a self-contained page with charts: spend per day against the budget, rows "
        "labelled per day, and the backlog each launcher decision saw (kept in decisions.jsonl "
        "under the home)",
    )
    q.set_defaults(handler=cmd_costs)
