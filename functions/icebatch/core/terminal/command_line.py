"""What both command lines (``icebatch`` and ``python -m icebatch_job``) promise, kept in one place.

- Options are taken only as written: no abbreviations (argparse would take `--js` for `--json` and
  `--dry` for `--dry-run`, and a later option could make an abbreviation mean something else).
- A command that fails says why in one line on stderr and exits with the status of
  ``icebatch.core.errors`` (a wrong command line: its usage too, status 2). With ``--json`` it also prints
  one JSON document on stdout, ``{"error": {"exit_status": ..., "type": ..., "message": ...}}``: stdout is
  exactly one JSON document whether the command succeeded or not, so a script reading it can tell a
  failure from empty output.
- A module of an extra that is not installed (``launch`` without the ``lambda`` extra, a job without ``local``)
  is one line naming the extra to install, status 2, not a traceback (``missing_extra``).
- A reader that goes away (``icebatch ledger runs | head -1``) ends the command quietly with status 141, as
  a command killed by SIGPIPE ends; a broken pipe anywhere else (a socket, a child) is an error as any other.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from icebatch.core.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_PERMANENT,
    IcebatchError,
    PermanentError,
    exit_status,
)
from icebatch.core.terminal.json_stdout import document_stream
from icebatch.core.untrusted import summarize

JSON_FLAG = "--json"
# the top-level module a feature imports -> the extra of pyproject.toml that installs it
EXTRAS = {
    "aws_lambda_powertools": "lambda",
    "kubernetes": "lambda",
    "boto3": "lambda",
    "pyarrow": "job",
    "ray": "job",
    "psutil": "job",
    "sqlalchemy": "job",
    "vllm": "local",
    "torch": "local",
    "transformers": "local",
    "tokenizers": "local",
}
CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # torch's CPU build and the torchvision built for it
MAX_MESSAGE = 2000


class UsageError(PermanentError):
    """The command line itself is wrong: an unknown option, a missing or malformed value."""

    def __init__(self, prog: str, usage: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog
        self.usage = usage


class StrictParser(argparse.ArgumentParser):
    """argparse without abbreviated options, its errors raised as ``UsageError`` (sub-commands inherit both)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, self.format_usage(), message)


class MissingExtraError(PermanentError):
    """What the command needs is in an extra of the package that is not installed."""


def missing_extra(error: BaseException) -> MissingExtraError | None:
    """The error to report for a module an extra would have installed (None: not one of them)."""
    name = ""
    if isinstance(error, ModuleNotFoundError):
        name = (error.name or "").split(".")[0]
    elif type(error).__name__ == "NotInstalledError" and "SQLAlchemy" in str(error):  # pyiceberg's SQL catalog
        name = "sqlalchemy"
    extra = EXTRAS.get(name)
    if extra is None:
        return None
    where = f" --extra-index-url {CPU_INDEX} (a GPU node's image: icebatch[gpu])" if extra == "local" else ""
    return MissingExtraError(
        f"this needs {name}, which the {extra!r} extra installs: pip install 'icebatch[{extra}]'{where}"
    )


def error_document(error: BaseException, status: int) -> dict[str, Any]:
    """The one JSON document a failed ``--json`` command prints: its status, the error's type, the message."""
    message = summarize(str(error), MAX_MESSAGE)
    return {"error": {"exit_status": status, "type": type(error).__name__, "message": message}}


def json_wanted(argv: Sequence[str] | None, args: argparse.Namespace | None) -> bool:
    """Whether the command was asked for ``--json``: from its arguments once parsed, else as written."""
    if args is not None:
        return getattr(args, "json", False) is True
    words = sys.argv[1:] if argv is None else argv
    return JSON_FLAG in words[: words.index("--")] if "--" in words else JSON_FLAG in words


def fail(program: str, error: BaseException, *, as_json: bool, status: int | None = None) -> int:
    """End a command on ``error``: one line on stderr (usage first for a wrong command line), the JSON
    error document on stdout when ``as_json``; returns the exit status. A caller that gives ``status``
    knows the error better than its class does: the line is then the error's own text, unprefixed."""
    if isinstance(error, UsageError):
        sys.stderr.write(error.usage)
        print(f"{error.prog}: error: {error}", file=sys.stderr)
        status = EXIT_PERMANENT
    elif isinstance(error, (IcebatchError, KeyboardInterrupt)):
        if status is None:
            status, prefix = exit_status(error)
            print(f"{program}: {prefix}: {error}" if str(error) else f"{program}: {prefix}", file=sys.stderr)
        else:
            print(f"{program}: {error}", file=sys.stderr)
    else:  # a bug: the traceback is what helps (its lines bounded and printable too)
        for line in "".join(traceback.format_exception(error)).splitlines():
            print(summarize(line, MAX_MESSAGE), file=sys.stderr)
        status = EXIT_FAILED
    if as_json:
        print(json.dumps(error_document(error, status), sort_keys=True), file=document_stream(), flush=True)
    sys.stderr.flush()
    return status


def run_cli(
    program: str,
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    body: Callable[[argparse.Namespace], int],
    status_of: Callable[[BaseException], int | None] = lambda _error: None,
) -> int:
    """Parse ``argv`` and run ``body``; a failure ends as ``fail`` says (``status_of``: a caller's own
    status for an error it knows better). A bug still raises (Python's traceback), unless ``--json``."""
    args = None
    try:
        args = parser.parse_args(argv)
        return body(args)
    except Exception as e:
        if (missing := missing_extra(e)) is not None:
            return fail(program, missing, as_json=json_wanted(argv, args))
        if isinstance(e, BrokenPipeError) and _stdout_reader_gone():
            # what is still buffered can go nowhere: without this, the interpreter's last flush fails too
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        as_json = json_wanted(argv, args)
        if not (as_json or isinstance(e, IcebatchError)):
            raise
        return fail(program, e, as_json=as_json, status=status_of(e))
    except KeyboardInterrupt as e:
        return fail(program, e, as_json=json_wanted(argv, args), status=status_of(e))


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end is closed (the kernel reports an error condition on it)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLERR)
        return any(events & select.POLLERR for _fd, events in poller.poll(0))
    except (OSError, ValueError):  # no descriptor (stdout replaced or closed)
        return False


@contextmanager
def quiet_handler_records(log_level: str) -> Iterator[None]:
    """While a command runs on this machine, the Lambda handlers it calls in-process (the local reporter after
    a job, the launcher behind `icebatch launch` and `invoke`) keep their JSON records to themselves unless
    asked (``-v``, ICEBATCH_LOG_LEVEL=DEBUG): on a terminal they fell between the command's own lines. Their
    warnings and errors still show; an explicit POWERTOOLS_LOG_LEVEL wins; Lambda is untouched. The variable is
    put back afterwards (a test calling the command line in-process leaves nothing behind)."""
    key, before = "POWERTOOLS_LOG_LEVEL", os.environ.get("POWERTOOLS_LOG_LEVEL")
    if log_level.upper() != "DEBUG" and before is None:
        os.environ[key] = "WARNING"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
