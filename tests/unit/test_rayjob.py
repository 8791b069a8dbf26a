from __future__ import annotations

import gzip
import json
import re
import shlex
from datetime import UTC, datetime

import pytest
from icebatch.control.jobs import job_state, members
from icebatch.control.rayjob import JobSpec, build_rayjob_manifest, job_env, job_name, range_tag
from icebatch.control.reconcile import failure_event
from icebatch.core.consumers import Consumer, load_consumers
from icebatch.core.costs.estimate import gpus_for
from icebatch.core.errors import ConfigError
from icebatch.core.settings import Settings
from icebatch_job.cli import build_parser

from tests.support.consumers import triage
from tests.support.crd import CRD_DIR, SHARED_DIR, VERSIONS, errors

pytestmark = pytest.mark.unit
S = Settings(
    backend="kuberay",
    eks_cluster="prod",
    deployment="icebatch-prod",
    job_image="123.dkr.ecr.us-east-1.amazonaws.com/icebatch-job:1",
    catalog_type="glue",
    warehouse="s3://wh/warehouse",
    model_source="s3://models/llama-3.1-8b/",
)
TRIAGE = triage(S)


def spec(**kw) -> JobSpec:  # type: ignore[no-untyped-def]
    tag = range_tag("icebatch-prod", "triage", 1, 123)
    base = dict(
        name=job_name("triage", tag, 1),
        run_id="triage-20261129T020000-abcdef",
        deployment="icebatch-prod",
        consumer=TRIAGE,
        tag=tag,
        from_snapshot=123,
        to_snapshot=456,
        backlog_rows=5000,
        gpus=2,
        attempt=1,
        trigger="schedule/scheduler",
    )
    return JobSpec(**{**base, **kw})


def test_names_are_dns_safe_short_and_depend_on_deployment_consumer_version_watermark_attempt() -> None:
    tag = range_tag("prod", "triage", 1, 123)
    a, b = job_name("triage", tag, 1), job_name("triage", range_tag("prod", "triage", 1, 123), 1)
    assert a == b and a != job_name("triage", tag, 2)
    others = {
        range_tag("dev", "triage", 1, 123),
        range_tag("prod", "triage", 2, 123),
        range_tag("prod", "triage", 1, 124),
    }
    assert tag not in others and len(others) == 3
    longest = job_name("a" * 20, range_tag("x" * 64, "a" * 20, 99, 2**63 - 1), 99)
    assert len(longest) <= 47
    for name in (a, longest, job_name("x-y", range_tag("local", "x-y", 1, None), 1)):
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name


@pytest.mark.parametrize(("rows", "gpus"), [(1, 1), (120_000, 1), (120_001, 2), (600_000, 4), (10**9, 4)])
def test_gpus_scale_with_backlog_up_to_the_consumers_cap(rows: int, gpus: int) -> None:
    assert gpus_for(rows, TRIAGE, S) == gpus
    assert gpus_for(10**9, TRIAGE.model_copy(update={"max_gpus": 2}), S) == 2


@pytest.mark.parametrize("version", VERSIONS)
def test_manifest_validates_strictly_against_the_crd(version: str) -> None:
    assert errors(build_rayjob_manifest(S, spec()), version) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_the_start_deadline_follows_its_setting_and_zero_leaves_it_out(version: str) -> None:
    # given a start deadline of 10 minutes, and none
    timely = build_rayjob_manifest(S.with_overrides(job_start_deadline_seconds=600), spec())
    patient = build_rayjob_manifest(S.with_overrides(job_start_deadline_seconds=0), spec())
    # then the first RayJob has it and the second has no such field (KubeRay: at least 1 s), both valid
    assert timely["spec"]["preRunningDeadlineSeconds"] == 600
    assert "preRunningDeadlineSeconds" not in patient["spec"]
    assert errors(timely, version) == errors(patient, version) == []


