"""What every command shares: output helpers, strict argument types, and the consumers to act on."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from icebatch.core.consumers import Consumer, consumer_named, load_consumers
from icebatch.core.settings import Settings
from icebatch.core.untrusted import summarize, whole_number

Handler = Callable[[argparse.Namespace, Settings], int]


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high], written plainly (no `1e3`, no `+5`)."""

    def parse(value: str) -> int:
        number = whole_number(value, low, high)
        if number is None:
            raise argparse.ArgumentTypeError(f"{summarize(value, 40)!r} is not a whole number from {low} to {high}")
        return number

    return parse


def bounded_seconds(high: float) -> Callable[[str], float]:
    """An argparse type: seconds from 0 to ``high``, as digits with an optional fraction (no `inf`, `nan`, `1e3`)."""

    def parse(value: str) -> float:
        whole, dot, fraction = value.partition(".")
        plain = whole_number(whole) is not None and (not dot or whole_number(fraction) is not None)
        if not (plain and float(value) <= high):
            raise argparse.ArgumentTypeError(f"{summarize(value, 40)!r} is not a number of seconds from 0 to {high:g}")
        return float(value)

    return parse


def text(limit: int) -> Callable[[str], str]:
    """An argparse type: 1 to ``limit`` printable characters (it is recorded, e.g. in a snapshot summary)."""

    def parse(value: str) -> str:
        if not 0 < len(value) <= limit or not value.isprintable():
            raise argparse.ArgumentTypeError(f"give 1 to {limit} printable characters (got {len(value):,})")
        return value

    return parse


def consumer_option(p: argparse.ArgumentParser, what: str = "the consumer (default: all, or the only one)") -> None:
    p.add_argument("--consumer", metavar="NAME", help=what)


def selected(settings: Settings, name: str | None) -> list[Consumer]:
    """The consumers a command acts on: the one named, else every declared one."""
    consumers = load_consumers(settings)
    return [consumer_named(consumers, name)] if name else consumers


def one(settings: Settings, name: str | None) -> Consumer:
    return consumer_named(load_consumers(settings), name)
