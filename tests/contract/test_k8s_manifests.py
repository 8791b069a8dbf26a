"""The cluster manifests next to the job image, checked offline against what the code expects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from icebatch.rayjob import JobSpec, build_rayjob_manifest
from icebatch.settings import Settings

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


def test_every_manifest_has_the_required_fields() -> None:
    for path in sorted(K8S.glob("*.yaml")):
        for d in docs(path.name):
            assert {"apiVersion", "kind", "metadata"} <= set(d), path.name
            assert d["metadata"]["name"], path.name
            if d["kind"] not in {"Namespace", "NodePool", "EC2NodeClass"}:
                assert d["metadata"]["namespace"] == DEFAULTS.k8s_namespace, path.name


def test_launcher_role_allows_only_what_the_launcher_does() -> None:
    role, binding = one("Role"), one("RoleBinding")
    assert role["rules"] == [{"apiGroups": ["ray.io"], "resources": ["rayjobs"],
                              "verbs": ["create", "get", "list", "patch", "delete"]}]  # fmt: skip
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "icebatch-launcher"}
    ]
    template = (K8S.parents[1] / "template.yaml").read_text()
    assert "KubernetesGroups: [icebatch-launcher]" in template


def test_gpu_node_pool_matches_the_rayjob() -> None:
    pool, node_class = one("NodePool"), one("EC2NodeClass")
    spec = JobSpec(name="ib-t-init-a1", run_id="r", consumer="triage", source_table="s.t", from_snapshot=None,
                   to_snapshot=1, backlog_rows=1, gpus=1, attempt=1, trigger="schedule")  # fmt: skip
    worker = build_rayjob_manifest(DEFAULTS, spec)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert pool["metadata"]["name"] == DEFAULTS.gpu_node_pool == worker["nodeSelector"]["karpenter.sh/nodepool"]
    taint = pool["spec"]["template"]["spec"]["taints"][0]
    assert any(t["key"] == taint["key"] and t["effect"] == taint["effect"] for t in worker["tolerations"])
    requirements = {r["key"]: r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]}
    assert requirements["karpenter.sh/capacity-type"] == ["spot", "on-demand"]
    assert set(DEFAULTS.gpu_instance_types) <= set(requirements["node.kubernetes.io/instance-type"])
    assert pool["spec"]["limits"]["nvidia.com/gpu"]
    assert pool["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert pool["spec"]["disruption"]["consolidateAfter"] == f"{DEFAULTS.karpenter_consolidate_seconds}s"
    assert pool["spec"]["template"]["spec"]["nodeClassRef"]["name"] == node_class["metadata"]["name"]
    assert node_class["spec"]["instanceStorePolicy"] == "RAID0"  # NVMe model cache


def test_service_account_and_pod_monitor_match_the_job_pods() -> None:
    sa = one("ServiceAccount")
    assert sa["metadata"]["name"] == DEFAULTS.service_account
    assert "eks.amazonaws.com/role-arn" in sa["metadata"]["annotations"]
    monitor = one("PodMonitor")
    spec = JobSpec(name="ib-t-init-a1", run_id="r", consumer="triage", source_table="s.t", from_snapshot=None,
                   to_snapshot=1, backlog_rows=1, gpus=1, attempt=1, trigger="schedule")  # fmt: skip
    cluster = build_rayjob_manifest(DEFAULTS, spec)["spec"]["rayClusterSpec"]
    for pod in (cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]):
        labels = pod["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports


def test_grafana_dashboard_covers_gpus_ray_data_and_cost() -> None:
    board = json.loads((K8S / "grafana-dashboard.json").read_text())
    text = json.dumps(board)
    for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "ray_data_output_rows",
                   "OutputTokens", "CostUsd", "CostPer1kRowsUsd"):  # fmt: skip
        assert metric in text
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
