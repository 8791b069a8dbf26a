"""The production path, end to end, against real AWS APIs (moto over HTTP) and the real KubeRay CRD.

Production settings throughout: the template as deployed (SAM-transformed), a Glue catalog with an
``s3://`` warehouse, an ``s3://`` model loaded the way production loads it, the kuberay backend reaching
an HTTPS API server whose endpoint and CA come from ``eks:DescribeCluster`` with an STS-signed token,
events routed by the deployed rules, reports through SNS, idempotency in DynamoDB. The only difference
from AWS: every AWS client is pointed at moto (``ICEBATCH_AWS_ENDPOINT_URL``), functions run as local
processes fed from their rules' inboxes, and the RayJob's entrypoint runs here with its pod's
environment (and local paths).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.consumers import load_consumers
from icebatch.core.ledger import open_ledger
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets

from tests.aws.deploy import deploy
from tests.aws.world import NAMESPACE, STACK, World
from tests.support.aws import CREDS, REGION, client
from tests.support.crd import VERSIONS, errors
from tests.support.iam_audit import (
    Call,
    denied,
    granting,
    made_by_aws_as,
    necessity,
    replay,
    role_statements,
    sendable,
    without,
)

pytestmark = pytest.mark.aws
JOB_TIMEOUT = 900
ROWS = 200  # at least both bundled consumers' backlog thresholds (triage 100, privacy 200); too few to pay
ROLES = ("LauncherFunctionRole", "ReporterFunctionRole", "JobRole", "WarehouseEventBridgeFunctionRole")


def _run_like_the_pod(world: World, manifest: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """The RayJob's entrypoint, run as KubeRay's submitter runs it: on the head, with the head's environment."""
    head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    pod_env = {e["name"]: e["value"] for e in head["env"]}
    env = {
        **pod_env,
        # what the pod gets from elsewhere: EKS Pod Identity's credentials, and local paths
        **world.deployed.role_env("JobRole"),
        "ICEBATCH_HOME": str(world.home / "pod"),  # the pod's emptyDir (ICEBATCH_HOME=/tmp/icebatch there)
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONPATH": os.environ["PYTHONPATH"],
        "HOME": str(world.home / "pod-home"),
        "NO_PROXY": "127.0.0.1,localhost",
    }
    assert "AWS_REGION" not in env and "AWS_DEFAULT_REGION" not in env  # a pod has none: the manifest must say
    # a job that took a burst keeps its node for the next commit (icebatch_job.linger): once it waits, it is stopped
    # as Kubernetes stops a pod (SIGTERM; nothing in progress, exit 0) rather than waited for through its window
    out, err = world.home / "pod.out", world.home / "pod.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        job = subprocess.Popen(shlex.split(manifest["spec"]["entrypoint"]), stdout=stdout, stderr=stderr, env=env)
        deadline = time.monotonic() + JOB_TIMEOUT
        while job.poll() is None and time.monotonic() < deadline:
            if "lingering up to" in err.read_text():
                job.send_signal(signal.SIGTERM)
                break
            time.sleep(0.5)
        job.wait(timeout=max(1.0, deadline - time.monotonic()))
    return subprocess.CompletedProcess(job.args, job.returncode, out.read_text(), err.read_text())


