"""The launcher handler against real local services.

- the source table in a real catalog (SQL; Glue + S3 through moto server for the S3/Glue triggers),
- the real kubernetes client talking HTTP to a RayJob API server (tests/support/k8s_api.py) that checks
  each bearer token by calling its presigned URL against moto's STS,
- the event files in sam/events/, as `sam local invoke` would pass them.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pytest
from icebatch.control.backends.eks_auth import _CLUSTERS, TOKEN_PREFIX, cluster_info
from icebatch.control.backends.kuberay import KubeRayBackend
from icebatch.control.launcher import launch
from icebatch.control.triggers import parse_trigger
from icebatch.core import aws_clients
from icebatch.core.catalog import open_catalog
from icebatch.core.consumers import load_consumers
from icebatch.core.errors import CatalogUnavailableError, ClusterPermissionError, ClusterUnavailableError
from icebatch.core.ledger import ResultsLedger
from icebatch.core.settings import Settings
from icebatch.tools.invoke import invoke
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets

from tests.support.aws import REGION, assume, client, enforced_iam
from tests.support.consumers import consumers_file
from tests.support.emf import metric_names
from tests.support.failing_aws import failing_endpoint
from tests.support.k8s_api import RayJobApi, decode_token, sts_token_verifier
from tests.support.runs import Crash, dies_after, run_once

pytestmark = pytest.mark.functional
EVENTS = Path(__file__).resolve().parents[2] / "sam" / "events"
CLUSTER = "icebatch-test"


def event(name: str) -> dict[str, Any]:
    return json.loads((EVENTS / name).read_text())


@pytest.fixture
def k8s(aws_endpoint: str) -> Iterator[RayJobApi]:
    api = RayJobApi(
        namespaces={"icebatch"}, verify_token=sts_token_verifier(CLUSTER, aws_endpoint), forbidden_namespaces={"locked"}
    )
    api.url = api.start()  # type: ignore[attr-defined]
    yield api
    api.stop()


def kube(base: Settings, k8s: RayJobApi, aws_endpoint: str, *consumers: dict[str, Any], **kw: Any) -> Settings:
    """The kuberay backend against the tests' API server, with these consumers (default: triage, threshold 50). A
    consumer launches at its threshold alone (``cost_reference: off``) unless its entry says otherwise: the cost gate
    has tests of its own (``test_a_run_that_does_not_pay_waits...``)."""
    entries = [{"cost_reference": "off", **e} for e in consumers or ({"name": "triage", "backlog_threshold": 50},)]
    values: dict[str, Any] = {
        "backend": "kuberay",
        "eks_cluster": CLUSTER,
        "k8s_api_server": k8s.url,  # type: ignore[attr-defined]
        "aws_endpoint_url": aws_endpoint,
        "aws_region": REGION,
        "consumers_file": consumers_file(base.home / "consumers", *entries),
    }
    return base.with_overrides(**{**values, **kw})


def tickets(s: Settings, n: int, seed: int = 0) -> int:
    table = ensure_source_table(open_catalog(s), s.catalog.source_table)
    return append_tickets(table, generate_tickets(n, random.Random(seed)))


def decide(s: Settings, ev: dict[str, Any]) -> dict[str, Any]:
    """The one consumer's decision (the response holds one per consumer)."""
    response = invoke("launcher", ev, s)
    if response["status"] != "ok":
        return {"decision": response["status"], **response}
    [decision] = response["decisions"]
    decision["manifest"] = response["manifests"][0]
    return dict(decision)


