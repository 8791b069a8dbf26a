"""Events out of the job, into EventBridge, through the reporter, out of SNS: all over HTTP (moto).

Also the nightly reconciliation of jobs that died without an event, against the RayJob API server.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from icebatch.core import aws_clients
from icebatch.core.bus import EventBridgePublisher, load_publisher
from icebatch.core.catalog import open_catalog
from icebatch.core.errors import RefusedError, TransientError
from icebatch.core.events import BatchJobCompleted, BatchJobFailed
from icebatch.core.ledger import open_ledger
from icebatch.core.rules import PATTERNS, fill
from icebatch.core.settings import Settings
from icebatch.tools.invoke import invoke
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets
from icebatch_job.job import publish

from tests.support.aws import REGION, client
from tests.support.consumers import consumers_file, triage
from tests.support.emf import metric_names
from tests.support.failing_aws import failing_endpoint
from tests.support.k8s_api import RayJobApi, sts_token_verifier
from tests.support.runs import Crash, dies_after, run_once

pytestmark = pytest.mark.functional
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "eventbridge" / "examples"
CODE = f"{ROOT / 'functions'}:{ROOT / 'jobimage'}"  # this clone's code, in every process a test starts


def example(name: str, kind: str = "valid") -> dict[str, Any]:
    return json.loads((EXAMPLES / kind / name).read_text())


def queue(endpoint: str) -> tuple[str, str]:
    sqs = client("sqs", endpoint)
    url = sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return url, arn


def bus_with_reporter_rule(endpoint: str, deployment: str = "icebatch-prod") -> tuple[Any, str, str]:
    """A fresh EventBridge bus whose reporter rule (the pattern from eventbridge/) targets a new queue."""
    events = client("events", endpoint)
    bus = f"icebatch-{uuid.uuid4().hex[:6]}"
    events.create_event_bus(Name=bus)
    url, arn = queue(endpoint)
    pattern = fill(PATTERNS["reporter"], {"AWS::StackName": deployment})
    events.put_rule(Name="reporter", EventBusName=bus, EventPattern=json.dumps(pattern))
    events.put_targets(Rule="reporter", EventBusName=bus, Targets=[{"Id": "q", "Arn": arn}])
    return events, bus, url


def drain(endpoint: str, url: str, expect: int | None = None) -> list[dict[str, Any]]:
    sqs = client("sqs", endpoint)
    out: list[dict[str, Any]] = []
    for _ in range(6):
        got = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, MessageAttributeNames=["All"]
        ).get("Messages", [])
        out += got
        for m in got:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        if not got and (expect is None or len(out) >= expect):
            break
    return out


@pytest.fixture
def sns_to_sqs(aws_endpoint: str) -> tuple[str, str]:
    sns = client("sns", aws_endpoint)
    topic = sns.create_topic(Name=f"icebatch-reports-{uuid.uuid4().hex[:6]}")["TopicArn"]
    url, arn = queue(aws_endpoint)
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    return topic, url


@pytest.fixture
def idempotency_table(aws_endpoint: str) -> str:
    name = f"icebatch-idempotency-{uuid.uuid4().hex[:6]}"
    client("dynamodb", aws_endpoint).create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


@pytest.fixture
def aws_settings(
    settings: Settings, aws_endpoint: str, sns_to_sqs: tuple[str, str], idempotency_table: str
) -> Settings:
    s = settings.with_overrides(
        sns_topic_arn=sns_to_sqs[0],
        idempotency_table=idempotency_table,
        aws_endpoint_url=aws_endpoint,
        aws_region=REGION,
    )
    return s


# --------------------------------------------------------------------------------------------------
def test_put_events_reaches_the_reporter_rule(aws_endpoint: str) -> None:
    # given a bus with the reporter's rule, targeting a queue
    events, bus, url = bus_with_reporter_rule(aws_endpoint)
    # when the job's publisher emits a completion event (and an unrelated event goes by)
    detail = BatchJobCompleted.model_validate(example("batch-job-completed.json")["detail"])
    publisher = EventBridgePublisher(events, bus)
    event_id = publisher.publish(detail)
    events.put_events(
        Entries=[{"Source": "icebatch", "DetailType": "Launch Skipped", "Detail": "{}", "EventBusName": bus}]
    )
    # then exactly the completion event arrives, and it matches the checked-in schema
    [message] = drain(aws_endpoint, url, expect=1)
    delivered = json.loads(message["Body"])
    assert delivered["id"] == event_id and delivered["detail-type"] == "Batch Job Completed"
    schema = json.loads((ROOT / "eventbridge/schemas/batch-job-completed.v1.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(delivered["detail"])
    assert BatchJobCompleted.model_validate(delivered["detail"]) == detail


def test_reporter_publishes_text_and_json_with_attributes(
    aws_settings: Settings, aws_endpoint: str, sns_to_sqs: tuple[str, str]
) -> None:
    result = invoke("reporter", example("batch-job-completed.json"), aws_settings)
    assert result["status"] == "reported" and result["subject"] == "icebatch triage: 2,200 tickets, $0.1489 (13 not ok)"
    [message] = drain(aws_endpoint, sns_to_sqs[1], expect=1)
    notification = json.loads(message["Body"])
    assert notification["Subject"] == result["subject"]
    report = json.loads(notification["Message"])  # the "sqs" form: JSON for machines
    assert report["run_id"] == "triage-20261129T020005-4f1c2a" and report["cost"]["usd_per_1k_rows"] > 0
    # and the run's tokens priced at the default batch APIs, beside the GPU's cost
    assert set(report["batch_api_usd"]) == {p.name for p in aws_settings.cost.batch_prices()} != set()
    assert all(usd > 0 for usd in report["batch_api_usd"].values())
    attributes = notification["MessageAttributes"]
    assert attributes["consumer"] == {"Type": "String", "Value": "triage"}
    assert attributes["status"]["Value"] == "completed" and attributes["cost_usd"]["Type"] == "Number"
    assert float(attributes["rows"]["Value"]) == 2200


def test_the_same_event_delivered_twice_makes_one_report(
    aws_settings: Settings, aws_endpoint: str, sns_to_sqs: tuple[str, str]
) -> None:
    event = example("batch-job-completed.json")
    first = invoke("reporter", event, aws_settings)
    second = invoke("reporter", event, aws_settings)
    assert first == second  # the stored result of the first delivery
    assert len(drain(aws_endpoint, sns_to_sqs[1])) == 1


def test_a_failure_reported_by_the_job_and_by_reconciliation_makes_one_alert(
    aws_settings: Settings, aws_endpoint: str, sns_to_sqs: tuple[str, str]
) -> None:
    by_job = example("batch-job-failed.json")
    by_reconciler = json.loads(json.dumps(by_job))
    by_reconciler["id"] = str(uuid.uuid4())
    by_reconciler["detail"].update(origin="reconciler", stage="cluster")
    assert invoke("reporter", by_job, aws_settings)["report_status"] == "failed"
    invoke("reporter", by_reconciler, aws_settings)
    [message] = drain(aws_endpoint, sns_to_sqs[1], expect=1)
    assert "FAILED (OutOfMemoryError)" in json.loads(message["Body"])["Subject"]


@pytest.mark.parametrize("name", sorted(p.name for p in (EXAMPLES / "invalid").glob("*.json")))
def test_malformed_events_are_rejected_and_report_nothing(
    name: str, aws_settings: Settings, aws_endpoint: str, sns_to_sqs: tuple[str, str]
) -> None:
    result = invoke("reporter", example(name, "invalid"), aws_settings)
    assert result["status"] == "rejected" and result["reason"]
    assert drain(aws_endpoint, sns_to_sqs[1]) == []


def test_events_for_other_detail_types_are_rejected(aws_settings: Settings) -> None:
    result = invoke("reporter", example("batch-job-submitted.json"), aws_settings)
    assert result["status"] == "rejected" and "check the rule's event pattern" in result["reason"]
    assert invoke("reporter", ["not", "an", "event"], aws_settings)["status"] == "rejected"


# --------------------------------------------------------------------------------------------------
# reconciliation
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def k8s(aws_endpoint: str) -> Iterator[RayJobApi]:
    api = RayJobApi(verify_token=sts_token_verifier("icebatch-test", aws_endpoint))
    api.url = api.start()  # type: ignore[attr-defined]
    yield api
    api.stop()


def kuberay_reporting(settings: Settings, aws_endpoint: str, k8s: RayJobApi) -> tuple[Settings, str]:
    """A kuberay launcher (the triage consumer alone) whose bus's reporter rule feeds a queue: (settings, queue)."""
    _, bus, url = bus_with_reporter_rule(aws_endpoint, deployment="icebatch-prod")
    s = settings.with_overrides(
        backend="kuberay",
        eks_cluster="icebatch-test",
        k8s_api_server=k8s.url,  # type: ignore[attr-defined]
        aws_endpoint_url=aws_endpoint,
        aws_region=REGION,
        event_bus=bus,
        finished_job_retention_seconds=3600,
        deployment="icebatch-prod",
        consumers_file=consumers_file(settings.home / "c", {"name": "triage"}),
    )
    return s, url


