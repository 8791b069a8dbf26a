"""The cluster manifests next to the job image, checked offline against what the code expects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from icebatch.control.rayjob import METRICS_PORT, JobSpec, build_rayjob_manifest
from icebatch.core.costs.instances import (
    CPU_INSTANCE_TYPES,
    INSTANCE_TYPES,
    Resources,
    allocatable,
    can_host,
    parse_cpu,
    parse_memory,
)
from icebatch.core.settings import ENGINE_HOST_MIB, Settings

from tests.support.consumers import triage
from tests.support.crd import CRDS, SHARED, manifest_errors, vendored

pytestmark = pytest.mark.contract
K8S = Path(__file__).resolve().parents[2] / "jobimage" / "k8s"
DEFAULTS = Settings()


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def one(kind: str) -> dict[str, Any]:
    for path in sorted(K8S.glob("*.yaml")):
        for d in docs(path.name):
            if d["kind"] == kind:
                return d
    raise AssertionError(f"no {kind}")


def every(kind: str) -> list[dict[str, Any]]:
    return [d for path in sorted(K8S.glob("*.yaml")) for d in docs(path.name) if d["kind"] == kind]


def _spec() -> JobSpec:
    return JobSpec(
        name="ib-t-init-a1",
        run_id="r",
        deployment="local",
        consumer=triage(),
        tag="init",
        from_snapshot=None,
        to_snapshot=1,
        backlog_rows=1,
        gpus=1,
        attempt=1,
        trigger="schedule",
    )


def _worker(settings: Settings = DEFAULTS) -> dict[str, Any]:
    cluster = build_rayjob_manifest(settings, _spec())["spec"]["rayClusterSpec"]
    return dict(cluster["workerGroupSpecs"][0])


@pytest.mark.parametrize("kind", ["NodePool", "EC2NodeClass", "PodMonitor"])
def test_manifests_are_strictly_valid_against_the_real_crds(kind: str) -> None:
    # given the manifest as a user applies it (REPLACE-ME values are plain strings, valid as such)
    manifest = one(kind)
    # then the vendored CRD (Karpenter v1.14.1, prometheus-operator v0.93.0) accepts it (each of its kind),
    # unknown fields refused
    assert all(manifest_errors(m) == [] for m in every(kind))
    broken = json.loads(json.dumps(manifest))
    broken["spec"]["unknownField"] = True
    assert any("unknownField" in e for e in manifest_errors(broken))


@pytest.mark.skipif(not SHARED.exists(), reason="no ../shared next to this clone")
@pytest.mark.parametrize("kind", ["NodePool", "EC2NodeClass", "PodMonitor"])
def test_vendored_crds_match_the_shared_ones(kind: str) -> None:
    folder, name, _ = CRDS[kind]
    assert vendored(folder, name) == (SHARED / folder / f"{name}.yaml").read_bytes()


def test_node_pool_labels_are_accepted_by_every_supported_karpenter() -> None:
    # Karpenter before v1.9 rejects template labels in the kubernetes.io and k8s.io domains; every version
    # rejects karpenter.sh/*, karpenter.k8s.aws/* (but well-known keys) and kubernetes.io/hostname there
    labels = one("NodePool")["spec"]["template"]["metadata"]["labels"]
    for key in labels:
        domain = key.split("/", 1)[0] if "/" in key else ""
        assert not domain.endswith(("kubernetes.io", "k8s.io", "karpenter.sh", "karpenter.k8s.aws")), key


def test_the_worker_fits_every_instance_type_the_node_pool_allows() -> None:
    # given the NodePool's instance types and the worker pod's requests
    pool = one("NodePool")
    requirements = {r["key"]: r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]}
    types = requirements["node.kubernetes.io/instance-type"]
    resources = _worker()["template"]["spec"]["containers"][0]["resources"]
    requests = DEFAULTS.cluster.worker_requests
    assert (resources["requests"]["cpu"], resources["requests"]["memory"]) == (
        DEFAULTS.cluster.worker_cpu,
        DEFAULTS.cluster.worker_memory,
    )
    # then Karpenter's allocatable resources of each type leave room for the worker (after the DaemonSets)
    for name in types:
        assert name in INSTANCE_TYPES, f"{name}: add its capacity to icebatch/instances.py"
        assert can_host(INSTANCE_TYPES[name], requests, gpus=1), (name, allocatable(INSTANCE_TYPES[name]), requests)
    # and the families allowed are exactly those of the types (nothing listed that can never be picked)
    assert sorted(requirements["karpenter.k8s.aws/instance-family"]) == sorted(
        {INSTANCE_TYPES[t].family for t in types}
    )
    assert types == DEFAULTS.cluster.gpu_instance_types == DEFAULTS.cluster.hosting_instance_types()


def test_a_worker_too_big_for_an_xlarge_is_kept_off_it_and_billed_at_the_size_that_hosts_it() -> None:
    # the defect: 14Gi does not fit g6.xlarge/g5.xlarge (14,162 MiB allocatable, DaemonSets aside)
    big = DEFAULTS.with_overrides(worker_memory="14Gi")
    assert allocatable(INSTANCE_TYPES["g6.xlarge"]).memory_mib == 14162
    affinity = _worker(big)["template"]["spec"]["affinity"]["nodeAffinity"]
    allowed = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
    assert allowed[0]["values"] == ["g6.2xlarge", "g5.2xlarge"]
    assert big.billing().instance_type == "g6.2xlarge" and big.billing().usd_per_hour == 0.9776
    assert DEFAULTS.billing().instance_type == "g6.xlarge" and DEFAULTS.billing().usd_per_hour == 0.8048


def test_the_pod_monitor_scrapes_the_port_ray_exports_metrics_on() -> None:
    monitor = one("PodMonitor")
    cluster = build_rayjob_manifest(DEFAULTS, _spec())["spec"]["rayClusterSpec"]
    for group in (cluster["headGroupSpec"], cluster["workerGroupSpecs"][0]):
        assert group["rayStartParams"]["metrics-export-port"] == str(METRICS_PORT)
        ports = {p["name"]: p["containerPort"] for p in group["template"]["spec"]["containers"][0]["ports"]}
        assert ports[monitor["spec"]["podMetricsEndpoints"][0]["port"]] == METRICS_PORT


def test_only_the_namespace_the_operator_and_prometheus_reach_the_ray_pods() -> None:
    # given the job API on the head's dashboard port (no authentication) and the metrics port
    policy = one("NetworkPolicy")
    head = build_rayjob_manifest(DEFAULTS, _spec())["spec"]["rayClusterSpec"]["headGroupSpec"]
    ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    # then the policy covers every pod of the namespace, for ingress ...
    assert policy["spec"]["podSelector"] == {} and policy["spec"]["policyTypes"] == ["Ingress"]
    rules = policy["spec"]["ingress"]
    # ... pods of the namespace itself (head <-> workers, the submitter) ...
    assert {"from": [{"podSelector": {}}]} in rules
    # ... and from elsewhere only the operator to the job API and Prometheus to the metrics port, found by their
    # pods' labels wherever they were installed (no namespace name that a Helm install may not match)
    outside = {
        r["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"]: [p["port"] for p in r["ports"]]
        for r in rules
        if "namespaceSelector" in r["from"][0]
    }
    assert outside == {"kuberay-operator": [ports["dashboard"]], "prometheus": [METRICS_PORT]}
    assert all(r["from"][0].get("namespaceSelector") in (None, {}) for r in rules)
    assert "kuberay-system" not in (K8S / "networkpolicy.yaml").read_text().split("apiVersion", 1)[1]


def test_the_namespace_enforces_a_pod_security_standard() -> None:
    labels = one("Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] in {"baseline", "restricted"}
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"


def test_every_manifest_has_the_required_fields() -> None:
    for path in sorted(K8S.glob("*.yaml")):
        for d in docs(path.name):
            assert {"apiVersion", "kind", "metadata"} <= set(d), path.name
            assert d["metadata"]["name"], path.name
            if d["kind"] not in {"Namespace", "NodePool", "EC2NodeClass"}:
                assert d["metadata"]["namespace"] == DEFAULTS.kubernetes.k8s_namespace, path.name


def test_launcher_role_allows_only_what_the_launcher_does() -> None:
    role, binding = one("Role"), one("RoleBinding")
    assert role["rules"] == [
        {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["create", "get", "list", "patch", "delete"]}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "icebatch-launcher"}
    ]
    template = (K8S.parents[1] / "template.yaml").read_text()
    assert "KubernetesGroups: [icebatch-launcher]" in template


def test_gpu_node_pool_matches_the_rayjob() -> None:
    pool, node_class = one("NodePool"), _node_class("icebatch-gpu")
    worker = _worker()["template"]["spec"]
    assert pool["metadata"]["name"] == DEFAULTS.cluster.gpu_node_pool == worker["nodeSelector"]["karpenter.sh/nodepool"]
    taint = pool["spec"]["template"]["spec"]["taints"][0]
    assert any(t["key"] == taint["key"] and t["effect"] == taint["effect"] for t in worker["tolerations"])
    requirements = {r["key"]: r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]}
    assert requirements["karpenter.sh/capacity-type"] == ["spot", "on-demand"]
    assert set(DEFAULTS.cluster.gpu_instance_types) <= set(requirements["node.kubernetes.io/instance-type"])
    assert pool["spec"]["limits"]["nvidia.com/gpu"]
    assert pool["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert pool["spec"]["disruption"]["consolidateAfter"] == f"{DEFAULTS.cluster.karpenter_consolidate_seconds}s"
    assert pool["spec"]["template"]["spec"]["nodeClassRef"]["name"] == node_class["metadata"]["name"]
    assert node_class["spec"]["instanceStorePolicy"] == "RAID0"  # NVMe model cache


def _node_class(name: str) -> dict[str, Any]:
    return next(c for c in every("EC2NodeClass") if c["metadata"]["name"] == name)


def test_the_image_cache_node_class_differs_from_the_default_only_in_its_os_and_disks() -> None:
    # given the default GPU node class and the one whose data volume holds the job image (docs/deploy.md)
    default, cached = _node_class("icebatch-gpu"), _node_class("icebatch-gpu-image-cache")
    # then a NodePool pointed at the second gets nodes with the same role, network and NVMe cache ...
    same = ("role", "subnetSelectorTerms", "securityGroupSelectorTerms", "instanceStorePolicy")
    assert {k: cached["spec"][k] for k in same} == {k: default["spec"][k] for k in same}
    # ... on Bottlerocket, whose images live on the data volume made from the snapshot, initialized at a set rate
    assert cached["spec"]["amiSelectorTerms"] == [{"alias": "bottlerocket@latest"}]
    disks = {d["deviceName"]: d["ebs"] for d in cached["spec"]["blockDeviceMappings"]}
    assert disks["/dev/xvdb"]["snapshotID"].startswith("REPLACE-ME") and disks["/dev/xvdb"]["volumeInitializationRate"]
    assert all(d["encrypted"] and d["deleteOnTermination"] for d in disks.values())


def test_service_account_and_pod_monitor_match_the_job_pods() -> None:
    sa = one("ServiceAccount")
    assert (
        sa["metadata"]["name"] == DEFAULTS.kubernetes.service_account
    )  # its IAM role: JobRole + JobPodIdentity in template.yaml
    monitor = one("PodMonitor")
    cluster = build_rayjob_manifest(DEFAULTS, _spec())["spec"]["rayClusterSpec"]
    for pod in (cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]):
        labels = pod["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports


def test_grafana_dashboard_covers_gpus_ray_data_and_cost() -> None:
    board = json.loads((K8S / "grafana-dashboard.json").read_text())
    text = json.dumps(board)
    for metric in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
        "ray_data_output_rows",
        "OutputTokens",
        "CostUsd",
        "CostPer1kRowsUsd",
    ):
        assert metric in text
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


def test_grafana_dashboard_shows_every_error_the_lambdas_count() -> None:
    # given the errors each Lambda counts (permanent ones are alarmed; transient ones Lambda retries)
    from icebatch.control.handlers import PERMANENT_ERROR_METRICS, TRANSIENT_ERROR_METRIC

    counted = {(service, name) for service, names in PERMANENT_ERROR_METRICS.items() for name in names}
    counted |= {(service, TRANSIENT_ERROR_METRIC) for service in PERMANENT_ERROR_METRICS}
    # when the dashboard's CloudWatch queries are read
    board = json.loads((K8S / "grafana-dashboard.json").read_text())
    shown = {
        (t["dimensions"].get("service"), t["metricName"])
        for p in board["panels"]
        if p["datasource"]["type"] == "cloudwatch"
        for t in p["targets"]
    }
    # then each of them has a line, by the dimensions it is published with (the service alone)
    assert counted <= shown, sorted(counted - shown)


def _requests(pod: dict[str, Any]) -> Resources:
    containers = pod["spec"]["containers"]
    return Resources(
        cpu_milli=sum(parse_cpu(c["resources"]["requests"]["cpu"]) for c in containers),
        memory_mib=sum(parse_memory(c["resources"]["requests"]["memory"]) for c in containers),
    )


def test_every_pod_of_the_rayjob_has_a_node_pool_shipped_for_it() -> None:
    # given the RayJob's pods as KubeRay creates them: the head, the GPU workers, the submitter
    spec = build_rayjob_manifest(DEFAULTS, _spec())["spec"]
    cluster = spec["rayClusterSpec"]
    pods = {
        "head": cluster["headGroupSpec"]["template"],
        "worker": cluster["workerGroupSpecs"][0]["template"],
        "submitter": spec["submitterPodTemplate"],
    }
    pools = {p["metadata"]["name"]: p for p in every("NodePool")}
    on_pool: dict[str, list[str]] = {}
    for name, pod in pods.items():
        # then each names a NodePool that karpenter.yaml ships, and tolerates that pool's taints
        pool = pools[pod["spec"]["nodeSelector"]["karpenter.sh/nodepool"]]
        on_pool.setdefault(pool["metadata"]["name"], []).append(name)
        for taint in pool["spec"]["template"]["spec"].get("taints", []):
            assert any(t["key"] == taint["key"] and t["effect"] == taint["effect"] for t in pod["spec"]["tolerations"])
    assert on_pool == {
        DEFAULTS.cluster.gpu_node_pool: ["worker"],
        DEFAULTS.cluster.cpu_node_pool: ["head", "submitter"],
    }
    # and the CPU pool's every instance type hosts the head and the submitter together (Karpenter's allocatable,
    # less the DaemonSets), on demand
    cpu_pool = pools[DEFAULTS.cluster.cpu_node_pool]
    requirements = {r["key"]: r["values"] for r in cpu_pool["spec"]["template"]["spec"]["requirements"]}
    assert requirements["karpenter.sh/capacity-type"] == ["on-demand"]
    head_and_submitter = Resources(
        cpu_milli=_requests(pods["head"]).cpu_milli + _requests(pods["submitter"]).cpu_milli,
        memory_mib=_requests(pods["head"]).memory_mib + _requests(pods["submitter"]).memory_mib,
    )
    for type_name in requirements["node.kubernetes.io/instance-type"]:
        assert can_host(CPU_INSTANCE_TYPES[type_name], head_and_submitter, 0), type_name
    # and an empty CPU node goes as soon as a GPU node does
    assert cpu_pool["spec"]["disruption"] == {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "30s"}


def test_without_a_cpu_node_pool_the_head_runs_on_the_clusters_own_capacity() -> None:
    # given a cluster with CPU capacity of its own (ICEBATCH_CPU_NODE_POOL empty)
    settings = DEFAULTS.with_overrides(cpu_node_pool="")
    spec = build_rayjob_manifest(settings, _spec())["spec"]
    # then neither the head nor the submitter is tied to a NodePool or tolerates its taint
    for pod in (spec["rayClusterSpec"]["headGroupSpec"]["template"], spec["submitterPodTemplate"]):
        assert "nodeSelector" not in pod["spec"] and "tolerations" not in pod["spec"]


def _shm(pod: dict) -> tuple[dict, dict]:
    """The pod's /dev/shm volume and its container's mount of it."""
    container = pod["spec"]["containers"][0]
    mount = next(m for m in container.get("volumeMounts", []) if m["mountPath"] == "/dev/shm")
    return next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]), mount


def test_ray_pods_have_a_memory_backed_dev_shm_that_holds_their_object_store() -> None:
    # given the RayJob as the defaults build it, and one with a bigger worker /dev/shm
    for settings in (DEFAULTS, DEFAULTS.with_overrides(worker_shm="4Gi", worker_memory="14Gi")):
        cluster = build_rayjob_manifest(settings, _spec())["spec"]["rayClusterSpec"]
        for group in (cluster["headGroupSpec"], cluster["workerGroupSpecs"][0]):
            # then each Ray pod mounts a memory-backed /dev/shm (a container's own is 64 MB: Ray would put its
            # object store in /tmp, on disk, with a warning) ...
            volume, _ = _shm(group["template"])
            assert volume["emptyDir"]["medium"] == "Memory"
            # ... and Ray's object store is sized to fit in it, with room left for NCCL and vLLM's queues
            store = int(group["rayStartParams"]["object-store-memory"])
            assert 0 < store < parse_memory(volume["emptyDir"]["sizeLimit"]) * 1024**2
        worker = cluster["workerGroupSpecs"][0]["template"]
        assert _shm(worker)[0]["emptyDir"]["sizeLimit"] == settings.cluster.worker_shm
        # and the shared memory, counted in the worker's memory limit, leaves the engine its room
        limit = parse_memory(worker["spec"]["containers"][0]["resources"]["limits"]["memory"])
        assert limit - parse_memory(settings.cluster.worker_shm) >= ENGINE_HOST_MIB
