"""KubeRay RayJob manifests as plain dicts built by pure functions (testable offline).

- **Name**: ``ib-<consumer>-<hash of the starting watermark>-a<attempt>``. Every launch that starts
  from the same watermark picks the same name, even if it saw a newer snapshot, so concurrent launches
  collide on 409 AlreadyExists instead of racing. A failed attempt does not block the range: the next
  launch uses ``a<n+1>``, up to ``ICEBATCH_MAX_ATTEMPTS``, after which an operator must look.
- **Size**: the GPU worker group's replicas = the job's engine concurrency =
  ``ceil(backlog / (rows_per_gpu_hour x target_job_hours))``, between 1 and ``max_gpus``.
- **Lifetime**: ``shutdownAfterJobFinishes`` with a short ``ttlSecondsAfterFinished`` (60 s, not the seed's
  1200), an ``activeDeadlineSeconds`` and a ``backoffLimit``.
"""

from __future__ import annotations

import hashlib
import math
import shlex
from dataclasses import dataclass
from typing import Any

from icebatch.settings import Settings

API_VERSION = "ray.io/v1"
GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
RAY_VERSION = "2.60.0"
LABEL = "icebatch.io"
MAX_NAME = 47
METRICS_PORT = 8080  # Ray's Prometheus endpoint (vLLM engine metrics included); jobimage/k8s/podmonitor.yaml

# Settings a job needs (everything else is the launcher's business).
JOB_SETTINGS = (
    "catalog_name", "catalog_type", "catalog_uri", "warehouse", "catalog_properties", "source_table",
    "source_id_column", "consumer", "results_table_override", "model_source", "task_file", "engine_mode",
    "endpoint_url", "endpoint_model", "endpoint_concurrency", "endpoint_max_retries", "device", "accelerator_type",
    "dtype", "max_model_len", "gpu_memory_utilization", "enable_prefix_caching", "enable_chunked_prefill",
    "max_num_batched_tokens", "max_num_seqs", "enforce_eager", "batch_size", "structured_output",
    "max_inference_error_rate", "gpu_hourly_rate", "job_ttl_seconds", "karpenter_consolidate_seconds",
    "event_bus", "aws_region", "aws_endpoint_url", "log_level", "backend", "gpu_instance_types", "worker_cpu",
    "worker_memory", "model_load_format", "eks_cluster",
)  # fmt: skip


def watermark_tag(watermark: int | None) -> str:
    """A short, DNS-safe stand-in for a snapshot id (``init`` before the first run)."""
    if watermark is None:
        return "init"
    return hashlib.sha256(str(watermark).encode()).hexdigest()[:10]


def job_name(consumer: str, watermark: int | None, attempt: int) -> str:
    """``ib-triage-3fa9c2d1e0-a1``: the same for every launch from this watermark and attempt."""
    name = f"ib-{consumer}-{watermark_tag(watermark)}-a{attempt}"
    if len(name) > MAX_NAME:  # consumer is at most 20 characters, so this cannot happen; keep the bound
        raise ValueError(f"RayJob name {name!r} is longer than {MAX_NAME} characters")
    return name


def gpus_for(backlog_rows: int, settings: Settings) -> int:
    """GPUs needed to drain the backlog in about ``target_job_hours``, within [1, max_gpus]."""
    per_gpu = settings.rows_per_gpu_hour * settings.target_job_hours
    return max(1, min(settings.max_gpus, math.ceil(backlog_rows / per_gpu)))


def labels(consumer: str, watermark: int | None, attempt: int | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "icebatch",
        "app.kubernetes.io/component": "job",
        f"{LABEL}/consumer": consumer,
        f"{LABEL}/from": watermark_tag(watermark),
    }
    if attempt is not None:
        out[f"{LABEL}/attempt"] = str(attempt)
    return out


def consumer_selector(consumer: str) -> str:
    return f"app.kubernetes.io/name=icebatch,{LABEL}/consumer={consumer}"


@dataclass(frozen=True)
class JobSpec:
    """What one launch asks for: the pinned range and its size."""

    name: str
    run_id: str
    consumer: str
    source_table: str
    from_snapshot: int | None
    to_snapshot: int
    backlog_rows: int
    gpus: int
    attempt: int
    trigger: str

    def entrypoint(self) -> list[str]:
        return [
            "icebatch", "job", "run",
            "--run-id", self.run_id,
            "--from-snapshot", "none" if self.from_snapshot is None else str(self.from_snapshot),
            "--to-snapshot", str(self.to_snapshot),
            "--rayjob-name", self.name,
        ]  # fmt: skip


def job_env(settings: Settings, spec: JobSpec) -> list[dict[str, str]]:
    """The ICEBATCH_* variables of the job's containers (only the settings the job uses)."""
    import json

    names = Settings.env_names()
    values = settings.model_dump()
    defaults = Settings.model_construct().model_dump()
    env = []
    for field in JOB_SETTINGS:
        value = values[field]
        if value is None or (value == defaults.get(field) and field not in ("consumer", "source_table")):
            continue
        text = (
            json.dumps(value)
            if isinstance(value, (dict, list))
            else str(value).lower()
            if isinstance(value, bool)
            else str(value)
        )
        env.append({"name": names[field], "value": text})
    env.append({"name": names["concurrency"], "value": str(spec.gpus)})
    env.append({"name": names["home"], "value": "/tmp/icebatch"})
    return sorted(env, key=lambda e: e["name"])


