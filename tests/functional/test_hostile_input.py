"""Hostile and malformed input, as an adversary would send it: a clear, bounded error, and nothing done.

Each case is one that was confirmed against the product before it was fixed (issue 13).
"""

from __future__ import annotations

import copy
import json
import math
import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from random import Random
from typing import Any

import psutil
import pytest
from icebatch.control.reporter import SNS_MESSAGE_MAX, SnsNotifier, build_report, parse_detail
from icebatch.core.catalog import open_catalog
from icebatch.core.consumers import consumer_named, load_consumers
from icebatch.core.errors import InvalidEventError
from icebatch.core.ledger import open_ledger
from icebatch.core.ledger.results_table import results_schema
from icebatch.core.settings import Settings
from icebatch.core.untrusted import loads_strict, one_line, summarize
from icebatch.tools.invoke import invoke
from icebatch.tools.local_backend import LocalBackend
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets

from tests.support.aws import client
from tests.support.runs import run_once

pytestmark = pytest.mark.functional
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "eventbridge" / "examples"
MAX_REASON = 600  # no error message may grow with its input beyond this
CODE = f"{ROOT / 'functions'}:{ROOT / 'jobimage'}"  # this clone's code, in every process a test starts


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / "valid" / name).read_text())


def launcher(event: Any, settings: Settings) -> dict[str, Any]:
    return invoke("launcher", event, settings, logs_to_stderr=True)


def icebatch(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"ICEBATCH_HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONPATH": CODE}
    env.update({k: os.environ[k] for k in ("HOME",) if k in os.environ})
    return subprocess.run(
        [sys.executable, "-m", "icebatch.tools.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


# --------------------------------------------------------------------------------------------------
# launcher input
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "event",
    [
        {"action": "launch", "force": "yes"},
        {"action": "launch", "force": 1},
        {"action": "launch", "dry_run": "false"},
        {"action": "launch", "force": True, "consumer": "triage\n"},
        {"action": "launch", "force": True, "consumer": "../../x"},
        {"trigger": "schedule", "schedule": 7},
    ],
)
def test_flags_are_not_coerced_and_nothing_launches(event: dict[str, Any], settings: Settings) -> None:
    # given a launcher with a backlog (a valid forced invoke would launch a job)
    append_tickets(
        ensure_source_table(open_catalog(settings), settings.catalog.source_table), generate_tickets(5, Random(1))
    )
    # when the event's flags are strings, numbers or bad names
    result = launcher(event, settings)
    # then it is rejected: no decision, no job
    assert result["status"] == "rejected", result
    assert result["decisions"] == [] and not (settings.home / "jobs").exists()


def test_an_oversized_detail_type_gives_a_bounded_reason(settings: Settings) -> None:
    # given an EventBridge event whose detail-type is a megabyte
    event = {**example("batch-job-completed.json"), "detail-type": "x" * 1_000_000, "source": "aws.glue"}
    # when the launcher rejects it, then the reason quotes it only in summary
    result = launcher(event, settings)
    assert result["status"] == "rejected" and len(result["reason"]) < MAX_REASON
    assert "1,000,000 characters" in result["reason"]


def test_a_key_with_a_lone_surrogate_is_rejected_and_logged(settings: Settings, capfd: Any) -> None:
    # given an event whose key cannot be encoded as UTF-8
    result = launcher({"\ud800bad": 1}, settings)
    # then the rejection is logged (the log line could not be written before)
    assert result["status"] == "rejected" and "\\ud800" in result["reason"]
    assert "rejected event" in capfd.readouterr().err


def test_keys_that_are_not_strings_are_rejected_not_raised(settings: Settings) -> None:
    assert launcher({1: "x", "action": "launch"}, settings)["status"] == "rejected"
    assert invoke("reporter", {1: "x", "id": "a"}, settings)["status"] == "rejected"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"action": "launch", "force": false, "force": true}', "duplicate key 'force'"),
        (b"[" * 50_000 + b"]" * 50_000, "nested 50,000 levels deep"),
        (b'{"action": "launch", "note": "caf\xe9"}', "is not UTF-8 text"),
        (b'{"action": "launch", "n": NaN}', "NaN is not JSON"),
        (b"", "is not JSON"),
    ],
    ids=["duplicate-keys", "deep-nesting", "latin-1", "nan", "empty"],
)
def test_icebatch_invoke_answers_bad_files_with_one_line(tmp_path: Path, content: bytes, expected: str) -> None:
    # given an event file an adversary wrote
    path = tmp_path / "event.json"
    path.write_bytes(content)
    # when `icebatch invoke launcher` reads it
    done = icebatch(tmp_path / "home", "invoke", "launcher", "--event", str(path))
    # then it exits 2 with one bounded line that says what is wrong, and no traceback
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and len(lines[0]) < MAX_REASON, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_an_error_with_a_traceback_is_reported_in_one_line() -> None:
    # given the text of a Ray error: the worker's whole traceback, ending with the exception that started it
    text = (
        "The actor died because of an error raised in its creation task, httpx.ConnectError: no route\n\n"
        "ray::MapWorker.__init__() (pid=1, ip=10.0.0.1)\n"
        '  File "/x/hub.py", line 537, in cached_files\n    hf_hub_download(\n'
        "huggingface_hub.errors.LocalEntryNotFoundError: cannot find the requested files in the local cache\n\n"
    )
    # when it becomes a failure's reason, then it is one line: what happened, and what started it
    assert one_line(text) == (
        "The actor died because of an error raised in its creation task, httpx.ConnectError: no route ... "
        "huggingface_hub.errors.LocalEntryNotFoundError: cannot find the requested files in the local cache"
    )
    # and a one-line text is kept as it is, bounded
    assert one_line("stalled: no result") == "stalled: no result"
    assert one_line("x" * 5000, 100).endswith("(5,000 characters)")


