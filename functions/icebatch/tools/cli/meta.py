"""Commands about icebatch itself: its settings, its contracts, its demo."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Literal, get_args, get_origin

from pydantic.fields import FieldInfo

from icebatch.core.settings import SECTIONS, Section, Settings, env_text
from icebatch.tools.cli.common import bounded_int, print_json


def config_markdown() -> str:
    """The settings tables of docs/reference/settings.md, a section each (a test keeps the page equal to this)."""
    out: list[str] = []
    for name, section in SECTIONS.items():
        out += [
            "",
            f"*{name if name != 'top' else 'general'}*",
            "",
            "| variable | default | values | what |",
            "| --- | --- | --- | --- |",
        ]
        for field, info in section.model_fields.items():
            default = info.get_default(call_default_factory=True)
            shown = (
                ""
                if default in (None, {})
                else f"`{json.dumps(default) if isinstance(default, (list, dict)) else env_text(default)}`"
            )
            what = (info.description or "").replace("|", "/")
            out.append(f"| `{Section.env_name(field)}` | {shown} | {_values(info)} | {what} |")
    return "\n".join(out[1:])


def _values(info: FieldInfo) -> str:
    """What a variable may hold: its choices, `true`/`false`, or the range of a number (as the settings check it)."""
    if get_origin(info.annotation) is Literal:
        return ", ".join(f"`{choice}`" for choice in get_args(info.annotation))
    kinds = {a for a in (get_args(info.annotation) or (info.annotation,)) if a is not type(None)}
    if kinds == {bool}:
        return "`true`, `false`"
    if not kinds <= {int, float}:
        return ""
    low = next((f">= {_num(m.ge)}" for m in info.metadata if getattr(m, "ge", None) is not None), "")
    low = low or next((f"> {_num(m.gt)}" for m in info.metadata if getattr(m, "gt", None) is not None), "")
    high = next((f"<= {_num(m.le)}" for m in info.metadata if getattr(m, "le", None) is not None), "")
    kind = "whole number" if kinds == {int} else "number"
    return ", ".join(p for p in (kind, low, high) if p)


def _num(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    if args.markdown:
        print(config_markdown())
        return 0
    values = {
        Section.env_name(field): value
        for name in SECTIONS
        for field, value in getattr(settings, name).model_dump(mode="json").items()
    }
    if args.json:
        print_json(values)
        return 0
    for name, section in SECTIONS.items():
        print(f"[{name if name != 'top' else 'general'}]")
        for field, info in section.model_fields.items():
            var = Section.env_name(field)
            shown = "(not set)" if values[var] is None else env_text(values[var])  # as the variable is written
            print(f"  {var:<40} = {shown:<28} {info.description or ''}")
    return 0


def cmd_contracts(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.tools import contracts

    if args.action == "write":
        changed = contracts.write()
        print("\n".join(f"wrote {c}" for c in changed) or "every contract file is up to date")
        return 0
    stale = contracts.check()
    if stale:
        print("out of date (run `icebatch contracts write`): " + ", ".join(stale), file=sys.stderr)
        return 1
    print("every contract file (eventbridge/, the consumers' schemas) matches the code")
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch.tools.demo import run_demo

    return run_demo(settings, tickets=args.tickets, batches=args.batches)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("contracts", help="write or check eventbridge/ (schemas, patterns, schedules) from the code")
    p.add_argument("action", choices=["write", "check"])
    p.set_defaults(handler=cmd_contracts)

    p = sub.add_parser(
        "demo",
        help="the whole flow on this machine: tickets -> launcher -> jobs -> reports (what `make demo` runs)",
        description="Build the tiny model, append generated tickets, invoke the launcher handler with "
        "sam/events/schedule.json (the local backend runs each consumer's job here, on CPU), let the completion "
        "events reach the reporter (reports printed and filed under $ICEBATCH_HOME/reports), invoke the launcher "
        "again to show that nothing new means no job, then bump a task's version and show the backfill's "
        "estimate and its refusal by the budget.",
    )
    p.add_argument("--tickets", type=bounded_int(1, 100_000), default=300)
    p.add_argument("--batches", type=bounded_int(1, 1_000), default=5)
    p.set_defaults(handler=cmd_demo)

    p = sub.add_parser("config", help="list every setting, its environment variable and current value")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="one JSON object: variable -> current value")
    form.add_argument(
        "--markdown",
        action="store_true",
        help="the documentation's tables of settings and defaults (docs/reference/settings.md)",
    )
    p.set_defaults(handler=cmd_config)
