"""The embedded default's logs of records, one JSON document a line (``events.jsonl``, ``decisions.jsonl``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

log = logging.getLogger(__name__)
T = TypeVar("T")


def records(path: Path, parse: Callable[[Any], T | None], what: str) -> Iterator[T]:
    """Each line of ``path`` parsed (``parse`` returns None for a record not wanted here); a line that does not
    parse is skipped with a warning naming it (a torn write, a hand edit), never fatal. No file: nothing."""
    if not path.is_file():
        return
    with path.open() as f:
        for number, line in enumerate(f, 1):
            try:
                parsed = parse(json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError, ValidationError) as e:
                log.warning("%s line %d: not %s icebatch reads (%s); skipped", path, number, what, type(e).__name__)
                continue
            if parsed is not None:
                yield parsed