def test_untrusted_text_is_summarized_printable_and_bounded() -> None:
    assert summarize("a" * 10_000).endswith("... (10,000 characters)") and len(summarize("a" * 10_000)) < 160
    assert summarize("line\nbreak\x00\ud800") == "line\\nbreak\\x00\\ud800"
    assert summarize({"deep": [1]}) == "<dict of 1>"
    with pytest.raises(InvalidEventError, match="duplicate key"):
        loads_strict('{"a": 1, "a": 2}')


# --------------------------------------------------------------------------------------------------
# reporter input
# --------------------------------------------------------------------------------------------------
def _completed(**changes: Any) -> dict[str, Any]:
    event = copy.deepcopy(example("batch-job-completed.json"))
    event["detail"].update(changes)
    return event


@pytest.mark.parametrize(
    "changes",
    [
        {"run_id": "../../../x"},
        {"run_id": "a/b"},
        {"run_id": "r" * 300},
        {"rows_ok": 999_999},
        {"rows": "2200"},
        {"consumer": "triage\nSubject: forged"},
        {"rows_by_status": {"ok": 1}},
    ],
    ids=["dot-dot", "slash", "300-chars", "rows-ok-above-rows", "rows-as-text", "newline", "statuses-not-rows"],
)
def test_inconsistent_or_unsafe_completions_are_rejected(changes: dict[str, Any], settings: Settings) -> None:
    # given a completion event with an unsafe identifier or figures that contradict each other
    # when the reporter receives it
    result = invoke("reporter", _completed(**changes), settings)
    # then it is rejected, with a bounded reason, and no report file is written anywhere
    assert result["status"] == "rejected", result
    assert len(result["reason"]) < MAX_REASON
    assert not (settings.home / "reports").exists()
    assert not list(settings.home.parent.rglob("*.completed.*"))


@pytest.mark.parametrize("cost", [math.inf, math.nan, -5.0])
def test_costs_that_are_not_finite_and_positive_are_rejected(cost: float, settings: Settings) -> None:
    event = _completed()
    event["detail"]["cost"] = {**event["detail"]["cost"], "lifetime_cost": cost}
    assert invoke("reporter", event, settings)["status"] == "rejected"


def test_an_event_id_that_is_a_path_is_rejected(settings: Settings) -> None:
    # given a failure without a run id (its report is filed by the event id) whose id is a path
    event = copy.deepcopy(example("batch-job-failed.json"))
    event["detail"].pop("run_id", None)
    event["id"] = "../../outside"
    assert invoke("reporter", event, settings)["status"] == "rejected"
    assert not (settings.home.parent / "outside.failed.txt").exists()


