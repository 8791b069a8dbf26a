"""An HTTP proxy that injects failures in front of a real server (for retry and stall tests)."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.http_server import QuietHandler, serving


@contextmanager
def fault_proxy(
    upstream: str, *, fail_first: int = 0, status: int = 503, answer_first: int | None = None
) -> Iterator[tuple[str, dict[str, int]]]:
    """Forward to ``upstream`` but answer ``status`` to the first ``fail_first`` requests of each body; with
    ``answer_first``, leave every request after the first ``answer_first`` unanswered until the proxy closes
    (a server that stopped answering)."""
    counts = {"requests": 0, "injected": 0, "unanswered": 0}
    seen: dict[bytes, int] = {}
    lock = threading.Lock()
    closing = threading.Event()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                counts["requests"] += 1
                n = seen[body] = seen.get(body, 0) + 1
                inject = n <= fail_first
                counts["injected"] += inject
                silent = answer_first is not None and counts["requests"] > answer_first
                counts["unanswered"] += silent
            if silent:
                closing.wait()
                return
            if inject:
                self._reply(status, b'{"error": "injected"}')
                return
            req = urllib.request.Request(upstream + self.path, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    self._reply(r.status, r.read())
            except urllib.error.HTTPError as e:
                self._reply(e.code, e.read())

        def _reply(self, code: int, payload: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    with serving(Handler) as url:
        try:
            yield url, counts
        finally:
            closing.set()  # before the server stops: it waits for its requests
