"""An AWS endpoint that fails the way a real one can: SNS throttling or refusing every request, or any service
reading a request and never answering."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.http_server import QuietHandler, serving

THROTTLED = (
    b'<ErrorResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><Error><Type>Sender</Type>'
    b"<Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>r-1</RequestId></ErrorResponse>"
)


UNAUTHORIZED = (
    b'<ErrorResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><Error><Type>Sender</Type>'
    b"<Code>AuthorizationError</Code><Message>User: arn:aws:sts::123456789012:assumed-role/reporter/f is not "
    b"authorized to perform: SNS:Publish on resource: arn:aws:sns:us-east-1:123456789012:reports</Message></Error>"
    b"<RequestId>r-2</RequestId></ErrorResponse>"
)


@contextmanager
def failing_endpoint(mode: str) -> Iterator[tuple[str, dict[str, int]]]:
    """``throttle``: answer every request with SNS's 400 Throttling (query protocol); ``unauthorized``: with SNS's
    403 AuthorizationError, as to a role without the grant; ``silent``: read it, answer nothing until the server
    closes. Yields the endpoint and the count of requests received."""
    counts = {"requests": 0}
    closing = threading.Event()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            counts["requests"] += 1
            if mode == "silent":
                closing.wait()
                return
            status, body = (403, UNAUTHORIZED) if mode == "unauthorized" else (400, THROTTLED)
            self.send_response(status)
            self.send_header("Content-Type", "text/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST  # REST APIs (EKS's DescribeCluster) read with GET

    with serving(Handler) as url:
        try:
            yield url, counts
        finally:
            closing.set()  # before the server stops: it waits for its requests