def test_a_huge_failure_reason_is_cut_to_fit_sns_and_delivered(aws_endpoint: str) -> None:
    # given a failure whose reason is 400 kB (an exception that printed a whole batch)
    event = copy.deepcopy(example("batch-job-failed.json"))
    event["detail"]["reason"] = "boom " * 80_000
    report = build_report(parse_detail(event), event_id=event["id"])
    sns, sqs = client("sns", aws_endpoint), client("sqs", aws_endpoint)
    topic = sns.create_topic(Name="hostile-reports")["TopicArn"]
    url = sqs.create_queue(QueueName="hostile-reports")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    # when it is published to SNS (moto enforces SNS's 256 KB limit, as SNS does)
    SnsNotifier(sns, topic).notify(report)
    # then it is delivered (not retried until dead-lettered), cut to fit, and says so
    [message] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"]
    notification = json.loads(message["Body"])
    delivered = json.loads(notification["Message"])
    assert delivered["reason_cut"] is True and "cut to fit SNS" in delivered["reason"]
    assert len(message["Body"].encode()) < SNS_MESSAGE_MAX


def test_a_report_with_a_control_character_in_its_subject_is_sent_clean(aws_endpoint: str) -> None:
    from icebatch.control.reporter import sns_subject

    assert sns_subject("icebatch triage:\nFAILED\x07") == "icebatch triage:?FAILED?"
    assert len(sns_subject("x" * 500)) == 100


# --------------------------------------------------------------------------------------------------
# the job
# --------------------------------------------------------------------------------------------------
def test_a_range_already_covered_is_a_no_op_not_a_failure(tmp_path: Path) -> None:
    # given a table with tickets and a watermark already at its current snapshot (an operator reset)
    home = tmp_path / "home"
    settings = Settings(home=home)
    source = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    append_tickets(source, generate_tickets(20, Random(1)))
    ledger = open_ledger(settings, consumer_named(load_consumers(settings), "triage"))
    ledger.ensure_results_table(results_schema(ledger.consumer.task))
    ledger.reset(ledger.source().metadata.current_snapshot_id, reason="test")
    # when a job launched before the reset (expecting no watermark) starts
    run = icebatch(home, "job", "run", "--consumer", "triage", "--from-snapshot", "none", "--json")
    # then it exits 5, says why, and reports no failure
    assert run.returncode == 5, run.stderr[-2000:]
    assert json.loads(run.stdout)["status"] == "conflict"
    events = home / "events.jsonl"
    assert not events.exists() or "Batch Job Failed" not in events.read_text()


def test_a_run_that_loses_its_range_part_way_is_a_no_op_not_a_failure(tmp_path: Path) -> None:
    from icebatch.core.bus import load_publisher
    from icebatch.core.errors import WatermarkConflictError
    from icebatch_job.job import JobRequest, JobRun, conflicted

    # given a job part way through its range (planned, its pipeline running) ...
    settings = Settings(home=tmp_path / "home")
    source = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    append_tickets(source, generate_tickets(20, Random(1)))
    consumer = consumer_named(load_consumers(settings), "triage")
    ledger = open_ledger(settings, consumer)
    said: list[str] = []
    run = JobRun(settings, consumer, JobRequest(), load_publisher(settings), said.append, ledger)
    run.plan = ledger.plan()
    # ... when its first commit finds that another run moved the ledger first (its compare-and-set lost)
    winner = run_once(ledger)
    assert winner is not None
    lost = WatermarkConflictError(
        f"run {run.plan.run_id} planned from watermark none but run {winner.plan.run_id} "
        "moved the ledger first; this chunk's 20 result rows were discarded"
    )
    result = conflicted(run, lost)
    # then it ends as a conflict (exit 5) with a line naming the run that covered it, and reports no failure
    assert result.status == "conflict" and result.failed is None
    assert any(winner.plan.run_id in line for line in said), said
    events = settings.home / "events.jsonl"
    assert not events.exists() or "Batch Job Failed" not in events.read_text()


def test_a_run_id_that_is_a_path_is_refused_by_the_job(tmp_path: Path) -> None:
    run = icebatch(tmp_path / "home", "job", "run", "--run-id", "../x")
    assert run.returncode == 2 and "is not a run id" in run.stderr