def test_a_silently_failed_rayjob_is_reported_once_and_later_deleted(
    settings: Settings, aws_endpoint: str, k8s: RayJobApi
) -> None:
    # given an EventBridge bus whose reporter rule feeds a queue, and a kuberay launcher
    s, url = kuberay_reporting(settings, aws_endpoint, k8s)
    table = ensure_source_table(open_catalog(s), s.catalog.source_table)
    append_tickets(table, generate_tickets(20, random.Random(1)))
    [launched] = invoke("launcher", {"trigger": "schedule"}, s)["decisions"]
    assert launched["decision"] == "launch"
    drain(aws_endpoint, url)  # (the Submitted announcement is not for the reporter)
    # when the job commits a chunk of 8 rows, then dies of its deadline without any event
    ledger = open_ledger(s, triage(s))
    plan = ledger.plan(run_id=launched["run_id"], to_snapshot_inclusive=launched["current_snapshot_id"])
    with pytest.raises(Crash):
        run_once(ledger, plan=plan, chunk_rows=8, transform=dies_after(12))
    ended = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    k8s.set_status(
        launched["job_name"],
        jobDeploymentStatus="Failed",
        reason="DeadlineExceeded",
        message="RayJob has passed the activeDeadlineSeconds",
        endTime=ended,
    )
    # then the next schedule reports it once (and launches attempt 2 for the still-pending range) ...
    [retry] = invoke("launcher", {"trigger": "schedule"}, s)["decisions"]
    assert retry["decision"] == "launch" and retry["attempt"] == 2
    assert retry["run_id"] == launched["run_id"] and retry["reason"].startswith("resume run ")  # the same run
    [failed] = drain(aws_endpoint, url, expect=1)
    detail = json.loads(failed["Body"])["detail"]
    assert (detail["origin"], detail["error_type"], detail["rayjob_name"]) == (
        "reconciler",
        "DeadlineExceeded",
        launched["job_name"],
    )
    assert detail["run_id"] == launched["run_id"] and detail["retryable"] is True
    assert (detail["resumable"], detail["rows_committed"]) == (True, 8)  # what its run kept
    assert (detail["consumer"], detail["deployment"], detail["task_version"]) == ("triage", "icebatch-prod", 1)
    obj = k8s.objects[("icebatch", launched["job_name"])]
    assert obj["metadata"]["annotations"]["icebatch.io/reported"] == "true"
    # ... not again on the one after
    [again] = invoke("launcher", {"trigger": "schedule"}, s)["decisions"]
    assert again["decision"] == "already_launched" and again["active_job"] == retry["job_name"]
    assert [json.loads(m["Body"])["detail-type"] for m in drain(aws_endpoint, url)] == []
    # and once past the retention period, the reported job is deleted
    invoke("launcher", {"trigger": "schedule"}, s.with_overrides(finished_job_retention_seconds=60))
    assert launched["job_name"] not in k8s.names()


