"""What every command shares: output helpers, strict argument types, and the consumers to act on."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from icebatch.core.consumers import Consumer, consumer_named, load_consumers
from icebatch.core.settings import Settings

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
        if not value.isdigit() or not low <= int(value) <= high:
            raise argparse.ArgumentTypeError(f"{value[:40]!r} is not a whole number from {low} to {high}")
        return int(value)

    return parse


def consumer_option(p: argparse.ArgumentParser, what: str = "the consumer (default: all, or the only one)") -> None:
    p.add_argument("--consumer", metavar="NAME", help=what)


def selected(settings: Settings, name: str | None) -> list[Consumer]:
    """The consumers a command acts on: the one named, else every declared one."""
    consumers = load_consumers(settings)
    return [consumer_named(consumers, name)] if name else consumers


def one(settings: Settings, name: str | None) -> Consumer:
    return consumer_named(load_consumers(settings), name)