def test_strict_validation_catches_unknown_fields() -> None:
    m = build_rayjob_manifest(S, spec())
    m["spec"]["shutdownAfterJobsFinish"] = True
    m["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 2
    problems = errors(m, "v1.7.0")
    assert any("shutdownAfterJobsFinish" in p for p in problems) and any("'replica'" in p for p in problems)


def test_manifest_shape() -> None:
    m = build_rayjob_manifest(S, spec())
    s = m["spec"]
    assert (s["shutdownAfterJobFinishes"], s["ttlSecondsAfterFinished"], s["backoffLimit"]) == (True, 60, 1)
    assert s["activeDeadlineSeconds"] == 4 * 3600
    assert s["preRunningDeadlineSeconds"] == 1800  # no GPU node or image in 30 min: failed, not 4 h of waiting
    assert s["entrypoint"] == (
        "python -m icebatch_job run --run-id triage-20261129T020000-abcdef --from-snapshot 123 --to-snapshot 456 "
        "--rayjob-name " + spec().name
    )
    head = s["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert "nvidia.com/gpu" not in str(head)
    worker = s["rayClusterSpec"]["workerGroupSpecs"][0]
    assert worker["replicas"] == worker["minReplicas"] == worker["maxReplicas"] == 2
    pod = worker["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"karpenter.sh/nodepool": "icebatch-gpu"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu" and pod["serviceAccountName"] == "icebatch-job"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == S.cluster.gpu_instance_types
    labels = m["metadata"]["labels"]
    assert (labels["icebatch.io/consumer"], labels["icebatch.io/deployment"]) == ("triage", "icebatch-prod")
    assert m["metadata"]["annotations"]["icebatch.io/task"] == "ticket-triage@v1"


def test_the_pod_gets_every_job_setting_and_its_consumer_and_nothing_of_the_launchers() -> None:
    env = {e["name"]: e["value"] for e in job_env(S, spec())}
    assert env["ICEBATCH_CATALOG_TYPE"] == "glue" and env["ICEBATCH_MODEL_SOURCE"] == "s3://models/llama-3.1-8b/"
    assert env["ICEBATCH_CONCURRENCY"] == "2" and env["ICEBATCH_BACKEND"] == "kuberay"
    assert env["ICEBATCH_DEPLOYMENT"] == "icebatch-prod" and env["ICEBATCH_HOME"] == "/tmp/icebatch"
    assert "ICEBATCH_JOB_IMAGE" not in env and "ICEBATCH_MAX_ATTEMPTS" not in env  # the launcher's business
    # the pod reads back exactly what it was given: its consumer, task included, and the same billing
    reparsed = Settings.from_env(env)
    assert reparsed.engine.concurrency == 2 and reparsed.catalog.warehouse == "s3://wh/warehouse"
    assert reparsed.billing() == S.billing()
    assert Consumer.model_validate(json.loads(env["ICEBATCH_JOB_CONSUMER"])) == TRIAGE


def test_a_new_job_setting_reaches_the_pod_without_being_listed() -> None:
    # every field of the sections the job uses is passed when it differs from its default
    changed = S.with_overrides(max_num_seqs=7, kv_cache_gib=2.5, karpenter_consolidate_seconds=10)
    env = {e["name"]: e["value"] for e in job_env(changed, spec())}
    assert (
        env["ICEBATCH_MAX_NUM_SEQS"],
        env["ICEBATCH_KV_CACHE_GIB"],
        env["ICEBATCH_KARPENTER_CONSOLIDATE_SECONDS"],
    ) == (
        "7",
        "2.5",
        "10",
    )


@pytest.mark.parametrize(
    ("status", "terminal", "succeeded"),
    [
        ({"jobDeploymentStatus": "Initializing"}, False, False),
        ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, False, False),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, True, True),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}, True, False),  # stopped shows Complete
        ({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed"}, True, False),
        ({"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded"}, True, False),
        ({"jobDeploymentStatus": "Running", "jobStatus": "FAILED"}, True, False),
    ],
)
def test_job_state_reads_both_status_fields(status: dict, terminal: bool, succeeded: bool) -> None:
    state = job_state({"metadata": {"name": "j", "labels": {"icebatch.io/attempt": "2"}}, "status": status})
    assert (state.terminal, state.succeeded, state.attempt) == (terminal, succeeded, 2)


@pytest.mark.skipif(not SHARED_DIR.exists(), reason="no ../shared next to this clone")
@pytest.mark.parametrize("version", VERSIONS)
def test_vendored_crds_match_the_shared_ones(version: str) -> None:
    vendored = gzip.decompress((CRD_DIR / f"ray.io_rayjobs.{version}.yaml.gz").read_bytes())
    assert vendored == (SHARED_DIR / f"ray.io_rayjobs.{version}.yaml").read_bytes()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_tensor_parallel_replica_is_one_worker_with_its_gpus_on_a_type_that_has_them(version: str) -> None:
    # given engines sharded over 2 GPUs each, 3 replicas, and types of 1 and 4 GPUs allowed
    tp = S.with_overrides(tensor_parallel_size=2, gpu_instance_types=["g6.xlarge", "g6.12xlarge"])
    # when the RayJob is built
    m = build_rayjob_manifest(tp, spec(gpus=3))
    worker = m["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    container = worker["template"]["spec"]["containers"][0]
    # then there is one worker per replica, each asking for (and limited to) the replica's 2 GPUs
    assert (worker["replicas"], worker["minReplicas"], worker["maxReplicas"]) == (3, 3, 3)
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    # only on the type with enough GPUs, billed at its price; the pods are told the setting
    terms = worker["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["g6.12xlarge"]
    assert tp.billing().instance_type == "g6.12xlarge"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["ICEBATCH_TENSOR_PARALLEL_SIZE"] == "2"
    assert errors(m, version) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_with_nvme_streamer_each_gpu_worker_copies_the_consumers_model_to_its_cache_first(version: str) -> None:
    # given nvme_streamer, and a consumer whose model is its own
    nvme = S.with_overrides(model_load_format="nvme_streamer")
    own = TRIAGE.model_copy(update={"model": "s3://models/qwen-7b/"})
    # when the RayJob is built
    m = build_rayjob_manifest(nvme, spec(consumer=own))
    pod = m["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    # then each GPU worker's init container copies that model, with the job's settings, into the volume that is the
    # worker's ICEBATCH_HOME (on the node's NVMe), before Ray starts there
    [init] = pod["initContainers"]
    assert init["command"] == ["python", "-m", "icebatch_job", "copy-model", "s3://models/qwen-7b/"]
    assert build_parser().parse_args(init["command"][3:]).source == "s3://models/qwen-7b/"
    assert init["image"] == pod["containers"][0]["image"] and init["env"] == pod["containers"][0]["env"]
    home = {e["name"]: e["value"] for e in init["env"]}["ICEBATCH_HOME"]
    assert init["volumeMounts"] == [{"name": "model-cache", "mountPath": home}]
    assert "nvidia.com/gpu" not in str(init["resources"])  # the copy needs no GPU; the worker's stays its own
    assert errors(m, version) == []
    # and with the other load formats, or a model that is not in S3, the worker has no such container
    for settings, consumer in ((S, own), (nvme, TRIAGE.model_copy(update={"model": "/models/qwen-7b"}))):
        assert "initContainers" not in str(build_rayjob_manifest(settings, spec(consumer=consumer)))


def test_tensor_parallelism_that_no_allowed_type_can_host_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match=r"2 GPU\(s\).*ICEBATCH_GPU_INSTANCE_TYPES"):
        S.with_overrides(tensor_parallel_size=2)  # the default types have one GPU each


def _ended(manifest: dict, **status: str) -> dict:
    return {**manifest, "status": {"jobDeploymentStatus": "Failed", "endTime": "2026-11-30T03:00:00Z", **status}}


def test_a_rayjob_whose_cluster_never_came_up_is_reported_with_where_to_look() -> None:
    # given a RayJob KubeRay failed before its job ran (no GPU node within the start deadline)
    m = build_rayjob_manifest(S, spec())
    job = job_state(_ended(m, reason="PreRunningDeadlineExceeded", message="RayJob has passed the deadline"))
    # when the reconciler reports it
    failed = failure_event(job, TRIAGE, S, datetime.now(UTC))
    # then the report names the deadline's setting and what to look at, and the run's range
    assert failed.error_type == "PreRunningDeadlineExceeded" and failed.stage == "cluster" and failed.retryable
    assert "ICEBATCH_JOB_START_DEADLINE_SECONDS" in failed.reason and "NodeClaims" in failed.reason
    assert failed.range is not None and (failed.range.from_exclusive, failed.range.to_inclusive) == (123, 456)


@pytest.mark.parametrize("annotated", ["+456", " 456", "4_56", "\u0664\u0665\u0666", "-1", "9" * 20])
def test_a_range_annotation_that_is_not_plain_digits_names_no_range(annotated: str) -> None:
    # given a failed RayJob whose to-snapshot annotation was edited into something else
    m = build_rayjob_manifest(S, spec())
    m["metadata"]["annotations"]["icebatch.io/to-snapshot"] = annotated
    # when the reconciler reports it, then it names no range rather than a guessed one
    failed = failure_event(job_state(_ended(m, reason="AppFailed")), TRIAGE, S, datetime.now(UTC))
    assert failed.range is None


def test_a_catalog_configured_the_pyiceberg_way_reaches_the_pod_without_its_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given the launcher's catalog is an S3 Tables REST catalog configured as pyiceberg users do, with a token
    s = S.with_overrides(catalog_type="pyiceberg", catalog_name="tables")
    rest = {
        "TYPE": "rest",
        "URI": "https://s3tables.us-east-1.amazonaws.com/iceberg",
        "REST__SIGV4-ENABLED": "true",
        "WAREHOUSE": "arn:aws:s3tables:us-east-1:111122223333:bucket/shop",
        "TOKEN": "t0k3n",
        "CREDENTIAL": "id:secret",
        "S3__SECRET-ACCESS-KEY": "x",
    }
    for key, value in rest.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__TABLES__{key}", value)
    monkeypatch.setenv("PYICEBERG_CATALOG__OTHER__URI", "https://elsewhere")
    # when the job's environment is built, then it holds the catalog's configuration, and no credential
    env = {e["name"]: e["value"] for e in job_env(s, spec())}
    handed = {k.removeprefix("PYICEBERG_CATALOG__TABLES__") for k in env if k.startswith("PYICEBERG_")}
    assert handed == {"TYPE", "URI", "REST__SIGV4-ENABLED", "WAREHOUSE"}
    assert env["ICEBATCH_CATALOG_TYPE"] == "pyiceberg" and env["ICEBATCH_CATALOG_NAME"] == "tables"
    # and a glue deployment hands on none of them
    assert not [k for k in (e["name"] for e in job_env(S, spec())) if k.startswith("PYICEBERG_")]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_shared_job_takes_each_consumers_pinned_run_and_is_each_consumers_job(version: str) -> None:
    # given two consumers' launches from their own watermarks, shared in one job (named for the first)
    privacy = Consumer.model_validate({**TRIAGE.model_dump(), "name": "privacy"})
    rider_tag = range_tag("icebatch-prod", "privacy", 1, None)
    rider = spec(
        consumer=privacy, tag=rider_tag, from_snapshot=None, run_id="privacy-20261129T020000-123456", attempt=2
    )
    shared = spec(riders=(rider,))
    manifest = build_rayjob_manifest(S, shared)
    # then the RayJob is valid, and its entrypoint, parsed as the job parses it, pins both runs
    assert errors(manifest, version) == []
    command = shlex.split(manifest["spec"]["entrypoint"])
    args = build_parser().parse_args(command[3:])
    assert (args.consumer, args.run_id, args.from_snapshot, args.to_snapshot) == ("triage", shared.run_id, 123, 456)
    [taken] = args.shared_with
    assert (taken.consumer, taken.run_id, taken.from_snapshot, taken.to_snapshot) == (
        "privacy",
        rider.run_id,
        None,
        456,
    )
    # and the pod reads back both consumers, tasks included
    env = {e["name"]: e["value"] for e in job_env(S, shared)}
    assert load_consumers(Settings.from_env(env)) == [TRIAGE, privacy]
    # and the launcher sees the job as each consumer's, from each one's range and attempt
    states = members(job_state({**manifest, "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}))
    assert [(j.consumer, j.from_tag, j.attempt, j.name) for j in states] == [
        ("triage", shared.tag, 1, shared.name),
        ("privacy", rider_tag, 2, shared.name),
    ]
    # each with its own run's annotations (what reconciliation reports a silent death from)
    assert [(j.annotations["icebatch.io/run-id"], j.annotations["icebatch.io/from-snapshot"]) for j in states] == [
        (shared.run_id, "123"),
        (rider.run_id, "none"),
    ]


@pytest.mark.parametrize(
    "runs",
    ["", "[]", "{", '{"privacy": "x"}', '{"privacy": {"run-id": 7, "trigger": "schedule", "reported": "true"}}'],
)
def test_a_shared_runs_annotation_that_is_not_the_launchers_gives_the_other_run_no_annotations_of_the_first(
    runs: str,
) -> None:
    # given a shared job whose shared-runs annotation is not what the launcher writes
    first = {"icebatch.io/run-id": "triage-1", "icebatch.io/from-snapshot": "5", "icebatch.io/trigger": "schedule"}
    annotations = {**first, "icebatch.io/shared-with": "privacy/0123456789/a1", "icebatch.io/shared-runs": runs}
    # then the other consumer's run carries none of the first run's (nor any the annotation names but should not)
    [_, other] = members(job_state({"metadata": {"name": "ib-x", "annotations": annotations}}))
    assert other.consumer == "privacy" and other.annotations.get("icebatch.io/trigger") == "schedule"
    assert "icebatch.io/run-id" not in other.annotations and "icebatch.io/from-snapshot" not in other.annotations
    assert "icebatch.io/reported" not in other.annotations


@pytest.mark.parametrize(
    "annotation",
    ["", "privacy", "Privacy/0123456789/a1", "privacy/0123456789/a1/x", "privacy/xyz/a1", "p/0123456789/a"],
)
def test_a_shared_with_annotation_that_is_not_the_launchers_names_no_other_consumer(annotation: str) -> None:
    state = job_state({"metadata": {"name": "ib-x", "annotations": {"icebatch.io/shared-with": annotation}}})
    assert members(state) == [state]


def test_the_pod_knows_when_it_was_launched_and_reads_it_back() -> None:
    env = {e["name"]: e["value"] for e in job_env(S, spec(launched_at=1796630400.25))}
    assert env["ICEBATCH_JOB_LAUNCHED_AT"] == "1796630400.25"
    assert Settings.from_env(env).top.job_launched_at == 1796630400.25
    assert "ICEBATCH_JOB_LAUNCHED_AT" not in {e["name"] for e in job_env(S, spec())}  # a spec built by hand: not set