def test_a_rayjob_that_lost_its_range_to_another_run_is_not_reported_as_a_failure(
    settings: Settings, aws_endpoint: str, k8s: RayJobApi
) -> None:
    # given a kuberay launcher whose reports reach a queue, and a job it launched over the backlog
    s, url = kuberay_reporting(settings, aws_endpoint, k8s)
    append_tickets(ensure_source_table(open_catalog(s), s.catalog.source_table), generate_tickets(20, random.Random(1)))
    [launched] = invoke("launcher", {"trigger": "schedule"}, s)["decisions"]
    assert launched["decision"] == "launch"
    drain(aws_endpoint, url)
    # when another run (`icebatch job run` by hand) completes the same range first, and the job, finding its
    # range covered, ends with the exit status of a conflict (a failed RayJob, as KubeRay sees it)
    ledger = open_ledger(s, triage(s))
    manual = run_once(ledger)
    assert manual is not None and manual.plan.run_id != launched["run_id"]
    k8s.set_status(
        launched["job_name"],
        jobDeploymentStatus="Failed",
        jobStatus="FAILED",
        message="Job entrypoint command failed with exit code 5",
        endTime=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    # then the next schedule's reconciliation reports no failure (a race is not a failure: no email, no alarm),
    # marks the job as seen, and finds nothing new
    [after] = invoke("launcher", {"trigger": "schedule"}, s)["decisions"]
    assert (after["decision"], after["backlog_rows"]) == ("skip", 0)
    assert [json.loads(m["Body"])["detail-type"] for m in drain(aws_endpoint, url)] == []
    assert k8s.objects[("icebatch", launched["job_name"])]["metadata"]["annotations"]["icebatch.io/reported"] == "true"


def test_a_deployments_reporter_rule_takes_only_its_own_events(aws_endpoint: str) -> None:
    # given the reporter rules of two deployments (dev and prod) on one bus
    events, bus, prod_queue = bus_with_reporter_rule(aws_endpoint, deployment="icebatch-prod")
    dev_queue, dev_arn = queue(aws_endpoint)
    dev_pattern = fill(PATTERNS["reporter"], {"AWS::StackName": "icebatch-dev"})
    events.put_rule(Name="reporter-dev", EventBusName=bus, EventPattern=json.dumps(dev_pattern))
    events.put_targets(Rule="reporter-dev", EventBusName=bus, Targets=[{"Id": "q", "Arn": dev_arn}])
    # when a prod job reports
    detail = BatchJobCompleted.model_validate(example("batch-job-completed.json")["detail"])
    EventBridgePublisher(events, bus).publish(detail.model_copy(update={"deployment": "icebatch-prod"}))
    # then only prod's reporter hears of it
    assert len(drain(aws_endpoint, prod_queue, expect=1)) == 1
    assert drain(aws_endpoint, dev_queue) == []


def test_local_bus_routes_completion_to_the_reporter_and_writes_the_report(settings: Settings, capsys: Any) -> None:
    bus = load_publisher(settings)
    example_detail = BatchJobCompleted.model_validate(example("batch-job-completed.json")["detail"])
    bus.publish(example_detail)  # another deployment's: not this reporter's business
    detail = example_detail.model_copy(update={"deployment": settings.top.deployment})
    bus.publish(detail)
    bus.publish(detail)  # delivered twice: one report
    reports = sorted((settings.reports_dir).glob("*.txt"))
    assert [p.name for p in reports] == ["triage-20261129T020005-4f1c2a.completed.txt"]
    text = reports[0].read_text()
    assert "Subject: icebatch triage: 2,200 tickets" in text and "TOKENOMICS" in text
    assert capsys.readouterr().out.count("[report] icebatch triage") == 1
    logged = [json.loads(line)["detail-type"] for line in (settings.home / "events.jsonl").read_text().splitlines()]
    assert logged == ["Batch Job Completed"] * 3


def test_an_idempotency_table_out_of_reach_is_a_counted_retry(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # given a reporter whose AWS endpoint (DynamoDB, SNS) refuses connections
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    down = settings.with_overrides(
        sns_topic_arn=f"arn:aws:sns:{REGION}:123456789012:reports",
        idempotency_table="icebatch-idempotency",
        aws_endpoint_url="http://127.0.0.1:9",
        aws_region=REGION,
    )
    # when a completion event arrives, then it is a transient error (Lambda retries, then dead-letters)
    with pytest.raises(TransientError, match="the idempotency table cannot be used"):
        invoke("reporter", example("batch-job-completed.json"), down)
    # and the retry is counted
    assert "TransientErrors" in metric_names(capfd.readouterr().out)


@pytest.mark.parametrize("failure", ["throttle", "silent"])
def test_sns_throttling_or_not_answering_is_a_counted_retry(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], failure: str
) -> None:
    # given a reporter whose SNS throttles every request, or reads it and never answers (1 s read timeout)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setattr(aws_clients, "READ_TIMEOUT_SECONDS", 1)
    with failing_endpoint(failure) as (endpoint, counts):
        s = settings.with_overrides(
            sns_topic_arn=f"arn:aws:sns:{REGION}:123456789012:reports", aws_endpoint_url=endpoint, aws_region=REGION
        )
        # when a completion event arrives, then it is a transient error (Lambda retries, then dead-letters) ...
        with pytest.raises(TransientError, match="could not publish the report to arn:aws:sns:"):
            invoke("reporter", example("batch-job-completed.json"), s)
    # ... after the client's own bounded retries
    assert counts["requests"] == 1 + aws_clients.MAX_RETRIES
    # and the retry is counted, so that it shows before a dead letter does
    assert "TransientErrors" in metric_names(capfd.readouterr().out)


def test_a_topic_the_deployment_lost_keeps_the_event_and_it_is_reported_once_the_topic_is_back(
    aws_settings: Settings, aws_endpoint: str, capfd: pytest.CaptureFixture[str]
) -> None:
    # given a reporter whose topic is gone (SNS answers NotFound: a deploy that deleted or renamed it)
    name = f"icebatch-lost-{uuid.uuid4().hex[:6]}"
    s = aws_settings.with_overrides(sns_topic_arn=f"arn:aws:sns:{REGION}:123456789012:{name}")
    event = example("batch-job-completed.json")
    # when a completion event arrives, then the refusal is raised, so that Lambda keeps the event (retried, then in
    # the dead-letter queue), saying what to check
    with pytest.raises(RefusedError, match=r"\(NotFound\): check the topic, its key and the reporter's role"):
        invoke("reporter", event, s)
    # and it is counted as an error an operator must see (alarmed), not as a passing retry
    names = metric_names(capfd.readouterr().out)
    assert "ReportErrors" in names and "TransientErrors" not in names and "Reports" not in names
    # when the topic is back and the kept event is re-driven, then it is reported, once (its record was let go)
    sns = client("sns", aws_endpoint)
    topic = sns.create_topic(Name=name)["TopicArn"]
    url, arn = queue(aws_endpoint)
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    first = invoke("reporter", event, s)
    assert first["status"] == "reported" and invoke("reporter", event, s) == first
    assert len(drain(aws_endpoint, url)) == 1


def test_a_role_sns_does_not_authorize_keeps_the_event_for_a_re_drive(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # given a reporter whose role may not publish to the topic (SNS answers 403 AuthorizationError, as on AWS)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with failing_endpoint("unauthorized") as (endpoint, counts):
        s = settings.with_overrides(
            sns_topic_arn=f"arn:aws:sns:{REGION}:123456789012:reports", aws_endpoint_url=endpoint, aws_region=REGION
        )
        # when a completion event arrives, then the refusal is raised at once (no client retry: it cannot help), so
        # that Lambda keeps the event for a re-drive once the grant is fixed
        with pytest.raises(RefusedError, match=r"\(AuthorizationError\)"):
            invoke("reporter", example("batch-job-completed.json"), s)
    assert counts["requests"] == 1
    # and it is counted as an error an operator must see
    assert "ReportErrors" in metric_names(capfd.readouterr().out)


@pytest.mark.parametrize("kind", ["completed", "failed"])
def test_an_event_the_job_cannot_send_is_logged_with_what_happens_next(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    # given the job's EventBridge publisher at an endpoint that refuses connections
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    down = settings.with_overrides(aws_endpoint_url="http://127.0.0.1:9", aws_region=REGION)
    publisher = EventBridgePublisher(aws_clients.aws_client("events", down), "icebatch")
    model = BatchJobCompleted if kind == "completed" else BatchJobFailed
    detail = model.model_validate(example(f"batch-job-{kind}.json")["detail"])
    # when the job emits its event at the end of a run, then the run does not fail for it ...
    with caplog.at_level(logging.ERROR, logger="icebatch_job.job"):
        publish(publisher, detail)
    # ... and the log says what becomes of the report: a completed run's is rebuilt from the ledger (nothing
    # reports a job that succeeded), a failed job is reported by the nightly reconciliation
    [line] = [r.getMessage() for r in caplog.records if r.name == "icebatch_job.job"]
    assert line.startswith(f"could not emit {detail.detail_type!r}: Could not connect to the endpoint URL")
    if kind == "completed":
        assert line.endswith(f"the run is committed: `icebatch report {detail.run_id}` rebuilds its report")
    else:
        assert line.endswith("the nightly reconciliation reports the job if it failed")


REPORTER_BESIDE_RAY = """
import json, sys
from pathlib import Path
import ray  # the job's process has imported Ray when its local bus calls the reporter
from icebatch.core.settings import Settings
from icebatch.tools.invoke import invoke
event = json.loads(Path(sys.argv[2]).read_text())
invoke("reporter", event, Settings(home=Path(sys.argv[1])), logs_to_stderr=True)
"""


def test_the_reporter_logs_as_on_aws_in_a_process_that_imported_ray(tmp_path: Path) -> None:
    # given a process that imported Ray (the local job, whose event bus calls the reporter in-process)
    event = EXAMPLES / "valid" / "batch-job-completed.json"
    # when the reporter handles a completion event there
    done = subprocess.run(
        [sys.executable, "-c", REPORTER_BESIDE_RAY, str(tmp_path), str(event)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": CODE},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # then its log records are the handler's own, as in Lambda: none carries Ray's tag
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert [r for r in records if r.get("message") == "cost report"], done.stderr[-2000:]
    assert not [r for r in records if "_ray_timestamp_ns" in r], records


def test_a_report_sets_its_run_beside_the_consumers_last_runs_from_its_ledger(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from icebatch.core.events import envelope

    # given a consumer with two runs in its ledger (5 rows, then 7), on the SQL catalog
    ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    ledger = open_ledger(settings, triage(settings))
    done = []
    for n, seed in ((5, 1), (7, 2)):
        append_tickets(ledger.source(), generate_tickets(n, random.Random(seed)))
        executed = run_once(ledger)
        assert executed is not None
        done.append(executed.plan.run_id)
    base = BatchJobCompleted.model_validate(example("batch-job-completed.json")["detail"])

    def report(s: Settings, run_id: str) -> tuple[str, dict[str, Any]]:
        detail = base.model_copy(update={"deployment": s.top.deployment, "run_id": run_id})
        assert (
            invoke("reporter", envelope(detail, event_id=str(uuid.uuid4()), time=datetime.now(UTC)), s)["status"]
            == "reported"
        )
        stem = s.reports_dir / f"{run_id}.completed"
        return Path(f"{stem}.txt").read_text(), json.loads(Path(f"{stem}.json").read_text())

    # when a third run is reported
    text, data = report(settings, "triage-20261205T000000-aaaaaa")
    # then its report lists the two before it, newest first, and sets its $ per 1k rows beside their median
    assert [r["run_id"] for r in data["last_runs"]] == done[::-1]
    assert [r["rows"] for r in data["last_runs"]] == [7, 5] and all(r["cost_usd"] > 0 for r in data["last_runs"])
    block = text.split("==== LAST RUNS ", 1)[1].splitlines()
    assert "7 tickets" in block[1] and "5 tickets" in block[2] and "the last 2 runs' median $" in block[3], block
    # and a deployment that leaves them out gets no block; one whose ledger cannot be read gets its report anyway
    off, _ = report(settings.with_overrides(report_last_runs=0), "triage-20261205T000000-bbbbbb")
    assert "LAST RUNS" not in off and "TOKENOMICS" in off
    other = consumers_file(tmp_path / "other", {"name": "privacy", "task": "privacy"})
    unread, unread_data = report(settings.with_overrides(consumers_file=other), "triage-20261205T000000-cccccc")
    assert "LAST RUNS" not in unread and "last_runs" not in unread_data
    assert any("were not read for its report" in r.getMessage() for r in caplog.records)