def _copy_like_the_worker(world: World, manifest: dict[str, Any]) -> str:
    """The GPU worker's init container, run as its pod runs it (its command, its environment, the job's role), on
    this machine as the node, whose cache the job's engine then reads: the copy's folder, as it printed it."""
    worker = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    [init] = worker["initContainers"]
    assert {m["mountPath"] for m in init["volumeMounts"]} == {"/tmp/icebatch"}  # the worker's NVMe-backed cache
    env = {
        **{e["name"]: e["value"] for e in init["env"]},
        **world.deployed.role_env("JobRole"),
        "ICEBATCH_HOME": str(world.home / "pod"),  # the node's cache, as the head's ICEBATCH_HOME below
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONPATH": os.environ["PYTHONPATH"],
        "HOME": str(world.home / "pod-home"),
        "NO_PROXY": "127.0.0.1,localhost",
    }
    done = subprocess.run(init["command"], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout.strip()


# two real jobs, one after the other, beside the hygiene tier's on two cores: more than pytest's 900 s per test
@pytest.mark.timeout(2 * JOB_TIMEOUT)
def test_a_commit_on_glue_is_labelled_reported_and_billed_as_in_production(world: World) -> None:
    d = world.deployed
    # given tickets committed to the source table in Glue (the warehouse in S3, its EventBridge turned on)
    s = world.launcher_settings()
    table = ensure_source_table(open_catalog(s), s.catalog.source_table)
    snapshot = append_tickets(table, generate_tickets(ROWS, random.Random(5)))

    # then S3's "Object Created" events reach the launcher only for the commits' metadata files
    s3_events = d.drain("LauncherFunction", expect=2)
    keys = [e["detail"]["object"]["key"] for e in s3_events if e["source"] == "aws.s3"]
    assert keys and all(k.startswith(f"warehouse/{world.database}.db/tickets/metadata/") for k in keys)
    assert all(k.endswith(".metadata.json") for k in keys), keys  # no manifest (.avro) or data file

    # and of Glue's events, only a table's UpdateTable reaches it
    glue = client("events", world.endpoint)
    detail = {"databaseName": world.database, "tableName": "tickets", "typeOfChange": "UpdateTable"}
    glue.put_events(
        Entries=[
            {"Source": "aws.glue", "DetailType": "Glue Data Catalog Table State Change", "Detail": json.dumps(detail)},
            {
                "Source": "aws.glue",
                "DetailType": "Glue Data Catalog Table State Change",
                "Detail": json.dumps({**detail, "typeOfChange": "BatchUpdateTable"}),
            },
            {
                "Source": "aws.glue",
                "DetailType": "Glue Data Catalog Database State Change",
                "Detail": json.dumps(
                    {"databaseName": world.database, "typeOfChange": "CreateTable", "changedTables": ["tickets"]}
                ),
            },
        ]
    )
    [glue_event] = d.drain("LauncherFunction", expect=1)
    assert glue_event["detail"]["typeOfChange"] == "UpdateTable"

    # and an attempt of triage that failed earlier today, reported by the deployed reporter (its record in S3)
    failure = _failed_event(run_id=f"triage-{uuid.uuid4().hex[:6]}")
    client("events", world.endpoint).put_events(Entries=[failure])
    [failed] = d.drain("ReporterFunction", expect=1)
    assert d.invoke("ReporterFunction", failed).response["status"] == "reported"
    [failure_report] = _topic_messages(world)
    assert failure_report["Subject"].startswith("icebatch triage: FAILED"), failure_report["Subject"]

    # when the launcher is invoked with the newest metadata event, then the bundled consumers' cost gate waits: a
    # run of so few rows would cost more per 1k rows, start-up and idle tail included, than a batch API; the two
    # consumers share a model, so they are priced as one job over both's rows
    waits = {x["consumer"]: x for x in d.invoke("LauncherFunction", s3_events[-1]).response["decisions"]}
    assert {x["decision"] for x in waits.values()} == {"wait"} and world.k8s.names(NAMESPACE) == [], waits
    assert all("(priced with" in x["reason"] for x in waits.values()), waits
    # and triage's spend today counts the failed attempts on record (this one, and any other test of the module
    # put there before), read with the launcher's role
    spent = sum(r["cost"]["lifetime_cost"] for r in _failures_on_record(world, "triage"))
    assert json.loads(failure["Detail"])["run_id"] in {r["run_id"] for r in _failures_on_record(world, "triage")}
    assert (waits["triage"]["spent_today_usd"], waits["privacy"]["spent_today_usd"]) == (round(spent, 6), 0), waits
    more = -(-max(x["rows_to_pay"] for x in waits.values()) // 2) - ROWS  # each new ticket is a row for both
    assert more > 0
    # when as many more rows as make their shared run pay are committed, and the launcher gets that commit's event
    snapshot = append_tickets(table, generate_tickets(more, random.Random(6)))
    total = ROWS + more
    commit_events = [e for e in d.drain("LauncherFunction", expect=1) if e["source"] == "aws.s3"]
    launch = d.invoke("LauncherFunction", commit_events[-1])
    decisions = {x["consumer"]: x for x in launch.response["decisions"]}

    # then it launched one RayJob for both consumers (the bundled consumers file: triage and privacy, one model)
    # through the API server EKS names (HTTPS, the cluster's CA, an STS-signed token)
    assert sorted(decisions) == ["privacy", "triage"]
    for decision in decisions.values():
        assert decision["decision"] == "launch" and "it pays (priced with" in decision["reason"], decision
        assert (decision["backlog_rows"], decision["current_snapshot_id"], decision["origin"]) == (
            total,
            snapshot,
            "s3",
        )
    [name] = {x["job_name"] for x in decisions.values()}
    assert world.k8s.names(NAMESPACE) == [name]
    assert world.k8s.identities and world.k8s.identities[-1].startswith("arn:aws:sts::")
    manifest = world.k8s.objects[(NAMESPACE, name)]
    for version in VERSIONS:  # the API server checked v1.7.0 strictly; v1.6.1 accepts it too
        assert errors({k: v for k, v in manifest.items() if k != "status"}, version) == []
    # and the same change again (EventBridge delivers at least once) is "already launched", for each
    again = d.invoke("LauncherFunction", glue_event).response["decisions"]
    assert {x["decision"] for x in again} == {"already_launched"}, again

    # when the GPU worker's init container copies the model to its node's cache (the template's ModelLoadFormat,
    # nvme_streamer), as its pod runs it
    copy = _copy_like_the_worker(world, manifest)
    weights = sorted(Path(copy).glob("*.safetensors"))
    assert weights and Path(copy).name == "tiny-llama", copy
    copied = {w.name: w.stat().st_mtime_ns for w in weights}
    # and the job runs with exactly its pod's command line and environment: both consumers' runs, one engine
    done = _run_like_the_pod(world, manifest)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    # then the engine loaded the node's copy, as it was (the job made none of its own, Ray Data LLM downloaded none)
    assert {w.name: w.stat().st_mtime_ns for w in Path(copy).glob("*.safetensors")} == copied
    assert [p for p in (world.home / "pod").rglob("*.safetensors") if p.parent != Path(copy)] == []
    assert done.stdout.count("BATCH SUMMARY") == 2 and done.stdout.count("shared job") == 2

    # then each consumer's results and watermark are in Glue/S3, in one commit, in its own table
    for consumer in load_consumers(s):
        ledger = open_ledger(s, consumer)
        assert ledger.watermark().source_snapshot_id == snapshot
        results = ledger.results()
        assert results is not None and results.metadata.location.startswith(f"s3://{world.bucket}/warehouse/")
        rows = results.scan(selected_fields=("source_id", "task")).to_arrow().to_pylist()
        assert len(rows) == total and len({r["source_id"] for r in rows}) == total
        assert {r["task"] for r in rows} == {consumer.task.name}

    # and the completion events went through the deployed reporter rule (the launches' announcements did not)
    completed = d.drain("ReporterFunction", expect=2)
    assert sorted((e["detail-type"], e["detail"]["consumer"]) for e in completed) == [
        ("Batch Job Completed", "privacy"),
        ("Batch Job Completed", "triage"),
    ]

    # when the reporter gets the first while its role may not publish (a deploy that lost the grant)
    reporter = role_statements(d.stack, "ReporterFunctionRole")
    with d.role_granting("ReporterFunctionRole", without(reporter, granting(reporter, "sns:Publish"), "sns:Publish")):
        refused = d.invoke("ReporterFunction", completed[0], check=False)
    # then no report went out, and the refusal was raised: Lambda retries, then keeps the event in the dead-letter
    # queue, to redrive once the grant is back (moto answers AccessDenied, AWS AuthorizationError: both are raised)
    assert refused.raised, refused.response
    assert _topic_messages(world) == []
    # when the reporter gets each, twice (at-least-once delivery), the grant back: each is reported once (the record
    # of the refused report was let go)
    for event in completed:
        first = d.invoke("ReporterFunction", event).response
        second = d.invoke("ReporterFunction", event).response
        assert first == second and first["status"] == "reported"

    # then one report per run reached the topic's subscribers, naming its consumer, instance type and rate
    reports = {m["MessageAttributes"]["consumer"]["Value"]: m for m in _topic_messages(world)}
    assert sorted(reports) == ["privacy", "triage"]
    for consumer, message in reports.items():
        report = json.loads(message["Message"])
        assert (report["consumer"], report["deployment"]) == (consumer, STACK)
        assert report["cost"]["instance_type"] == "g6.xlarge" and report["cost"]["hourly_rate"] == 0.8048
        assert report["cost"]["rate_source"] == "g6.xlarge on-demand (us-east-1)"
        assert message["Subject"].startswith(f"icebatch {consumer}: {total:,} tickets, $")
        # the reporter read the consumer's ledger on Glue, with its role as deployed: this run was its first
        assert report["last_runs"] == [], report.get("last_runs")

    # and the nightly schedule, as deployed, finds nothing new once the jobs are done
    for x in decisions.values():
        world.k8s.set_status(x["job_name"], NAMESPACE, jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
    nightly = d.invoke("LauncherFunction", d.schedule_input("LauncherFunctionNightly")).response["decisions"]
    assert {(x["decision"], x["reason"]) for x in nightly} == {("skip", "nothing new since the watermark")}

    # and every AWS call each part made was allowed by its role as deployed (least privilege, and enough): moto,
    # enforcing IAM, answered every one of them signed with a session of the role; the audit checked each against the
    # role's resources and conditions too, which moto does not (tests/support/aws.py)
    unused = {}
    for role in ROLES:
        calls = world.recorder.by(d.key(role))
        assert calls, f"{role} made no call: the audit would prove nothing"
        calls += made_by_aws_as(d.stack, role, calls)  # a failure destination, KMS for the encrypted topic
        statements = role_statements(d.stack, role)
        assert denied(calls, statements) == [], role
        # and each action the flow needs, taken out of the role in turn, denies the calls that need it, by name: in
        # the audit, and in moto, sent again as they were signed
        unused[role] = _each_needed_action_denied(world, role, calls)
    # and the roles grant nothing this flow does not need
    assert unused == {role: [] for role in ROLES}, unused


def _each_needed_action_denied(world: World, role: str, calls: list[Call]) -> list[str]:
    """Each action of the role that some of ``calls`` need, taken out of it in turn: the audit denies those calls,
    and moto, one of them sent again as it was signed (naming the action; S3's errors name none); the grants no call
    needed."""
    d, statements = world.deployed, role_statements(world.deployed.stack, role)
    needed, unused = necessity(calls, statements)
    for (index, action), lost in needed.items():
        assert all(c.action.lower() == action.lower() or "*" in action for c in lost), (action, lost)
        if all(c.request is None for c in lost):
            continue  # calls AWS makes as the role (made_by_aws_as): moto makes none to deny
        call, head = sendable(lost)  # a HEAD's answer has no body to name anything: another call where there is one
        with d.role_granting(role, without(statements, index, action)):
            status, body = replay(world.endpoint, call)
        assert status == 403 and ("AccessDenied" in body or head), (role, action, status, body[:400])
        assert action.startswith("s3:") or f"not authorized to perform: {action.lower()}" in body.lower(), body
    return unused


def _topic_messages(world: World) -> list[dict[str, Any]]:
    """What the reports topic delivered to its SQS subscriber."""
    sqs = client("sqs", world.endpoint)
    messages = []
    for _ in range(4):
        got = sqs.receive_message(QueueUrl=world.reports, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        for m in got.get("Messages", []):
            messages.append(json.loads(m["Body"]))
            sqs.delete_message(QueueUrl=world.reports, ReceiptHandle=m["ReceiptHandle"])
        if not got.get("Messages"):
            break
    return messages


def test_a_permanent_launcher_error_is_counted_where_the_deployed_alarm_looks(world: World) -> None:
    # given a launcher whose namespace it may not use (an RBAC 403: no retry can fix it)
    event = world.deployed.schedule_input("LauncherFunctionNightly")
    world.k8s.forbidden.add("locked")
    invocation = world.deployed.invoke(
        "LauncherFunction", event, ICEBATCH_K8S_NAMESPACE="locked", ICEBATCH_DRY_RUN="false"
    )
    assert invocation.response["error_type"] == "ClusterPermissionError", invocation.response
    # then the EMF it printed carries LaunchErrors under exactly the namespace and dimensions an alarm watches
    alarms = client("cloudwatch", world.endpoint).describe_alarms()["MetricAlarms"]
    watched = {
        (a["Namespace"], a["MetricName"], tuple(sorted((x["Name"], x["Value"]) for x in a["Dimensions"])))
        for a in alarms
        if a["AlarmName"].startswith(STACK)
    }
    published = set()
    for blob in invocation.metrics():
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            for dimensions in directive["Dimensions"]:
                for metric in directive["Metrics"]:
                    key = tuple(sorted((dim, str(blob[dim])) for dim in dimensions))
                    published.add((directive["Namespace"], metric["Name"], key))
    assert (f"icebatch/{STACK}", "LaunchErrors", (("service", "launcher"),)) in published & watched


def test_a_second_stack_deploys_beside_the_first_and_they_do_not_cross_talk(world: World) -> None:
    # given the dev stack of this module; when a prod stack of the same template is deployed in the account
    dev = world.deployed
    prod = deploy(
        "icebatch-prod",
        {**{k: v for k, v in dev.stack.parameters.items() if v is not None}, "JobServiceAccount": "icebatch-job-prod"},
        endpoint=world.endpoint,
        home=world.home / "prod",
    )
    # then each has its own Pod Identity association (EKS allows one per cluster, namespace and service account)
    key = ("ClusterName", "Namespace", "ServiceAccount")
    associations = [tuple(s.stack.properties("JobPodIdentity")[k] for k in key) for s in (dev, prod)]
    assert associations[0][:2] == associations[1][:2] and associations[0] != associations[1], associations
    # then both nightly schedules exist, each its own
    dev_schedule, prod_schedule = dev.schedules["LauncherFunctionNightly"], prod.schedules["LauncherFunctionNightly"]
    assert dev_schedule != prod_schedule
    names = {s["Name"] for s in client("scheduler", world.endpoint).list_schedules()["Schedules"]}
    assert {dev_schedule, prod_schedule} <= names
    # and a run of one stack reaches its own reporter only
    example = json.loads((Path(__file__).resolve().parents[2] / "sam/events/completed.json").read_text())
    for stack in ("icebatch-dev", "icebatch-prod"):
        detail = {**example["detail"], "deployment": stack, "run_id": f"triage-{stack}"}
        client("events", world.endpoint).put_events(
            Entries=[{"Source": "icebatch", "DetailType": "Batch Job Completed", "Detail": json.dumps(detail)}]
        )
    assert [e["detail"]["deployment"] for e in dev.drain("ReporterFunction", expect=1)] == ["icebatch-dev"]
    assert [e["detail"]["deployment"] for e in prod.drain("ReporterFunction", expect=1)] == ["icebatch-prod"]


def test_a_failed_job_is_on_record_in_s3_where_icebatch_runs_finds_it(world: World) -> None:
    d = world.deployed
    # given a job that failed, its event sent as the job sends it
    s = world.launcher_settings()
    ensure_source_table(open_catalog(s), s.catalog.source_table)  # as it is after the first test; this one alone too
    run_id = f"triage-20261205T020000-{uuid.uuid4().hex[:6]}"
    client("events", world.endpoint).put_events(Entries=[_failed_event(run_id)])
    # when the deployed rule delivers it to the reporter, with its role as deployed
    [event] = d.drain("ReporterFunction", expect=1)
    response = d.invoke("ReporterFunction", event).response
    # then its report went out
    assert [m["Subject"] for m in _topic_messages(world)] == ["icebatch triage: FAILED (OutOfMemoryError) at start"]
    # and the failure is on record under the stack's warehouse prefix
    prefix = f"s3://{world.bucket}/warehouse/_icebatch/{STACK}/failures/triage/"
    assert response["status"] == "reported" and response["failure_record"].startswith(prefix), response
    # and its role as deployed allows that write (and everything else the reporter did): taken out, moto denies it
    calls = world.recorder.by(d.key("ReporterFunctionRole"))
    assert [c for c in calls if c.action == "s3:PutObject" and "/_icebatch/" in c.resources[0]], calls
    assert denied(calls, role_statements(d.stack, "ReporterFunctionRole")) == []
    unused = _each_needed_action_denied(world, "ReporterFunctionRole", calls)
    assert "s3:PutObject (statement 6: PutFailuresOnRecordForIcebatchRuns)" not in unused, unused
    # when an operator asks `icebatch runs` with the stack's settings (as docs/operating.md says)
    stack_env = {k: v for k, v in d.function_env("LauncherFunction").items() if k.startswith("ICEBATCH_")}
    operator = subprocess.run(
        [sys.executable, "-m", "icebatch.tools.cli", "runs", "--consumer", "triage", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **stack_env,
            **CREDS,
            "ICEBATCH_AWS_ENDPOINT_URL": world.endpoint,
            "ICEBATCH_AWS_REGION": REGION,
            "ICEBATCH_HOME": str(world.home / "operator"),
            "PYTHONPATH": os.environ["PYTHONPATH"],
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(world.home),
            "NO_PROXY": "127.0.0.1,localhost",
        },
    )
    # then the failed attempt is listed, with its stage and reason, from the record the reporter wrote
    assert operator.returncode == 0, operator.stderr[-3000:]
    [row] = [r for r in json.loads(operator.stdout)["runs"] if r["run_id"] == run_id]
    assert row["status"] == "failed" and row["note"].startswith("start: CUDA out of memory"), row


def _failures_on_record(world: World, consumer: str) -> list[dict[str, Any]]:
    """The failure records the reporter wrote for the consumer (read as the tests' administrator)."""
    s3, prefix = client("s3", world.endpoint), f"warehouse/_icebatch/{STACK}/failures/{consumer}/"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=world.bucket, Prefix=prefix).get("Contents", [])]
    return [json.loads(s3.get_object(Bucket=world.bucket, Key=k)["Body"].read()) for k in keys]


def _failed_event(run_id: str) -> dict[str, str]:
    """A "Batch Job Failed" entry for PutEvents, as the job sends it, of this stack, failed now."""
    example = json.loads(
        (Path(__file__).resolve().parents[2] / "eventbridge/examples/valid/batch-job-failed.json").read_text()
    )
    detail = {**example["detail"], "deployment": STACK, "run_id": run_id, "failed_at": _now()}
    return {"Source": "icebatch", "DetailType": "Batch Job Failed", "Detail": json.dumps(detail)}


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_a_deferred_run_reaches_the_launcher_of_its_own_stack_only(world: World) -> None:
    d = world.deployed
    s = world.launcher_settings()
    ensure_source_table(open_catalog(s), s.catalog.source_table)  # as it is after the first test; this one alone too
    d.drain("LauncherFunction")  # the creation's metadata events, if it created it
    # given a run of this stack, and one of another, that each deferred (rows changed, no model on their node)
    example = json.loads(
        (Path(__file__).resolve().parents[2] / "eventbridge/examples/valid/batch-job-deferred.json").read_text()
    )
    entries = [
        {
            "Source": "icebatch",
            "DetailType": "Batch Job Deferred",
            "Detail": json.dumps({**example["detail"], "deployment": stack}),
        }
        for stack in (STACK, "icebatch-other")
    ]
    client("events", world.endpoint).put_events(Entries=entries)
    # then the deployed rule delivers this stack's to its launcher, and the launcher takes it for that consumer alone
    [event] = d.drain("LauncherFunction", expect=1)
    assert (event["detail-type"], event["detail"]["deployment"]) == ("Batch Job Deferred", STACK)
    response = d.invoke("LauncherFunction", event, ICEBATCH_DRY_RUN="true").response
    assert response["status"] == "ok" and [x["consumer"] for x in response["decisions"]] == ["triage"], response
    assert response["decisions"][0]["origin"] == "deferred"