# --------------------------------------------------------------------------------------------------
# local job records: a RUNNING record must never outlive its job
# --------------------------------------------------------------------------------------------------
def _record(settings: Settings, name: str, **fields: Any) -> None:
    jobs = settings.home / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    record = {
        "name": name,
        "deployment": "local",
        "consumer": "triage",
        "attempt": 1,
        "status": "RUNNING",
        "mode": "inprocess",
        "pid": os.getpid(),
        "start_time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **fields,
    }
    (jobs / f"{name}.json").write_text(json.dumps(record))


def _listed(settings: Settings) -> dict[str, Any]:
    return {j.name: j for j in LocalBackend(settings).list_jobs("local")}


def test_a_running_record_whose_pid_now_names_another_process_is_failed(settings: Settings) -> None:
    # given a RUNNING in-process record whose pid is alive but started at another time (a reused pid)
    _record(settings, "ib-reused", pid_started="1")
    # when the launcher lists jobs, then the record is failed, not active: the consumer is not blocked
    job = _listed(settings)["ib-reused"]
    assert job.terminal and job.failed and job.reason == "ProcessDied"


def test_a_record_older_than_the_job_deadline_expires(settings: Settings) -> None:
    # given a RUNNING record (its owner alive) that started longer ago than the job deadline
    _record(settings, "ib-old", start_time="2020-01-01T00:00:00Z")
    job = _listed(settings)["ib-old"]
    assert job.failed and job.reason == "DeadlineExceeded"
    # and a fresh one stays active
    _record(settings, "ib-fresh")
    assert not _listed(settings)["ib-fresh"].terminal


def test_a_ray_jobs_record_whose_cluster_is_gone_is_failed(settings: Settings) -> None:
    # given a record of a job submitted to a Ray cluster that no longer listens
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = settings.with_overrides(ray_address=f"http://127.0.0.1:{port}")
    _record(gone, "ib-ray", mode="ray-jobs")
    # when the launcher lists jobs (in either mode), then the job is gone with its cluster
    job = _listed(gone)["ib-ray"]
    assert job.failed and job.reason == "ClusterGone"


def test_runs_after_the_first_leave_no_orphan_metadata_file(settings: Settings) -> None:
    # given a results table made by a first run
    source = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    ledger = open_ledger(settings, consumer_named(load_consumers(settings), "triage"))
    for seed in (1, 2, 3):
        # when more rows arrive and further runs commit
        append_tickets(source, generate_tickets(5, Random(seed)))
        assert run_once(ledger) is not None
    # then every metadata file of the results table is one the table's history names
    table = ledger.results()
    assert table is not None
    known = {Path(e.metadata_file).name for e in table.metadata.metadata_log} | {Path(table.metadata_location).name}
    folder = Path(table.metadata_location.removeprefix("file://")).parent
    files = {p.name for p in folder.glob("*.metadata.json")}
    assert files == known, f"orphans: {sorted(files - known)}"


def test_what_a_killed_job_started_is_killed_by_its_watchdog() -> None:
    # given a process that starts the watchdog, then a child with a grandchild (as Ray starts its workers)
    script = (
        "import os, signal, subprocess, sys, time\n"
        "from icebatch_job.local.reaper import start_reaper\n"
        "start_reaper()\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        '\'import subprocess, time; subprocess.Popen(["sleep", "300"]); time.sleep(300)\'])\n'
        "time.sleep(2.5)\n"  # the watchdog has seen them (it looks once a second)
        "print(child.pid, flush=True)\n"
        "sys.stdin.readline()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": CODE},
    )
    assert proc.stdin is not None and proc.stdout is not None
    child = psutil.Process(int(proc.stdout.readline()))
    deadline = time.monotonic() + 30  # the child's own start (its grandchild) may be slow on a loaded machine
    while not child.children(recursive=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    family = [child, *child.children(recursive=True)]
    assert len(family) == 2
    # when the process is killed without notice
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.wait(30) == -9
    # then its child and grandchild are gone within seconds
    _, alive = psutil.wait_procs(family, timeout=10)
    for p in alive:
        p.kill()
    assert alive == []
