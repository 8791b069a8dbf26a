"""Lambda's Runtime API on 127.0.0.1, played by a test: what a function's runtime interface client talks to.

The shapes are Lambda's (docs.aws.amazon.com/lambda/latest/dg/runtimes-api.html): the client asks
``GET /2018-06-01/runtime/invocation/next`` and gets the event with the request's id, deadline, function ARN
and trace id in headers; it answers ``POST .../invocation/<id>/response`` or ``.../invocation/<id>/error`` (an
error document: errorMessage, errorType, stackTrace), or ``POST .../init/error`` when the function cannot even
start. As Lambda does, the API hands out one invocation at a time, and a function still running at its deadline
is killed (its answer is "Task timed out"; the next invocation starts a new process: a cold start).

``LambdaProcess`` is a function started as Lambda starts one: ``python -m awslambdaric <handler>`` in its task
root, with the function's environment and ``AWS_LAMBDA_RUNTIME_API`` pointing here. A process that ends
mid-invocation gets Lambda's answer for it (Runtime.ExitError); the next invocation needs a new process.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PREFIX = "/2018-06-01/runtime"


@dataclass(frozen=True)
class Answer:
    """What the function posted for one invocation (``kind``: response, error, init_error), or what Lambda says
    of it (timeout: killed at its deadline; exit: its process ended before it answered)."""

    kind: str
    request_id: str
    body: Any
    headers: dict[str, str]


class RuntimeApi:
    """The Runtime API: ``invoke`` queues an event and waits for the function's answer."""

    def __init__(self) -> None:
        self._next: queue.Queue[tuple[str, Any, int]] = queue.Queue()
        self._answers: queue.Queue[Answer] = queue.Queue()
        self.served: list[str] = []  # request ids handed out, in order
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path != f"{PREFIX}/invocation/next":
                    self._reply(404, {"errorType": "NotFound", "errorMessage": self.path})
                    return
                request_id, event, deadline_ms = api._next.get()  # long poll, as Lambda's
                api.served.append(request_id)
                self._reply(
                    200,
                    event,
                    {
                        "Lambda-Runtime-Aws-Request-Id": request_id,
                        "Lambda-Runtime-Deadline-Ms": str(deadline_ms),
                        "Lambda-Runtime-Invoked-Function-Arn": "arn:aws:lambda:us-east-1:123456789012:function:f",
                        "Lambda-Runtime-Trace-Id": f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]};Sampled=0",
                    },
                )

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = self.path.removeprefix(PREFIX).strip("/").split("/")
                if parts == ["init", "error"]:
                    kind, request_id = "init_error", ""
                elif len(parts) == 3 and parts[0] == "invocation" and parts[2] in ("response", "error"):
                    kind, request_id = parts[2], parts[1]
                else:
                    self._reply(404, {"errorType": "NotFound", "errorMessage": self.path})
                    return
                api._answers.put(Answer(kind, request_id, _json(body), dict(self.headers)))
                self._reply(202, {"status": "OK"})

            def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.address = f"127.0.0.1:{self._server.server_address[1]}"

    def invoke(self, function: LambdaProcess, event: Any, *, timeout_s: float = 300) -> Answer:
        """Hand ``event`` to the function with ``timeout_s`` until its deadline; its answer. Past the deadline the
        function's process is killed, as Lambda kills it, and the answer is a timeout."""
        request_id = str(uuid.uuid4())
        self._next.put((request_id, event, int((time.time() + timeout_s) * 1000)))
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                answer = self._answers.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if function.proc.poll() is not None:  # as Lambda answers for a runtime that died mid-invocation
                    error = {"errorType": "Runtime.ExitError", "errorMessage": f"exit {function.proc.returncode}"}
                    return Answer("exit", request_id, error, {})
                if time.monotonic() >= deadline:
                    function.kill()
                    return Answer("timeout", request_id, {"errorMessage": "Task timed out"}, {})
                continue
            if answer.kind == "init_error" or answer.request_id == request_id:
                return answer

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A function killed mid-request (as the tests kill one) resets its connection: nothing to report."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return body.decode(errors="replace")


class LambdaProcess:
    """One execution environment: the runtime interface client running ``handler`` from ``task_root``."""

    def __init__(self, handler: str, task_root: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                # -S: no site-packages of this machine; only the standard library, the task root and the
                # runtime's packages, which the environment's PYTHONPATH names, as in Lambda's image
                [sys.executable, "-S", "-m", "awslambdaric", handler],
                cwd=task_root,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        """What the function printed (its structured logs and EMF metrics, as CloudWatch Logs would get them)."""
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