# --------------------------------------------------------------------------------------------------
def test_schedule_creates_one_rayjob_and_a_repeat_is_already_launched(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    s = kube(settings, k8s, aws_endpoint)
    current = tickets(s, 120)
    first = decide(s, event("schedule.json"))
    assert first["decision"] == "launch", first["reason"]
    assert (first["backlog_rows"], first["current_snapshot_id"], first["gpus"]) == (120, current, 1)
    assert k8s.names() == [first["job_name"]]
    created = k8s.objects[("icebatch", first["job_name"])]
    assert created["metadata"]["annotations"]["icebatch.io/to-snapshot"] == str(current)
    assert k8s.identities and k8s.identities[0].startswith("arn:aws:sts::")  # token verified against STS

    again = decide(s, event("schedule.json"))
    assert again["decision"] == "already_launched" and first["job_name"] in again["reason"]
    assert k8s.created() == 1


def test_one_event_evaluates_every_consumer_and_each_gets_its_own_job(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    # given two consumers of the table, with different thresholds
    s = kube(
        settings,
        k8s,
        aws_endpoint,
        {"name": "triage", "backlog_threshold": 50},
        {"name": "privacy", "task": "privacy", "backlog_threshold": 100},
    )
    tickets(s, 60)
    # when one table change arrives
    response = invoke("launcher", event("glue-table-change.json"), s)
    # then each consumer got its own decision: one launched, the other is below its threshold
    by_consumer = {d["consumer"]: d for d in response["decisions"]}
    assert by_consumer["triage"]["decision"] == "launch" and by_consumer["privacy"]["decision"] == "skip"
    assert by_consumer["privacy"]["reason"].startswith("backlog 60 < threshold 100")
    assert k8s.names() == [by_consumer["triage"]["job_name"]]
    # and the nightly drain launches the second consumer's job beside the first
    drained = {d["consumer"]: d for d in invoke("launcher", event("schedule.json"), s)["decisions"]}
    assert drained["privacy"]["decision"] == "launch" and drained["privacy"]["job_name"].startswith("ib-privacy-")
    assert drained["triage"]["decision"] == "already_launched"
    job = k8s.objects[("icebatch", drained["privacy"]["job_name"])]
    assert job["metadata"]["labels"]["icebatch.io/consumer"] == "privacy"
    assert job["metadata"]["annotations"]["icebatch.io/task"] == "ticket-privacy@v1"
    assert len(k8s.names()) == 2


def test_two_deployments_in_one_namespace_do_not_see_each_others_jobs(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    # given the same consumer deployed twice (dev and prod stacks) against one cluster namespace
    dev = kube(settings, k8s, aws_endpoint, deployment="icebatch-dev")
    prod = kube(settings, k8s, aws_endpoint, deployment="icebatch-prod")
    tickets(dev, 60)
    # when both launch, then each has its own job, named apart
    first, second = decide(dev, event("schedule.json")), decide(prod, event("schedule.json"))
    assert (first["decision"], second["decision"]) == ("launch", "launch") and first["job_name"] != second["job_name"]
    # and one deployment's active job does not block the other's next range
    k8s.set_status(first["job_name"], jobDeploymentStatus="Running", jobStatus="RUNNING")
    assert decide(prod, event("schedule.json"))["decision"] == "already_launched"  # its own job, not dev's


def test_a_run_over_the_consumers_budget_is_refused_and_counted(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    # given a consumer whose budget per run is smaller than the estimate of its backlog
    s = kube(
        settings, k8s, aws_endpoint, {"name": "triage", "backlog_threshold": 1, "budget": {"max_usd_per_run": 0.01}}
    )
    tickets(s, 40)
    # when the schedule fires, then nothing is launched, and the record says why and how much
    d = decide(s, event("schedule.json"))
    assert (d["decision"], d["over_budget"]) == ("skip", True) and d["reason"].startswith("over budget")
    assert d["estimate_usd"] > 0.01 and k8s.names() == []


def test_forbidden_is_a_clear_message_naming_the_fix(settings: Settings, k8s: RayJobApi, aws_endpoint: str) -> None:
    s = kube(settings, k8s, aws_endpoint, k8s_namespace="locked")
    tickets(s, 60)
    d = decide(s, event("schedule.json"))
    assert d["decision"] == "error" and d["error_type"] == "ClusterPermissionError"
    assert "403" in d["reason"] and "access entry" in d["reason"] and "rbac.yaml" in d["reason"]


def test_an_unknown_namespace_or_missing_crd_says_what_to_install(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    s = kube(settings, k8s, aws_endpoint, k8s_namespace="nowhere")
    tickets(s, 60)
    d = decide(s, event("schedule.json"))
    assert d["decision"] == "error" and "KubeRay operator" in d["reason"]


@pytest.mark.concurrency
def test_fifty_concurrent_launches_make_exactly_one_job(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a backlog, and 50 launchers of which half see one more snapshot than the others
    s = kube(settings, k8s, aws_endpoint)
    tickets(s, 80)
    # the 25 early launchers and this thread meet once the early ones have read the metadata (however slow
    # their first imports), so the append below really lands between the two views
    before, after = threading.Barrier(26), threading.Barrier(50)
    appended = threading.Event()

    class Racing(ResultsLedger):
        def backlog(self, **kw: Any) -> Any:
            early = threading.current_thread().name.startswith("early")
            if not early:
                appended.wait(30)
            result = super().backlog(**kw)
            if early:
                before.wait(60)
            after.wait(60)  # everyone has computed a backlog: now all submit at once
            return result

    monkeypatch.setattr("icebatch.control.launcher.ResultsLedger", Racing)
    decisions: list[dict[str, Any]] = []
    lock = threading.Lock()
    consumers = load_consumers(s)

    def one() -> None:
        [outcome] = launch(
            parse_trigger(event("schedule.json")),
            s,
            consumers,
            catalog=open_catalog(s, control_plane=True),
            backend=KubeRayBackend.from_settings(s),
        )  # its own catalog and client, like its own container
        with lock:
            decisions.append(outcome.decision.model_dump(mode="json"))

    threads = [threading.Thread(target=one, name=f"{'early' if i < 25 else 'late'}-{i}") for i in range(50)]
    for t in threads[:25]:
        t.start()
    before.wait(60)
    tickets(s, 10, seed=1)
    appended.set()
    for t in threads[25:]:
        t.start()
    for t in threads:
        t.join(60)

    # then exactly one RayJob exists; everyone else was told it is already launched
    assert len(decisions) == 50
    assert len({d["current_snapshot_id"] for d in decisions}) == 2  # the two views really differed
    assert sorted(d["decision"] for d in decisions).count("launch") == 1
    assert {d["decision"] for d in decisions} == {"launch", "already_launched"}
    assert len(k8s.names()) == 1 and k8s.created() == 1


def test_after_a_failed_job_the_next_trigger_launches_again_until_max_attempts(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    s = kube(settings, k8s, aws_endpoint, max_attempts=2)
    tickets(s, 60)
    first = decide(s, event("schedule.json"))
    k8s.set_status(first["job_name"], jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed")
    second = decide(s, event("schedule.json"))
    assert second["decision"] == "launch" and second["attempt"] == 2 and second["job_name"].endswith("-a2")
    # a job that was stopped shows jobDeploymentStatus Complete: it still counts as failed
    k8s.set_status(second["job_name"], jobDeploymentStatus="Complete", jobStatus="STOPPED")
    third = decide(s, event("schedule.json"))
    assert third["decision"] == "skip" and "2 attempts from this watermark failed" in third["reason"]
    assert len(k8s.names()) == 2


def test_a_run_killed_part_way_is_resumed_by_the_next_trigger_whatever_the_threshold(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    # given a launched run of 60 rows whose job committed 2 chunks (20 rows) and was then killed
    s = kube(settings, k8s, aws_endpoint, {"name": "triage", "backlog_threshold": 500}, max_attempts=2)
    tickets(s, 60)
    first = decide(s, event("manual-force.json"))
    ledger = ResultsLedger(open_catalog(s), load_consumers(s)[0])
    plan = ledger.plan(run_id=first["run_id"], to_snapshot_inclusive=first["current_snapshot_id"])
    with pytest.raises(Crash):
        run_once(ledger, plan=plan, chunk_rows=10, transform=dies_after(25))
    k8s.set_status(first["job_name"], jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed")
    # when a few more rows arrive (far below the threshold)
    tickets(s, 5, seed=9)
    second = decide(s, event("glue-table-change.json"))
    # then the next attempt of the same run is launched, over the same pinned range
    assert second["decision"] == "launch", second["reason"]
    assert second["reason"] == f"resume run {first['run_id']}: 20 of 60 rows committed in 2 chunks by 1 attempt"
    assert (second["run_id"], second["attempt"]) == (first["run_id"], 2)
    entrypoint = second["manifest"]["spec"]["entrypoint"]
    assert f"--run-id {first['run_id']}" in entrypoint and f"--to-snapshot {first['current_snapshot_id']}" in entrypoint
    # and when that attempt fails too, the launcher stops and says where the run is stuck
    k8s.set_status(second["job_name"], jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed")
    third = decide(s, event("schedule.json"))
    assert third["decision"] == "skip"
    assert f"2 attempts from this watermark failed (max 2); run {first['run_id']}: 20 of 60" in third["reason"]
    assert "stuck before its next chunk" in third["reason"]


# --------------------------------------------------------------------------------------------------
# decision records
# --------------------------------------------------------------------------------------------------
def test_decision_record_empty_table(settings: Settings, k8s: RayJobApi, aws_endpoint: str) -> None:
    s = kube(settings, k8s, aws_endpoint)
    ensure_source_table(open_catalog(s), s.catalog.source_table)
    d = decide(s, event("schedule.json"))
    assert (d["decision"], d["backlog_rows"], d["current_snapshot_id"]) == ("skip", 0, None)
    assert d["reason"] == "nothing new since the watermark"
    assert set(d) >= {
        "trigger",
        "table",
        "consumer",
        "watermark_snapshot_id",
        "threshold",
        "active_job",
        "reason",
    }


def test_decision_record_below_threshold(settings: Settings, k8s: RayJobApi, aws_endpoint: str) -> None:
    s = kube(settings, k8s, aws_endpoint)
    tickets(s, 30)
    d = decide(s, event("glue-table-change.json"))
    assert (d["decision"], d["trigger"], d["origin"]) == ("skip", "append", "glue")
    assert d["reason"].startswith("backlog 30 < threshold 50") and k8s.names() == []


def test_decision_record_stale_backlog_below_threshold(settings: Settings, k8s: RayJobApi, aws_endpoint: str) -> None:
    import time

    s = kube(settings, k8s, aws_endpoint, {"name": "triage", "backlog_threshold": 50, "max_staleness_seconds": 1})
    tickets(s, 30)
    time.sleep(1.2)
    d = decide(s, event("glue-table-change.json"))
    assert d["decision"] == "launch" and "max staleness 1 s" in d["reason"]


def test_a_run_that_does_not_pay_waits_and_says_how_many_rows_would_make_it_pay(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    # given a consumer with the default cost gate (the cheapest batch API for the same tokens), 60 rows waiting
    s = kube(settings, k8s, aws_endpoint, {"name": "triage", "backlog_threshold": 50, "cost_reference": "cheapest"})
    tickets(s, 60)
    # when a commit event arrives
    d = decide(s, event("glue-table-change.json"))
    # then the launcher waits: the run would cost more per 1k rows (start-up and idle tail included) than the batch
    # APIs charge for its tokens, and the record says by how much and how many rows make it pay
    assert d["decision"] == "wait" and k8s.names() == []
    assert d["usd_per_1k_rows"] > d["ceiling_usd_per_1k_rows"] > 0
    assert d["ceiling_basis"].endswith("for the same tokens") and d["rows_to_pay"] > 60
    assert f"{d['rows_to_pay'] - 60:,} more rows make it pay" in d["reason"]
    assert "of max staleness 21600 s" in d["reason"]
    # and once that many rows wait, the run pays: the next commit launches it
    tickets(s, d["rows_to_pay"] - 60, seed=2)
    launched = decide(s, event("glue-table-change.json"))
    assert launched["decision"] == "launch" and launched["usd_per_1k_rows"] <= launched["ceiling_usd_per_1k_rows"]
    assert "it pays" in launched["reason"] and k8s.names() == [launched["job_name"]]


def test_a_stale_backlog_launches_though_its_run_does_not_pay(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    # given a consumer whose rows must be labelled within 60 s, behind a ceiling no small run meets
    entry = {"name": "triage", "backlog_threshold": 1, "max_staleness_seconds": 60, "max_usd_per_1k_rows": 0.01}
    s = kube(settings, k8s, aws_endpoint, entry)
    tickets(s, 30)
    # when a commit event arrives (a run's start-up alone is longer than 60 s)
    d = decide(s, event("glue-table-change.json"))
    # then it launches anyway, and says why and what it costs
    assert d["decision"] == "launch" and d["usd_per_1k_rows"] > 0.01
    assert ">= max staleness 60 s; launched though $" in d["reason"]
    assert "ceiling $0.0100 (max_usd_per_1k_rows)" in d["reason"]


def test_the_schedule_drains_whatever_the_run_costs(settings: Settings, k8s: RayJobApi, aws_endpoint: str) -> None:
    s = kube(settings, k8s, aws_endpoint, {"name": "triage", "max_usd_per_1k_rows": 0.001})
    tickets(s, 5)
    assert decide(s, event("glue-table-change.json"))["decision"] == "skip"  # below its threshold of 100
    d = decide(s, event("schedule.json"))
    assert d["decision"] == "launch" and d["reason"] == "scheduled drain of 5 rows"
    assert d["usd_per_1k_rows"] > d["ceiling_usd_per_1k_rows"] == 0.001  # recorded, not a reason to wait


def test_decision_record_active_job(settings: Settings, k8s: RayJobApi, aws_endpoint: str) -> None:
    s = kube(settings, k8s, aws_endpoint)
    tickets(s, 60)
    job = decide(s, event("schedule.json"))["job_name"]
    k8s.set_status(job, jobDeploymentStatus="Running", jobStatus="RUNNING")
    tickets(s, 60, seed=2)
    d = decide(s, event("glue-table-change.json"))
    assert (d["decision"], d["active_job"]) == ("already_launched", job)
    # an active job from another range blocks too
    k8s.objects[("icebatch", job)]["metadata"]["labels"]["icebatch.io/from"] = "older"
    d = decide(s, event("glue-table-change.json"))
    assert d["decision"] == "skip" and f"job {job} is still active" in d["reason"]


def test_decision_record_forced_manual_launch(settings: Settings, k8s: RayJobApi, aws_endpoint: str) -> None:
    s = kube(settings, k8s, aws_endpoint)
    tickets(s, 5)
    assert decide(s, event("manual.json"))["decision"] == "skip"
    d = decide(s, event("manual-force.json"))
    assert d["decision"] == "launch" and d["reason"] == "forced manual launch (5 rows)"


def test_decision_record_dry_run(settings: Settings, k8s: RayJobApi, aws_endpoint: str) -> None:
    s = kube(settings, k8s, aws_endpoint, {"name": "triage", "backlog_threshold": 1})
    tickets(s, 5)
    d = decide(s, event("manual-dry-run.json"))
    assert d["decision"] == "dry_run" and d["reason"].startswith("would launch")
    assert d["manifest"]["metadata"]["name"] == d["job_name"]
    assert k8s.names() == [] and k8s.created() == 0


# --------------------------------------------------------------------------------------------------
# malformed and irrelevant events
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(p.name for p in (EVENTS / "malformed").glob("*.json")))
def test_malformed_events_are_rejected_without_raising(
    name: str, settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    s = kube(settings, k8s, aws_endpoint)
    response = invoke("launcher", json.loads((EVENTS / "malformed" / name).read_text()), s)
    assert response["status"] == "rejected" and response["reason"] and response["decisions"] == []
    assert k8s.requests == []  # nothing was asked of the cluster


def test_events_for_other_tables_are_ignored(settings: Settings, k8s: RayJobApi, aws_endpoint: str) -> None:
    s = kube(settings, k8s, aws_endpoint)
    tickets(s, 100)
    d = decide(s, event("glue-other-table.json"))
    assert d["decision"] == "ignored" and "support.invoices" in d["reason"]


def test_s3_metadata_events_on_glue_through_moto(glue_settings: Settings, k8s: RayJobApi, aws_endpoint: str) -> None:
    # given the source table in Glue with its metadata in S3 (moto), and 60 rows waiting
    s = kube(glue_settings, k8s, aws_endpoint)
    tickets(s, 60)
    location = open_catalog(s).load_table(s.catalog.source_table).metadata.location  # s3://bucket/warehouse/...
    bucket, prefix = location.removeprefix("s3://").split("/", 1)
    metadata_key = next(
        o["Key"]
        for o in client("s3", aws_endpoint).list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
        if o["Key"].endswith(".metadata.json")
    )
    ev = event("s3-metadata-object.json")
    ev["detail"]["bucket"]["name"] = bucket
    ev["detail"]["object"]["key"] = metadata_key
    # when the table's metadata object event arrives, then the backlog is read from Glue + S3 and a job launches
    d = decide(s, ev)
    assert (d["decision"], d["origin"], d["backlog_rows"]) == ("launch", "s3", 60)
    # and data files or other prefixes are ignored
    ev["detail"]["object"]["key"] = prefix + "/data/00000-0-x.parquet"
    assert decide(s, ev)["decision"] == "ignored"


def test_eks_describe_cluster_over_moto_is_cached(aws_endpoint: str) -> None:
    eks = client("eks", aws_endpoint)
    eks.create_cluster(
        name="cached", roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={"subnetIds": []}
    )
    calls: list[str] = []
    eks.meta.events.register("before-call.eks.DescribeCluster", lambda **kw: calls.append("describe"))
    _CLUSTERS.pop("cached", None)
    first = cluster_info(eks, "cached")
    second = cluster_info(eks, "cached")
    assert first == second and first.endpoint.startswith("https://") and first.ca_file
    assert calls == ["describe"]


def test_a_role_that_may_not_describe_the_cluster_is_told_what_to_grant_not_retried(aws_endpoint: str) -> None:
    # given a cluster, and a launcher role whose policy lacks eks:DescribeCluster, with IAM enforced: moto answers
    # 403 AccessDenied in an error document botocore cannot read for EKS (its code is then only "403")
    name = f"locked-{uuid.uuid4().hex[:6]}"
    client("eks", aws_endpoint).create_cluster(
        name=name, roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={"subnetIds": []}
    )
    iam = client("iam", aws_endpoint)
    trust = {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    arn = iam.create_role(
        RoleName=name, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [trust]})
    )["Role"]["Arn"]
    only = {"Effect": "Allow", "Action": ["eks:ListClusters"], "Resource": "*"}
    iam.put_role_policy(
        RoleName=name, PolicyName="p", PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [only]})
    )
    with enforced_iam(aws_endpoint):
        eks = client("eks", aws_endpoint, assume(aws_endpoint, arn, "launcher"))
        # when the launcher describes the cluster, then it is a permission error naming the grant (no retry fixes it)
        _CLUSTERS.pop(name, None)
        with pytest.raises(ClusterPermissionError, match="grant the launcher's role eks:DescribeCluster"):
            cluster_info(eks, name)


def test_an_eks_api_that_does_not_answer_is_a_retry_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    # given an EKS endpoint that reads a request and never answers (the launcher's clients: 1 s read timeout here)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setattr(aws_clients, "READ_TIMEOUT_SECONDS", 1)
    with failing_endpoint("silent") as (endpoint, counts):
        eks = boto3.client("eks", region_name=REGION, endpoint_url=endpoint, config=aws_clients.bounded_config())
        _CLUSTERS.pop("silent", None)
        # when the launcher describes the cluster, then it is the transient error Lambda retries (not botocore's)
        with pytest.raises(ClusterUnavailableError, match="cannot reach the EKS API: Read timeout"):
            cluster_info(eks, "silent")
    assert counts["requests"] == 1 + aws_clients.MAX_RETRIES and "silent" not in _CLUSTERS


def test_the_launcher_path_imports_no_pyarrow_ray_or_vllm(settings: Settings) -> None:
    tickets(settings, 10)
    code = (
        "import sys, json; from icebatch.control.handlers.launcher import lambda_handler; "
        "from icebatch.tools.invoke import LocalContext; "
        "r = lambda_handler(json.load(open(sys.argv[1])), LocalContext('launcher')); "
        "bad = [m for m in ('pyarrow', 'ray', 'vllm', 'torch') if m in sys.modules]; "
        "assert not bad, bad; print(' '.join(d['decision'] for d in r['decisions']))"
    )
    # the whole decision (catalog, ledger, gate, manifest), short of running a local job in-process
    env = {
        "ICEBATCH_HOME": str(settings.home),
        "ICEBATCH_DRY_RUN": "true",
        "POWERTOOLS_METRICS_NAMESPACE": "icebatch",
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ["PYTHONPATH"],
    }
    done = subprocess.run(
        [sys.executable, "-c", code, str(EVENTS / "schedule.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "dry_run dry_run"  # both consumers of the default file


@pytest.mark.parametrize(
    ("region", "host"),
    [
        ("us-east-1", "sts.us-east-1.amazonaws.com"),
        ("cn-north-1", "sts.cn-north-1.amazonaws.com.cn"),
        ("us-gov-west-1", "sts.us-gov-west-1.amazonaws.com"),
    ],
)
def test_tokens_carry_the_partitions_real_sts_endpoint_whatever_the_override(
    region: str, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from icebatch.control.backends.eks_auth import mint_token

    from tests.support.k8s_api import decode_token

    # given an endpoint override for every AWS client (as in these tests, or LocalStack)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    session = boto3.session.Session(region_name=region, aws_access_key_id="AKIATEST", aws_secret_access_key="x")
    # when a token is minted, then it names the real STS endpoint of the region's partition (EKS checks it)
    url = decode_token(mint_token(session, CLUSTER, region))
    assert url.startswith(f"https://{host}/?Action=GetCallerIdentity")
    assert "X-Amz-Expires=60" in url and "x-k8s-aws-id" in url and "AKIATEST" in url


def test_with_iam_enforced_a_token_is_checked_as_sts_checks_it_and_names_its_role(aws_endpoint: str) -> None:
    from icebatch.control.backends.eks_auth import mint_token

    # given a role, a session of it, and the EKS token verifier that knows that session (IAM enforced)
    iam, name = client("iam", aws_endpoint), f"token-{uuid.uuid4().hex[:6]}"
    trust = {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    arn = iam.create_role(
        RoleName=name, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [trust]})
    )["Role"]["Arn"]
    with enforced_iam(aws_endpoint):
        session = assume(aws_endpoint, arn, "launcher")
        verify = sts_token_verifier(CLUSTER, aws_endpoint, {session["AWS_ACCESS_KEY_ID"]: session})
        boto = boto3.session.Session(
            region_name=REGION,
            aws_access_key_id=session["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=session["AWS_SECRET_ACCESS_KEY"],
            aws_session_token=session["AWS_SESSION_TOKEN"],
        )
        token = mint_token(boto, CLUSTER, REGION)
        # when the launcher's token is verified, then it is the role's session, as STS names it
        assert verify(token) == f"arn:aws:sts::123456789012:assumed-role/{name}/launcher"
        # and a token shown to another cluster, or with its signature altered, or of an unknown session, is refused
        sessions = {session["AWS_ACCESS_KEY_ID"]: session}
        with pytest.raises(PermissionError, match="signature does not match"):
            sts_token_verifier("another-cluster", aws_endpoint, sessions)(token)
        url = decode_token(token)
        altered = url[:-4] + ("0000" if not url.endswith("0000") else "1111")
        with pytest.raises(PermissionError, match="signature does not match"):
            verify(TOKEN_PREFIX + base64.urlsafe_b64encode(altered.encode()).decode().rstrip("="))
        with pytest.raises(PermissionError, match="unknown session"):
            sts_token_verifier(CLUSTER, aws_endpoint, {})(token)


def test_a_catalog_that_cannot_be_reached_is_retried_and_counted(
    settings: Settings, capfd: pytest.CaptureFixture[str]
) -> None:
    # given a launcher whose Glue catalog does not answer
    down = settings.with_overrides(
        catalog_type="glue",
        catalog_properties={
            "glue.endpoint": "http://127.0.0.1:9",
            "glue.region": "us-east-1",
            "glue.access-key-id": "x",
            "glue.secret-access-key": "y",
            "glue.max-retries": "1",
        },
    )
    # when the nightly schedule fires, then the error is raised (Lambda retries, then dead-letters)
    with pytest.raises(CatalogUnavailableError):
        invoke("launcher", event("schedule.json"), down)
    out, err = capfd.readouterr()
    # and the retry is counted in the EMF it prints, so that retries show on the dashboard before dead letters
    assert "TransientErrors" in metric_names(out)
    assert "No application metrics to publish" not in err


def _model_folder(path: Path, **config: Any) -> str:
    """A model folder as the engine reads it, with this config.json (a published model's figures)."""
    path.mkdir(parents=True)
    base = {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "vocab_size": 128256,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "torch_dtype": "bfloat16",
    }
    (path / "config.json").write_text(json.dumps({**base, **config}))
    return str(path)


def test_a_model_too_big_for_the_gpu_worker_is_refused_before_a_gpu_node_is_bought(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str, tmp_path: Path
) -> None:
    # given a backlog over the threshold, and a consumer whose model is a 70B one in bfloat16 (131 GiB of
    # weights) while the deployment's GPU worker has one 24 GB GPU
    seventy = _model_folder(
        tmp_path / "llama-70b", hidden_size=8192, num_hidden_layers=80, intermediate_size=28672, num_attention_heads=64
    )
    s = kube(settings, k8s, aws_endpoint, {"name": "triage", "backlog_threshold": 50, "model": seventy})
    tickets(s, 60)
    # when the schedule fires
    d = decide(s, event("schedule.json"))
    # then the launcher refuses the consumer (permanent: no job, one line with the arithmetic and the fixes)
    assert d["decision"] == "invalid_task" and d["job_name"] is None and k8s.names() == [], d
    assert "70.6 B parameters" in d["reason"] and "ICEBATCH_TENSOR_PARALLEL_SIZE" in d["reason"], d["reason"]
    # and an 8B model on the same worker is launched
    eight = _model_folder(tmp_path / "llama-8b")
    s = kube(settings, k8s, aws_endpoint, {"name": "triage", "backlog_threshold": 50, "model": eight})
    assert decide(s, event("schedule.json"))["decision"] == "launch"


def test_a_model_on_s3_is_sized_from_its_config_as_the_engine_would_read_it(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    # given the model prefix on S3 (moto over HTTP) holding a 70B model's config.json and no index
    s3 = client("s3", aws_endpoint)
    bucket = f"models-{os.getpid()}-{random.randrange(10**6)}"
    s3.create_bucket(Bucket=bucket)
    config = {
        "hidden_size": 8192,
        "num_hidden_layers": 80,
        "vocab_size": 128256,
        "intermediate_size": 28672,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "torch_dtype": "bfloat16",
    }
    s3.put_object(Bucket=bucket, Key="llama-70b/config.json", Body=json.dumps(config).encode())
    s = kube(settings, k8s, aws_endpoint, model_source=f"s3://{bucket}/llama-70b/")
    tickets(s, 60)
    # when the schedule fires, then the launcher refuses it before any job, from the config alone
    d = decide(s, event("schedule.json"))
    assert d["decision"] == "invalid_task" and k8s.names() == [], d
    assert "(config.json)" in d["reason"] and f"s3://{bucket}/llama-70b/" in d["reason"], d["reason"]


def _bus_events(s: Settings) -> list[dict[str, Any]]:
    """What the local bus carried (its log), oldest first."""
    path = s.home / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _labelled_on_kuberay(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> tuple[Settings, ResultsLedger, list[str]]:
    """The kuberay backend, one consumer (threshold 500) that labelled its source's 60 rows; their ids, sorted."""
    s = kube(settings, k8s, aws_endpoint, {"name": "triage", "backlog_threshold": 500})
    tickets(s, 60)
    ledger = ResultsLedger(open_catalog(s), load_consumers(s)[0])
    assert run_once(ledger) is not None
    return s, ledger, sorted(ledger.source().scan(selected_fields=("ticket_id",)).to_arrow().column(0).to_pylist())


def test_rows_deleted_since_the_watermark_launch_a_run_with_no_gpu_to_remove_their_verdicts(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    from pyiceberg.expressions import In

    from tests.support.crd import errors

    # given a consumer that labelled 60 rows (far below its threshold of 500 ever after)
    s, ledger, ids = _labelled_on_kuberay(settings, k8s, aws_endpoint)
    # when two of its rows are erased from the source and the table-change event arrives
    ledger.source().delete(In("ticket_id", ids[:2]))
    d = decide(s, event("glue-table-change.json"))
    # then a run is launched at once, whatever the threshold, to remove their verdicts ...
    assert d["decision"] == "launch" and d["reason"].startswith("2 deleted and "), d["reason"]
    # ... with no GPU worker (the job runs on the head: no model, no engine), a RayJob the CRDs accept
    worker = d["manifest"]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert (worker["replicas"], worker["minReplicas"], worker["maxReplicas"]) == (0, 0, 0)
    assert errors(d["manifest"], "v1.7.0") == [] and errors(d["manifest"], "v1.6.1") == []
    head_env = {
        e["name"]: e.get("value")
        for e in d["manifest"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert head_env["ICEBATCH_CONCURRENCY"] == "1"
    # and with nothing deleted and nothing new, nothing is launched
    s2 = kube(settings.with_overrides(home=settings.home / "other"), k8s, aws_endpoint)
    tickets(s2, 10)
    assert run_once(ResultsLedger(open_catalog(s2), load_consumers(s2)[0])) is not None
    assert decide(s2, event("glue-table-change.json"))["decision"] == "skip"


def test_a_kuberay_retry_of_a_job_whose_run_committed_ends_ok_and_commits_nothing_twice(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import shlex

    from icebatch_job.cli import build_parser, run_command
    from pyiceberg.expressions import In

    # given a consumer that labelled 60 rows, two of them deleted since, and the launch that follows
    s, ledger, ids = _labelled_on_kuberay(settings, k8s, aws_endpoint)
    ledger.source().delete(In("ticket_id", ids[:2]))
    d = decide(s, event("glue-table-change.json"))
    assert d["decision"] == "launch"
    pod = s.with_overrides(job_engine="off", job_consumer=load_consumers(s)[0].to_json())
    argv = shlex.split(d["manifest"]["spec"]["entrypoint"])[3:]  # after `python -m icebatch_job`, as the pod runs it
    # when the pod's entrypoint runs, commits its range, and KubeRay runs it again (its RayJob failed after the
    # commit: another consumer's run in a shared job, or the event after the commit, failed)
    assert run_command(build_parser().parse_args(argv), pod) == 0
    head = ledger.results().refresh().current_snapshot().snapshot_id  # type: ignore[union-attr]
    watermark = ledger.watermark()
    capsys.readouterr()
    retried = run_command(build_parser().parse_args(argv), pod)
    # then the retry ends 0 (not 5, a conflict: a failed RayJob, retried again) and says why, commits nothing,
    # moves no watermark and reports no failure
    assert retried == 0
    assert f"run {d['run_id']} already committed its range" in capsys.readouterr().out
    assert ledger.results().refresh().current_snapshot().snapshot_id == head  # type: ignore[union-attr]
    assert ledger.watermark() == watermark and watermark.run_id == d["run_id"]
    assert not [e for e in _bus_events(s) if e["detail-type"] == "Batch Job Failed"]
    # and a run from the same watermark that is not this one still conflicts (the range is someone else's)
    other = [a if a != d["run_id"] else f"{d['run_id']}x" for a in argv]
    assert run_command(build_parser().parse_args(other), pod) == 5


def test_rows_changed_by_a_copy_on_write_update_are_labelled_by_the_next_attempt_with_a_gpu(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    from icebatch_job.job import JobRequest, run_job

    from tests.support.crafted_history import update_copy_on_write

    # given a consumer that labelled 60 rows, then a copy-on-write UPDATE of three of them (one `overwrite`
    # snapshot, as Spark's UPDATE or MERGE leaves it: their files rewritten, nothing appended)
    s, ledger, ids = _labelled_on_kuberay(settings, k8s, aws_endpoint)
    ids = ids[:3]

    def reopen(rows: Any) -> Any:
        subjects = [
            f"{s} (reopened)" if i in ids else s
            for i, s in zip(rows["ticket_id"].to_pylist(), rows["subject"].to_pylist(), strict=True)
        ]
        return rows.set_column(
            rows.schema.get_field_index("subject"), "subject", pa.array(subjects, rows["subject"].type)
        )

    update_copy_on_write(ledger.source(), reopen)
    # when the table-change event arrives, the launcher launches a run with no GPU worker, its job told so
    first = decide(s, event("glue-table-change.json"))
    assert first["decision"] == "launch" and "rewritten (copy-on-write)" in first["reason"], first["reason"]
    spec = first["manifest"]["spec"]["rayClusterSpec"]
    assert spec["workerGroupSpecs"][0]["replicas"] == 0
    pod_env = {e["name"]: e["value"] for e in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    assert pod_env["ICEBATCH_JOB_ENGINE"] == "off"
    # and that job, run with its pod's settings, starts no engine for the changed rows: it ends deferred (exit 0,
    # not a failure), committing nothing
    head = ledger.results().current_snapshot().snapshot_id  # type: ignore[union-attr]
    pod = s.with_overrides(job_engine="off", job_consumer=load_consumers(s)[0].to_json())
    request = JobRequest(
        run_id=first["run_id"], to_snapshot=first["current_snapshot_id"], rayjob_name=first["job_name"]
    )
    result = run_job(pod, request, out=lambda _: None)
    assert result.status == "deferred"
    assert ledger.results().refresh().current_snapshot().snapshot_id == head  # type: ignore[union-attr]
    # and says so on the bus: "Batch Job Deferred", naming its RayJob (whose status in the cluster still lags)
    [deferred] = [e for e in _bus_events(s) if e["detail-type"] == "Batch Job Deferred"]
    assert (deferred["detail"]["rayjob_name"], deferred["detail"]["rows_for_the_model"]) == (first["job_name"], 3)
    assert not k8s.objects[("icebatch", first["job_name"])].get("status", {}).get("jobStatus")
    # when that event reaches the launcher (its rule as deployed), the range's next attempt is launched at once,
    # with a GPU worker and the model
    second = decide(s, deferred)
    assert second["decision"] == "launch" and "this one has the model" in second["reason"], second["reason"]
    assert second["origin"] == "deferred" and second["job_name"] != first["job_name"]
    assert second["manifest"]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] >= 1
    assert "ICEBATCH_JOB_ENGINE" not in {
        e["name"]
        for e in second["manifest"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    # and, run, it labels exactly the three changed rows, whose new verdicts replace the old
    run = run_once(ledger)
    assert run is not None and run.stats.rows == 3
    verdicts = ledger.results().scan(selected_fields=("source_id", "summary")).to_arrow().to_pylist()  # type: ignore[union-attr]
    assert sorted(v["source_id"] for v in verdicts) == sorted(set(v["source_id"] for v in verdicts))
    assert sorted(v["source_id"] for v in verdicts if v["summary"].endswith("(reopened)")) == ids


def test_consumers_of_one_model_due_at_once_share_one_rayjob_which_is_each_ones_job(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str, tmp_path: Path
) -> None:
    # given two consumers of the table on the deployment's model, and a third on a model of its own
    eight = _model_folder(tmp_path / "llama-8b")
    s = kube(
        settings,
        k8s,
        aws_endpoint,
        {"name": "triage", "backlog_threshold": 50},
        {"name": "privacy", "task": "privacy", "backlog_threshold": 50},
        {"name": "other", "backlog_threshold": 50, "model": eight},
    )
    tickets(s, 60)
    # when the schedule fires
    response = invoke("launcher", event("schedule.json"), s)
    by_consumer = {d["consumer"]: d for d in response["decisions"]}
    # then triage and privacy launch in one RayJob (named for triage), each its own run; the other model has its own
    triage, privacy, other = by_consumer["triage"], by_consumer["privacy"], by_consumer["other"]
    assert {d["decision"] for d in by_consumer.values()} == {"launch"}, by_consumer
    assert triage["job_name"] == privacy["job_name"] != other["job_name"]
    assert triage["run_id"] != privacy["run_id"]
    assert "one job with privacy (one engine)" in triage["reason"] and "in triage's job" in privacy["reason"]
    assert sorted(k8s.names()) == sorted([triage["job_name"], other["job_name"]])
    job = k8s.objects[("icebatch", triage["job_name"])]
    entrypoint = job["spec"]["entrypoint"]
    assert f"--with privacy:{privacy['run_id']}:none:{privacy['current_snapshot_id']}" in entrypoint
    assert "--with" not in k8s.objects[("icebatch", other["job_name"])]["spec"]["entrypoint"]
    # and while the shared job runs, the next trigger finds it as both consumers' job: nothing more is launched
    k8s.set_status(triage["job_name"], jobDeploymentStatus="Running", jobStatus="RUNNING")
    again = {d["consumer"]: d for d in invoke("launcher", event("schedule.json"), s)["decisions"]}
    assert again["triage"]["decision"] == again["privacy"]["decision"] == "already_launched", again
    assert again["privacy"]["active_job"] == triage["job_name"]
    # and once it failed (a run in it failed), each consumer's next attempt is launched, shared again
    k8s.set_status(triage["job_name"], jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed")
    retry = {d["consumer"]: d for d in invoke("launcher", event("schedule.json"), s)["decisions"]}
    assert retry["triage"]["attempt"] == retry["privacy"]["attempt"] == 2
    assert retry["triage"]["job_name"] == retry["privacy"]["job_name"] and retry["triage"]["decision"] == "launch"
    assert len(k8s.names()) == 3


def test_a_shared_rayjob_that_died_silently_is_reported_for_each_run_it_left_unfinished(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    from datetime import UTC, timedelta

    # given triage and privacy launched in one RayJob by the schedule
    s = kube(
        settings,
        k8s,
        aws_endpoint,
        {"name": "triage", "backlog_threshold": 50},
        {"name": "privacy", "task": "privacy", "backlog_threshold": 50},
    )
    tickets(s, 60)
    launched = {d["consumer"]: d for d in invoke("launcher", event("schedule.json"), s)["decisions"]}
    triage, privacy = launched["triage"], launched["privacy"]
    assert triage["job_name"] == privacy["job_name"]
    # when in it triage's run completes, privacy's commits a chunk of 8 rows, and the node is lost: the RayJob ends
    # failed and no run reports it
    consumers = {c.name: c for c in load_consumers(s)}
    for name, decision, dies in (("triage", triage, None), ("privacy", privacy, dies_after(12))):
        ledger = ResultsLedger(open_catalog(s), consumers[name])
        plan = ledger.plan(run_id=decision["run_id"], to_snapshot_inclusive=decision["current_snapshot_id"])
        if dies is None:
            assert run_once(ledger, plan=plan) is not None
        else:
            with pytest.raises(Crash):
                run_once(ledger, plan=plan, chunk_rows=8, transform=dies)
    ended = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    k8s.set_status(triage["job_name"], jobDeploymentStatus="Failed", reason="DeadlineExceeded", endTime=ended)
    # then the next schedule reports privacy's run as failed, from its own run id and range (not triage's, which
    # completed), and launches its next attempt
    after = {d["consumer"]: d for d in invoke("launcher", event("schedule.json"), s)["decisions"]}
    failed = [e["detail"] for e in _bus_events(s) if e["detail-type"] == "Batch Job Failed"]
    assert [(f["consumer"], f["run_id"], f["origin"]) for f in failed] == [("privacy", privacy["run_id"], "reconciler")]
    assert failed[0]["rows_committed"] == 8 and failed[0]["rayjob_name"] == triage["job_name"]
    assert failed[0]["range"] == {"from_exclusive": None, "to_inclusive": privacy["current_snapshot_id"]}
    assert after["privacy"]["decision"] == "launch" and after["privacy"]["run_id"] == privacy["run_id"]
    # and the schedule after reports it no more
    invoke("launcher", event("schedule.json"), s)
    assert len([e for e in _bus_events(s) if e["detail-type"] == "Batch Job Failed"]) == 1


def test_with_share_jobs_off_each_consumer_gets_its_own_job(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    s = kube(
        settings,
        k8s,
        aws_endpoint,
        {"name": "triage", "backlog_threshold": 50},
        {"name": "privacy", "task": "privacy", "backlog_threshold": 50},
        share_jobs=False,
    )
    tickets(s, 60)
    decisions = invoke("launcher", event("schedule.json"), s)["decisions"]
    assert [d["decision"] for d in decisions] == ["launch", "launch"]
    assert len({d["job_name"] for d in decisions}) == 2 == len(k8s.names())
    assert all("--with" not in o["spec"]["entrypoint"] for o in k8s.objects.values())


def test_consumers_whose_runs_pay_only_together_launch_together(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from icebatch.tools.cli.data import cmd_backlog, cmd_estimate

    # given two consumers of one model, each with the default cost gate, and 60 tickets: not enough to pay, together
    entries = (
        {"name": "triage", "backlog_threshold": 50, "cost_reference": "cheapest"},
        {"name": "privacy", "task": "privacy", "backlog_threshold": 50, "cost_reference": "cheapest"},
    )
    s = kube(settings, k8s, aws_endpoint, *entries)
    alone = kube(settings, k8s, aws_endpoint, *entries, share_jobs=False)
    tickets(s, 60)
    waiting = invoke("launcher", event("glue-table-change.json"), s)["decisions"]
    assert [d["decision"] for d in waiting] == ["wait", "wait"], waiting
    assert "priced with privacy's rows: one job" in waiting[0]["reason"]
    # and `icebatch backlog` and `icebatch estimate` price them as the launcher does
    capsys.readouterr()  # the handler's records
    assert cmd_backlog(argparse.Namespace(consumer=None, json=True), s) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [b["priced_with"] for b in listed] == [["privacy"], ["triage"]]
    assert [b["cost_gate"]["rows_to_pay"] for b in listed] == [d["rows_to_pay"] for d in waiting]
    assert cmd_estimate(argparse.Namespace(consumer=None, json=False), s) == 0
    assert capsys.readouterr().out.count("(priced with") == 2
    # when half the rows that make the shared run pay land for each (one start-up for both consumers' rows)
    together = waiting[0]["rows_to_pay"]
    tickets(s, -(-together // 2) - 60, seed=2)
    # then each consumer's run alone still does not pay, and the two together launch, in one job
    assert [d["decision"] for d in invoke("launcher", event("glue-table-change.json"), alone)["decisions"]] == [
        "wait",
        "wait",
    ]
    launched = invoke("launcher", event("glue-table-change.json"), s)["decisions"]
    assert [d["decision"] for d in launched] == ["launch", "launch"], launched
    assert launched[0]["job_name"] == launched[1]["job_name"] and len(k8s.names()) == 1


def test_a_consumer_its_budget_refuses_leaves_the_group_and_the_other_is_priced_without_its_rows(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from icebatch.tools.cli.data import cmd_backlog, cmd_estimate

    # given two consumers of one model, each with the default cost gate, triage with a budget per run below any run
    entries = (
        {"name": "triage", "backlog_threshold": 50, "cost_reference": "cheapest", "budget": {"max_usd_per_run": 1e-6}},
        {"name": "privacy", "task": "privacy", "backlog_threshold": 50, "cost_reference": "cheapest"},
    )
    s = kube(settings, k8s, aws_endpoint, *entries)
    tickets(s, 60)
    waiting = invoke("launcher", event("glue-table-change.json"), s)["decisions"]
    # and as many rows as make their runs pay together (one start-up for both), but not privacy's alone
    together = waiting[1]["rows_to_pay"]
    assert together is not None
    tickets(s, -(-together // 2) - 60, seed=2)
    # when the next commit's event arrives
    decided = {d["consumer"]: d for d in invoke("launcher", event("glue-table-change.json"), s)["decisions"]}
    # then triage's budget refuses its run, and privacy, priced alone (the job it would run), waits: its price is
    # not the one of a job with triage's rows, which will not run
    assert decided["triage"]["decision"] == "skip" and decided["triage"]["over_budget"], decided["triage"]
    privacy = decided["privacy"]
    assert privacy["decision"] == "wait" and "priced with" not in privacy["reason"], privacy
    assert privacy["rows_to_pay"] > together and k8s.names() == []
    # and `icebatch backlog` and `icebatch estimate` price them as the launcher does: each alone, triage's line
    # saying why
    capsys.readouterr()  # the handler's records
    assert cmd_backlog(argparse.Namespace(consumer=None, json=True), s) == 0
    listed = {b["consumer"]: b for b in json.loads(capsys.readouterr().out)}
    assert [listed[n]["priced_with"] for n in ("triage", "privacy")] == [[], []]
    assert listed["privacy"]["cost_gate"]["rows_to_pay"] == privacy["rows_to_pay"]
    assert cmd_estimate(argparse.Namespace(consumer=None, json=True), s) == 0
    estimated = {e["consumer"]: e for e in json.loads(capsys.readouterr().out)}
    assert "priced alone: over budget: the run is estimated at" in estimated["triage"]["cost_gate_summary"]
    assert estimated["privacy"]["priced_with"] == [] and "priced" not in estimated["privacy"]["cost_gate_summary"]


@pytest.mark.parametrize(("before", "billed"), [(95, True), (4000, False)])
def test_the_time_before_the_jobs_process_is_measured_from_the_launch_and_billed(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str, before: int, billed: bool
) -> None:
    from icebatch.core.ledger import Key
    from icebatch_job.job import JobRequest, run_job
    from pyiceberg.expressions import In

    # given a consumer that labelled 60 rows, two of them deleted since, and the launch that follows
    s, ledger, ids = _labelled_on_kuberay(settings, k8s, aws_endpoint)
    ledger.source().delete(In("ticket_id", ids[:2]))
    d = decide(s, event("glue-table-change.json"))
    pod_env = {
        e["name"]: e["value"]
        for e in d["manifest"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    }
    launched = float(pod_env["ICEBATCH_JOB_LAUNCHED_AT"])
    assert abs(launched - datetime.fromisoformat(d["decided_at"]).timestamp()) < 1
    # when its job's process starts `before` seconds after the launch (the GPU node, the image, the Ray cluster;
    # 4000 s: more than a cluster may take to start, a KubeRay retry of the same RayJob)
    pod = s.with_overrides(
        job_engine="off", job_consumer=load_consumers(s)[0].to_json(), job_launched_at=launched - before
    )
    request = JobRequest(run_id=d["run_id"], to_snapshot=d["current_snapshot_id"], rayjob_name=d["job_name"])
    result = run_job(pod, request, out=lambda _: None)
    assert result.status == "completed" and result.completed is not None
    # then the run records that time (or none for a retry), its event carries it, its report says it, and the
    # node's lifetime bills it
    recorded = next(r for r in ledger.runs() if r.run_id == d["run_id"])
    seconds = result.completed.before_job_seconds
    if billed:
        assert before <= seconds < before + 30 and recorded.number(Key.BEFORE_JOB_SECONDS) == round(seconds, 3)
        assert result.completed.cost.gpu_lifetime_seconds >= seconds + result.completed.job_seconds
        report = (s.home / "reports" / f"{d['run_id']}.completed.txt").read_text()
        # this machine was up before the launch: no node start, no image pull, all of it before the process
        assert (result.completed.before_job_node_seconds, result.completed.before_job_image_seconds) == (0, 0)
        split = re.search(
            r"before the job +: (.+?) \(GPU node 0\.0 s, joining and image pull 0\.0 s, Ray cluster (.+?)\)", report
        )
        assert split is not None and split[1] == split[2], report
    else:
        assert seconds == 0 and Key.BEFORE_JOB_SECONDS not in recorded.properties
        assert Key.BEFORE_JOB_NODE_SECONDS not in recorded.properties


def _kernel_clock() -> tuple[int, float]:
    """This machine's boot (/proc/stat's btime) and its PID 1's start (/proc/1/stat's starttime, in clock ticks
    after the boot), read here from the kernel's files, not through the library the job uses."""
    btime = next(
        int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
    )
    ticks = int(Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19])
    return btime, btime + ticks / os.sysconf("SC_CLK_TCK")


def test_the_time_before_the_job_is_split_where_the_nodes_kernel_says_it_went(
    settings: Settings, k8s: RayJobApi, aws_endpoint: str
) -> None:
    from icebatch.core.ledger import Key
    from icebatch_job.job import JobRequest, run_job
    from pyiceberg.expressions import In

    # given a launch, two rows deleted since a consumer labelled 60
    s, ledger, ids = _labelled_on_kuberay(settings, k8s, aws_endpoint)
    ledger.source().delete(In("ticket_id", ids[:2]))
    d = decide(s, event("glue-table-change.json"))
    # when its job's process runs on a node that booted 30 s after the launch (this machine, launched 30 s before
    # its boot: a node Karpenter started for the job), within the start deadline
    booted, container = _kernel_clock()
    launched = booted - 30
    if time.time() - launched > 7 * 86400 - 60:
        pytest.skip("this machine has been up longer than a RayJob may take to start")
    pod = s.with_overrides(
        job_engine="off",
        job_consumer=load_consumers(s)[0].to_json(),
        job_launched_at=launched,
        job_start_deadline_seconds=7 * 86400,
    )
    request = JobRequest(run_id=d["run_id"], to_snapshot=d["current_snapshot_id"], rayjob_name=d["job_name"])
    result = run_job(pod, request, out=lambda _: None)
    # then the run records 30 s to the node's boot, then to its container's start, the rest to the Ray cluster,
    # adding up to the whole, in the ledger, the event and the report
    done = result.completed
    assert done is not None and done.before_job_node_seconds is not None and done.before_job_image_seconds is not None
    assert done.before_job_node_seconds == pytest.approx(30, abs=0.01)
    assert done.before_job_image_seconds == pytest.approx(container - booted, abs=0.05)
    recorded = next(r for r in ledger.runs() if r.run_id == d["run_id"])
    assert recorded.number(Key.BEFORE_JOB_NODE_SECONDS) == pytest.approx(30, abs=0.01)
    assert recorded.number(Key.BEFORE_JOB_IMAGE_SECONDS) == pytest.approx(container - booted, abs=0.05)
    ray_seconds = done.before_job_seconds - 30 - (container - booted)
    assert 0 < ray_seconds < done.before_job_seconds
    report = (s.home / "reports" / f"{d['run_id']}.completed.txt").read_text()
    assert "(GPU node 30.0 s, joining and image pull " in report