def build_rayjob_manifest(settings: Settings, spec: JobSpec) -> dict[str, Any]:
    """The RayJob for one launch (validated against the KubeRay v1.6.1 and v1.7.0 CRDs in the tests)."""
    env = job_env(settings, spec)
    image = settings.job_image
    common_pod = {
        "serviceAccountName": settings.service_account,
        "restartPolicy": "Never",
    }
    head = {
        "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0", "metrics-export-port": str(METRICS_PORT)},
        "template": {
            "metadata": {"labels": labels(spec.consumer, spec.from_snapshot)},
            "spec": {
                **common_pod,
                "containers": [
                    {
                        "name": "ray-head",
                        "image": image,
                        "env": env,
                        "resources": {
                            "requests": {"cpu": "1", "memory": "4Gi"},
                            "limits": {"cpu": "2", "memory": "8Gi"},
                        },
                        "ports": [
                            {"containerPort": 6379, "name": "gcs"},
                            {"containerPort": 8265, "name": "dashboard"},
                            {"containerPort": 10001, "name": "client"},
                            {"containerPort": METRICS_PORT, "name": "metrics"},
                        ],
                    }
                ],
            },
        },
    }
    worker = {
        "groupName": "gpu",
        "replicas": spec.gpus,
        "minReplicas": spec.gpus,
        "maxReplicas": spec.gpus,
        "rayStartParams": {"metrics-export-port": str(METRICS_PORT)},
        "template": {
            "metadata": {"labels": labels(spec.consumer, spec.from_snapshot)},
            "spec": {
                **common_pod,
                "nodeSelector": {"karpenter.sh/nodepool": settings.gpu_node_pool},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "node.kubernetes.io/instance-type",
                                            "operator": "In",
                                            "values": settings.hosting_instance_types,
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                },
                "containers": [
                    {
                        "name": "ray-worker",
                        "image": image,
                        "env": env,
                        "resources": {
                            "requests": {
                                "cpu": settings.worker_cpu,
                                "memory": settings.worker_memory,
                                "nvidia.com/gpu": "1",
                            },
                            "limits": {"memory": settings.worker_memory, "nvidia.com/gpu": "1"},
                        },
                        "ports": [{"containerPort": METRICS_PORT, "name": "metrics"}],
                        "volumeMounts": [{"name": "model-cache", "mountPath": "/tmp/icebatch"}],
                    }
                ],
                "volumes": [{"name": "model-cache", "emptyDir": {}}],
            },
        },
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "RayJob",
        "metadata": {
            "name": spec.name,
            "namespace": settings.k8s_namespace,
            "labels": labels(spec.consumer, spec.from_snapshot, spec.attempt),
            "annotations": {
                f"{LABEL}/run-id": spec.run_id,
                f"{LABEL}/source-table": spec.source_table,
                f"{LABEL}/from-snapshot": "none" if spec.from_snapshot is None else str(spec.from_snapshot),
                f"{LABEL}/to-snapshot": str(spec.to_snapshot),
                f"{LABEL}/backlog-rows": str(spec.backlog_rows),
                f"{LABEL}/trigger": spec.trigger,
            },
        },
        "spec": {
            "entrypoint": shlex.join(spec.entrypoint()),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": settings.job_ttl_seconds,
            "activeDeadlineSeconds": settings.job_deadline_seconds,
            "backoffLimit": settings.job_backoff_limit,
            "submissionMode": "K8sJobMode",
            "rayClusterSpec": {
                "rayVersion": RAY_VERSION,
                "headGroupSpec": head,
                "workerGroupSpecs": [worker],
            },
        },
    }


# ---------------------------------------------------------------------------------------------------
# Reading RayJob objects back
# ---------------------------------------------------------------------------------------------------
TERMINAL_DEPLOYMENT = {"Complete", "Failed", "ValidationFailed"}
TERMINAL_JOB = {"SUCCEEDED", "FAILED", "STOPPED"}


@dataclass(frozen=True)
class JobState:
    name: str
    consumer: str | None
    from_tag: str | None
    attempt: int
    deployment_status: str
    job_status: str
    reason: str
    message: str
    start_time: str | None
    end_time: str | None
    annotations: dict[str, str]

    @property
    def terminal(self) -> bool:
        # a stopped or failed Ray job can show jobDeploymentStatus "Complete": read both fields
        return self.deployment_status in TERMINAL_DEPLOYMENT or self.job_status in TERMINAL_JOB

    @property
    def succeeded(self) -> bool:
        return self.job_status == "SUCCEEDED" and self.deployment_status not in {"Failed", "ValidationFailed"}

    @property
    def failed(self) -> bool:
        return self.terminal and not self.succeeded

    @property
    def failure_reason(self) -> str:
        parts = [p for p in (self.reason, self.job_status, self.message) if p]
        return ": ".join(parts) or self.deployment_status or "unknown"


def job_state(obj: dict[str, Any]) -> JobState:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    lab = meta.get("labels") or {}
    try:
        attempt = int(lab.get(f"{LABEL}/attempt", "1"))
    except ValueError:
        attempt = 1
    return JobState(
        name=meta.get("name", ""),
        consumer=lab.get(f"{LABEL}/consumer"),
        from_tag=lab.get(f"{LABEL}/from"),
        attempt=attempt,
        deployment_status=status.get("jobDeploymentStatus") or "",
        job_status=status.get("jobStatus") or "",
        reason=status.get("reason") or "",
        message=status.get("message") or "",
        start_time=status.get("startTime"),
        end_time=status.get("endTime"),
        annotations=dict(meta.get("annotations") or {}),
    )
