"""Calling the Lambda handlers on this machine, as `sam local invoke -e FILE` would (without Docker)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icebatch.core.errors import InvalidEventError
from icebatch.core.settings import Settings
from icebatch.core.untrusted import MAX_EVENT_BYTES, loads_strict, summarize

HANDLERS = {
    "launcher": "icebatch.control.handlers.launcher",
    "reporter": "icebatch.control.handlers.reporter",
}


@dataclass
class LocalContext:
    """The attributes of a Lambda context that Powertools reads."""

    function_name: str
    memory_limit_in_mb: int = 512
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    function_version: str = "$LATEST"
    log_group_name: str = "/aws/lambda/local"
    log_stream_name: str = "local"

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:local:000000000000:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return 900_000


def load_event(path: Path) -> Any:
    """An event file, parsed strictly (UTF-8, no duplicate keys, bounded size and depth)."""
    try:
        with path.open("rb") as f:  # at most one byte past the limit: /dev/zero or a pipe cannot fill memory
            data = f.read(MAX_EVENT_BYTES + 1)
    except FileNotFoundError as e:
        raise InvalidEventError(f"event file {summarize(str(path))} does not exist") from e
    except OSError as e:
        raise InvalidEventError(f"event file {summarize(str(path))} cannot be read: {e.strerror}") from e
    if len(data) > MAX_EVENT_BYTES:
        raise InvalidEventError(
            f"event file {summarize(str(path))} holds more than {MAX_EVENT_BYTES:,} bytes; events are at most that"
        )
    return loads_strict(data, what=f"event file {summarize(str(path))}")


def invoke(function: str, event: Any, settings: Settings, *, logs_to_stderr: bool = False) -> dict[str, Any]:
    """Run a handler with an event, a local context and these settings; returns the handler's response.

    ``logs_to_stderr`` (the CLI and the local bus) sends the handler's structured logs to stderr and
    leaves out the CloudWatch EMF metric lines, so that stdout carries only what the command prints.
    The launcher's decisions are also kept under the home (``icebatch.tools.decision_log``).
    """
    from icebatch.tools.decision_log import record_decisions

    response = _invoke(function, event, settings, logs_to_stderr=logs_to_stderr)
    if function == "launcher":
        record_decisions(settings.home, response)
    return response


def _invoke(function: str, event: Any, settings: Settings, *, logs_to_stderr: bool) -> dict[str, Any]:
    import importlib
    import os
    import sys

    # what template.yaml gives every function (the stack's namespace there)
    os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "icebatch")
    module = importlib.import_module(HANDLERS[function])
    context = LocalContext(function_name=f"icebatch-{function}")
    if not logs_to_stderr:
        with lambda_log_records():
            result: dict[str, Any] = module.lambda_handler(event, context, settings=settings)
        return result
    handler = getattr(getattr(module, "logger", None), "registered_handler", None)
    if handler is not None and hasattr(handler, "setStream"):
        try:
            handler.setStream(sys.stderr)
        except ValueError:  # the stream it had is closed (an earlier caller's capture): replace it unflushed
            handler.stream = sys.stderr
    previous = os.environ.get("POWERTOOLS_METRICS_DISABLED")
    os.environ["POWERTOOLS_METRICS_DISABLED"] = "true"
    try:
        with lambda_log_records():
            result = module.lambda_handler(event, context, settings=settings)
    finally:
        if previous is None:
            os.environ.pop("POWERTOOLS_METRICS_DISABLED", None)
        else:
            os.environ["POWERTOOLS_METRICS_DISABLED"] = previous
    return result


@contextmanager
def lambda_log_records() -> Iterator[None]:
    """The handler's log records made as in a Lambda function, where no Ray is: in a process that imported
    Ray (the local job, whose event bus calls the reporter in-process) Ray's record factory tags every
    record, and the handlers' JSON logs would carry its ``_ray_timestamp_ns``."""
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(logging.LogRecord)
    try:
        yield
    finally:
        logging.setLogRecordFactory(factory)
