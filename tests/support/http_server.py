"""A local HTTP server for a test's stand-in endpoint: a quiet handler, started on a free port, stopped after;
and the one CloudFormation's custom resources answer to."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 (AWS SDKs keep connections alive), no access log on stderr."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` on 127.0.0.1 (a free port), each request in its own thread; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def cloudformation_responses(path: str = "/cloudformation") -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The presigned URL a custom resource PUTs its answer to; yields it and the answers received."""
    answers: list[dict[str, Any]] = []

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.0"  # the custom resource's PUT closes its connection

        def do_PUT(self) -> None:
            answers.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler) as url:
        yield url + path, answers
