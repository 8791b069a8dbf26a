"""Command-line arguments are taken only as written plainly: no lenient coercion, bounded where they are recorded.

Both parsers users type into: ``icebatch`` (the CLI) and ``python -m icebatch_job`` (the RayJob's entrypoint).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import pytest
from icebatch.control.rayjob import job_name
from icebatch.tools.cli import build_parser as icebatch_parser
from icebatch.tools.cli import main as icebatch_main
from icebatch_job.cli import build_parser as job_parser
from icebatch_job.cli import main as job_main

pytestmark = pytest.mark.unit


def _refused(main: Callable[[Sequence[str]], int], argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The command's stderr, once it refused ``argv`` as a user typing it would see: status 2, its usage."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.startswith("usage: ")
    # stdout: nothing, or with --json the one document that says so
    assert out == "" if "--json" not in argv else json.loads(out)["error"]["type"] == "UsageError"
    return err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # other scripts' digits (int("\u0663") == 3), superscripts, signs, spaces, underscores, exponents
        (["generate", "--tickets", "\u0663"], "is not a whole number from 1 to 10000000"),
        (["generate", "--tickets", "\u00b2"], "is not a whole number from 1 to 10000000"),
        (["generate", "--tickets", "+5"], "is not a whole number"),
        (["generate", "--tickets", " 5"], "is not a whole number"),
        (["generate", "--tickets", "1_000"], "is not a whole number"),
        (["generate", "--tickets", "1e3"], "is not a whole number"),
        # `--interval inf`, `nan` or `-1` crashed with a traceback after appending the first batch
        (["generate", "--tickets", "5", "--interval", "inf"], "'inf' is not a number of seconds from 0 to 86400"),
        (["generate", "--tickets", "5", "--interval", "nan"], "'nan' is not a number of seconds"),
        (["generate", "--tickets", "5", "--interval", "-1"], "'-1' is not a number of seconds"),
        (["generate", "--tickets", "5", "--interval", "1e3"], "'1e3' is not a number of seconds"),
        (["ledger", "reset", "--to-snapshot", "\u0663\u0663", "--reason", "x"], "is not a snapshot id"),
        (["ledger", "reset", "--to-snapshot", str(2**63), "--reason", "x"], "is not a snapshot id"),
        # the reason is written into the ledger's snapshot summary
        (["ledger", "reset", "--to-snapshot", "none", "--reason", ""], "give 1 to 500 printable characters"),
        (["ledger", "reset", "--to-snapshot", "none", "--reason", "x" * 501], "give 1 to 500 printable characters"),
        (["ledger", "reset", "--to-snapshot", "none", "--reason", "a\nb"], "give 1 to 500 printable characters"),
        # options are not abbreviated: `--js` was taken for `--json`, `--dry` for `--dry-run`, `--for` for `--force`
        (["backlog", "--js"], "unrecognized arguments: --js"),
        (["launch", "--dry"], "unrecognized arguments: --dry"),
        (["launch", "--for"], "unrecognized arguments: --for"),
        (["ledger", "reset", "--to", "none", "--reason", "x"], "the following arguments are required: --to-snapshot"),
        # one output form: --json promises one JSON document, --markdown is not one
        (["config", "--json", "--markdown"], "argument --markdown: not allowed with argument --json"),
    ],
)
def test_the_cli_refuses_what_is_not_written_plainly(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in _refused(icebatch_main, argv, capsys)


def test_the_cli_takes_what_is_written_plainly() -> None:
    args = icebatch_parser().parse_args(["generate", "--tickets", "5", "--interval", "0.25"])
    assert (args.tickets, args.interval) == (5, 0.25)
    args = icebatch_parser().parse_args(["ledger", "reset", "--to-snapshot", str(2**63 - 1), "--reason", "skip it"])
    assert (args.to_snapshot, args.reason) == (str(2**63 - 1), "skip it")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--to-snapshot", "\u0663"], "is not a snapshot id"),
        (["run", "--to-snapshot", "9" * 20], "is not a snapshot id"),
        (["run", "--from-snapshot", "-1"], "is not a snapshot id"),
        (["run", "--limit", "\u0663"], "is not a whole number from 1 to 10^12"),
        (["run", "--limit", "0"], "is not a whole number from 1 to 10^12"),
        # the RayJob's name goes into the run's completion event, built after the last commit
        (["run", "--rayjob-name", "x" * 300], "is not a Kubernetes object name"),
        (["run", "--rayjob-name", "Job\nName"], "is not a Kubernetes object name"),
        (["run", "--lim", "5"], "unrecognized arguments: --lim 5"),
        # another consumer's run a shared job takes: its name, or its pinned range as the launcher writes it
        (["run", "--with", "Privacy"], "is not a consumer's name, or NAME:RUN_ID:FROM:TO"),
        (["run", "--with", "privacy:r1"], "is not a consumer's name, or NAME:RUN_ID:FROM:TO"),
        (["run", "--with", "privacy:r1:none:none"], "TO is a snapshot id"),
        (["run", "--with", "privacy:r1:x:5"], "is not a snapshot id"),
        (["run", "--with", "privacy:r 1:none:5"], "is not a run id"),
        (["run", "--with", "privacy:r1:1:5:6"], "is not a consumer's name, or NAME:RUN_ID:FROM:TO"),
    ],
)
def test_the_job_refuses_what_is_not_written_plainly(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in _refused(job_main, argv, capsys)


def test_the_job_takes_what_the_launcher_passes() -> None:
    # given the arguments a RayJob's entrypoint carries (the longest consumer name, a late attempt)
    name = job_name("c" * 20, "3fa9c2d1e0", 99)
    argv = ["run", "--run-id", "triage-20261129T073000-3fa9c2", "--from-snapshot", "none"]
    argv += ["--to-snapshot", str(2**63 - 1), "--rayjob-name", name, "--limit", "1000000000000"]
    # when the job parses them, then each is taken as given
    args = job_parser().parse_args(argv)
    assert (args.from_snapshot, args.to_snapshot, args.rayjob_name, args.limit) == (None, 2**63 - 1, name, 10**12)


def test_the_job_takes_the_runs_a_shared_job_is_given() -> None:
    args = job_parser().parse_args(["run", "--consumer", "triage", "--with", "privacy", "--with", "b:b-1:none:7"])
    assert [(r.consumer, r.run_id, r.from_snapshot, r.to_snapshot) for r in args.shared_with] == [
        ("privacy", None, "watermark", None),
        ("b", "b-1", None, 7),
    ]
