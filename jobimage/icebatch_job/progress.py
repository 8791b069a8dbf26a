"""Progress of a long run on the console's stderr: a bar on a terminal, a line every few seconds in logs."""

from __future__ import annotations

import time
from typing import TextIO

from icebatch.core.terminal import console


class Progress:
    def __init__(self, total: int, *, label: str = "rows", stream: TextIO | None = None, every: float = 10.0) -> None:
        self.total = max(total, 0)
        self.label = label
        self.stream = stream or console.err()
        self.tty = self.stream.isatty()
        self.every = 0.5 if self.tty else every
        self.done = 0
        self.started = time.monotonic()
        self.first_at: float | None = None
        self._last = 0.0

    def note(self, message: str) -> None:
        self._clear()
        print(f"[icebatch] {message}", file=self.stream, flush=True)

    def advance(self, n: int) -> None:
        now = time.monotonic()
        if self.first_at is None and n:
            self.first_at = now
        self.done += n
        if now - self._last >= self.every or self.done >= self.total:
            self._last = now
            self._render(now)

    def _render(self, now: float) -> None:
        elapsed = now - self.started
        pct = 100 * self.done / self.total if self.total else 100.0
        flowing = now - self.first_at if self.first_at else 0.0
        rate = self.done / flowing if flowing > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else None
        eta_text = f"ETA {eta:.0f} s" if eta is not None else "ETA -"
        counts = f"{self.done:,}/{self.total:,} {self.label}"
        text = f"{counts} {pct:5.1f}%  {rate:,.1f}/s  {eta_text}  ({elapsed:.0f} s)"
        if self.tty:
            width = 24
            filled = int(width * pct / 100)
            print(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}", end="", file=self.stream, flush=True)
        else:
            print(f"[icebatch] {text}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=self.stream, flush=True)

    def _clear(self) -> None:
        if self.tty and self.done:
            print(file=self.stream)
