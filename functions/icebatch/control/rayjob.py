"""KubeRay RayJob manifests as plain dicts built by pure functions (testable offline).

- **Name**: ``ib-<consumer>-<hash>-a<attempt>``, the hash of the deployment, the consumer, its task
  version and the watermark the job starts from. Every launch that starts from the same watermark picks
  the same name, even if it saw a newer snapshot, so concurrent launches collide on 409 AlreadyExists
  instead of racing; two deployments in one namespace never share a name. A failed attempt does not
  block the range: the next launch uses ``a<n+1>``, up to ``ICEBATCH_MAX_ATTEMPTS``.
- **Size**: the GPU worker group's replicas = the job's engine replicas (``icebatch.core.costs.estimate``), each
  worker with ``ICEBATCH_TENSOR_PARALLEL_SIZE`` GPUs (one engine across them).
- **Lifetime**: ``shutdownAfterJobFinishes`` with a short ``ttlSecondsAfterFinished`` (60 s, not the seed's
  1200), an ``activeDeadlineSeconds``, a ``preRunningDeadlineSeconds`` (a cluster that never comes up,
  for want of GPU capacity or an image, fails in 30 min, not at the 4 h deadline) and a ``backoffLimit``.
- **Environment**: the job's settings (``Settings.job_environment``) and its consumer, task included.
- **Shared**: consumers of one model due at the same launch share one job (``JobSpec.riders``,
  ``icebatch_job.shared``): it is named and labelled for the first, its ``shared-with`` annotation names the others'
  ranges (``icebatch.control.jobs.members``), ``shared-runs`` what its own annotations say of the first run for each
  of theirs (so that reconciliation reports each), and its entrypoint takes their runs with ``--with``.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from typing import Any

from icebatch.core.consumers import Consumer, job_consumers_json
from icebatch.core.costs.instances import MIB, parse_memory
from icebatch.core.settings import Settings

API_VERSION = "ray.io/v1"
GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
RAY_VERSION = "2.60.0"
LABEL = "icebatch.io"
MAX_NAME = 47
METRICS_PORT = 8080  # Ray's Prometheus endpoint (vLLM engine metrics included); jobimage/k8s/podmonitor.yaml
POD_HOME = "/tmp/icebatch"  # the workers' NVMe-backed emptyDir (the model is downloaded there)
HEAD_SHM = "1Gi"  # the head's /dev/shm: its object store holds what the driver puts (plans, permits), not rows
OBJECT_STORE_SHARE = 0.8  # of a pod's /dev/shm


def range_tag(deployment: str, consumer: str, task_version: int, watermark: int | None) -> str:
    """A short, DNS-safe stand-in for where a job starts (the same for every launch from there)."""
    start = "init" if watermark is None else str(watermark)
    return hashlib.sha256(f"{deployment}/{consumer}/v{task_version}/{start}".encode()).hexdigest()[:10]


def job_name(consumer: str, tag: str, attempt: int) -> str:
    """``ib-triage-3fa9c2d1e0-a1``."""
    name = f"ib-{consumer}-{tag}-a{attempt}"
    if len(name) > MAX_NAME:  # consumer is at most 20 characters, so this cannot happen; keep the bound
        raise ValueError(f"RayJob name {name!r} is longer than {MAX_NAME} characters")
    return name


def labels(deployment: str, consumer: str, tag: str, attempt: int | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "icebatch",
        "app.kubernetes.io/component": "job",
        f"{LABEL}/deployment": deployment,
        f"{LABEL}/consumer": consumer,
        f"{LABEL}/from": tag,
    }
    if attempt is not None:
        out[f"{LABEL}/attempt"] = str(attempt)
    return out


def deployment_selector(deployment: str) -> str:
    return f"app.kubernetes.io/name=icebatch,{LABEL}/deployment={deployment}"


@dataclass(frozen=True)
class JobSpec:
    """What one launch asks for: the pinned range, its consumer and its size."""

    name: str
    run_id: str
    deployment: str
    consumer: Consumer
    tag: str
    from_snapshot: int | None
    to_snapshot: int
    backlog_rows: int
    gpus: int
    attempt: int
    trigger: str
    riders: tuple[JobSpec, ...] = ()  # other consumers' runs the job takes through the same engine (their names: its)
    launched_at: float | None = None  # when the launcher submitted it (Unix seconds): the job times what came before

    def entrypoint(self) -> list[str]:
        shared = [
            ["--with", f"{r.consumer.name}:{r.run_id}:{_snapshot(r.from_snapshot)}:{r.to_snapshot}"]
            for r in self.riders
        ]
        return [
            "python",
            "-m",
            "icebatch_job",
            "run",
            "--run-id",
            self.run_id,
            "--from-snapshot",
            _snapshot(self.from_snapshot),
            "--to-snapshot",
            str(self.to_snapshot),
            "--rayjob-name",
            self.name,
            *(["--consumer", self.consumer.name] if self.riders else []),
            *(arg for pair in shared for arg in pair),
        ]

    @property
    def consumers(self) -> list[Consumer]:
        return [self.consumer, *(r.consumer for r in self.riders)]


def _snapshot(snapshot: int | None) -> str:
    return "none" if snapshot is None else str(snapshot)


def shared_with(spec: JobSpec) -> str:
    """The ``shared-with`` annotation: each rider's ``consumer/tag/a<attempt>`` (``icebatch.control.jobs.members``)."""
    return ",".join(f"{r.consumer.name}/{r.tag}/a{r.attempt}" for r in spec.riders)


def job_env(settings: Settings, spec: JobSpec, home: str = POD_HOME) -> list[dict[str, str]]:
    """The environment of the job's containers: its settings and its consumer."""
    # a run given no GPU worker (``gpus`` 0: rows deleted or rewritten, none added) starts no engine
    # (``job_engine`` off: rows that need the model are left to the range's next attempt); the concurrency floor is one
    env = settings.job_environment(
        home=home,
        concurrency=max(spec.gpus, 1),
        job_consumer=job_consumers_json(spec.consumers),
        job_engine=None if spec.gpus else "off",
        job_launched_at=spec.launched_at,
    )
    env.update(settings.pyiceberg_catalog_environment())  # the catalog as pyiceberg configures it (no credentials)
    return [{"name": k, "value": v} for k, v in env.items()]


CPU_TAINT = "icebatch.io/cpu"  # the CPU NodePool's taint: only the head and the submitter land there


def _on_cpu_pool(settings: Settings) -> dict[str, Any]:
    """Where the head and the submitter run: the CPU NodePool (Karpenter brings a node for them, and takes it
    away once empty), or, with no pool named, wherever the cluster has CPU capacity."""
    pool = settings.cluster.cpu_node_pool
    if not pool:
        return {}
    return {
        "nodeSelector": {"karpenter.sh/nodepool": pool},
        "tolerations": [{"key": CPU_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    }


def _submitter(settings: Settings) -> dict[str, Any]:
    """KubeRay's default submitter pod (its resources), placed beside the head; KubeRay fills in the command."""
    container = {
        "name": "ray-job-submitter",
        "image": settings.kubernetes.job_image,
        "resources": {"requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
    }
    return {"spec": {"restartPolicy": "Never", "containers": [container], **_on_cpu_pool(settings)}}


def shared_memory(size: str) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """A memory-backed ``/dev/shm`` of ``size`` (a container's is 64 MB) for Ray's object store, which takes
    ``OBJECT_STORE_SHARE`` of it (the rest: NCCL, vLLM's queues): the volume, its mount, Ray's start parameter.
    It counts in the pod's memory limit (``ClusterSettings`` checks the room left)."""
    volume = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}
    store = int(parse_memory(size) * MIB * OBJECT_STORE_SHARE)
    return volume, {"name": "dshm", "mountPath": "/dev/shm"}, {"object-store-memory": str(store)}


def _head(settings: Settings, spec: JobSpec, env: list[dict[str, str]]) -> dict[str, Any]:
    volume, mount, store = shared_memory(HEAD_SHM)
    params = {"num-cpus": "0", "dashboard-host": "0.0.0.0", "metrics-export-port": str(METRICS_PORT), **store}
    return {
        "rayStartParams": params,
        "template": {
            "metadata": {"labels": labels(spec.deployment, spec.consumer.name, spec.tag)},
            "spec": {
                "serviceAccountName": settings.kubernetes.service_account,
                "restartPolicy": "Never",
                **_on_cpu_pool(settings),
                "containers": [
                    {
                        "name": "ray-head",
                        "image": settings.kubernetes.job_image,
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
                        "volumeMounts": [mount],
                    }
                ],
                "volumes": [volume],
            },
        },
    }


def _gpu_affinity(types: list[str]) -> dict[str, Any]:
    expression = {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": types}
    terms = [{"matchExpressions": [expression]}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def _worker(settings: Settings, spec: JobSpec, env: list[dict[str, str]]) -> dict[str, Any]:
    """One worker per engine replica, each with the replica's GPUs (tensor parallelism stays inside a worker)."""
    cluster, gpus = settings.cluster, str(settings.engine.tensor_parallel_size)
    shm, shm_mount, store = shared_memory(cluster.worker_shm)
    container = {
        "name": "ray-worker",
        "image": settings.kubernetes.job_image,
        "env": env,
        "resources": {
            "requests": {"cpu": cluster.worker_cpu, "memory": cluster.worker_memory, "nvidia.com/gpu": gpus},
            "limits": {"memory": cluster.worker_memory, "nvidia.com/gpu": gpus},
        },
        "ports": [{"containerPort": METRICS_PORT, "name": "metrics"}],
        "volumeMounts": [{"name": "model-cache", "mountPath": POD_HOME}, shm_mount],
    }
    copy = model_copy(settings, spec, env)
    return {
        "groupName": "gpu",
        "replicas": spec.gpus,
        "minReplicas": spec.gpus,
        "maxReplicas": spec.gpus,
        "rayStartParams": {"metrics-export-port": str(METRICS_PORT), **store},
        "template": {
            "metadata": {"labels": labels(spec.deployment, spec.consumer.name, spec.tag)},
            "spec": {
                "serviceAccountName": settings.kubernetes.service_account,
                "restartPolicy": "Never",
                "nodeSelector": {"karpenter.sh/nodepool": cluster.gpu_node_pool},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": _gpu_affinity(cluster.hosting_instance_types(settings.engine.tensor_parallel_size)),
                **({"initContainers": [copy]} if copy else {}),
                "containers": [container],
                "volumes": [{"name": "model-cache", "emptyDir": {}}, shm],
            },
        },
    }


def model_copy(settings: Settings, spec: JobSpec, env: list[dict[str, str]]) -> dict[str, Any] | None:
    """With ``nvme_streamer`` and an ``s3://`` model: the init container that copies the model to the worker's
    NVMe-backed model cache before Ray starts on it, while the head starts and the job plans
    (``icebatch_job.stages.model_copy``); the engine streams the weights from there."""
    source = spec.consumer.model_source(settings)
    if settings.engine.model_load_format != "nvme_streamer" or not source or not source.startswith("s3://"):
        return None
    return {
        "name": "model-copy",
        "image": settings.kubernetes.job_image,
        "command": ["python", "-m", "icebatch_job", "copy-model", source],
        "env": env,
        # the pod's request is the larger of its init and main containers': the worker's CPU, memory for the transfers
        "resources": {
            "requests": {"cpu": settings.cluster.worker_cpu, "memory": "2Gi"},
            "limits": {"memory": "4Gi"},
        },
        "volumeMounts": [{"name": "model-cache", "mountPath": POD_HOME}],
    }


def run_annotations(spec: JobSpec) -> dict[str, str]:
    """What the job's annotations say of one run (``LABEL/<key>``): its id, table, task and range."""
    return {
        "run-id": spec.run_id,
        "source-table": spec.consumer.source_table,
        "task": f"{spec.consumer.task.name}@v{spec.consumer.task_version}",
        "from-snapshot": _snapshot(spec.from_snapshot),
        "to-snapshot": str(spec.to_snapshot),
        "backlog-rows": str(spec.backlog_rows),
    }


def shared_runs(spec: JobSpec) -> str:
    """The ``shared-runs`` annotation: each rider's ``run_annotations``, by consumer (``jobs.members`` reads it)."""
    return json.dumps({r.consumer.name: run_annotations(r) for r in spec.riders}, sort_keys=True, separators=(",", ":"))


def build_rayjob_manifest(settings: Settings, spec: JobSpec) -> dict[str, Any]:
    """The RayJob for one launch (validated against the KubeRay v1.6.1 and v1.7.0 CRDs in the tests)."""
    env = job_env(settings, spec)
    annotations = {
        **{f"{LABEL}/{key}": value for key, value in run_annotations(spec).items()},
        f"{LABEL}/trigger": spec.trigger,
        **(
            {f"{LABEL}/shared-with": shared_with(spec), f"{LABEL}/shared-runs": shared_runs(spec)}
            if spec.riders
            else {}
        ),
    }
    start_deadline = settings.kubernetes.job_start_deadline_seconds
    return {
        "apiVersion": API_VERSION,
        "kind": "RayJob",
        "metadata": {
            "name": spec.name,
            "namespace": settings.kubernetes.k8s_namespace,
            "labels": labels(spec.deployment, spec.consumer.name, spec.tag, spec.attempt),
            "annotations": annotations,
        },
        "spec": {
            "entrypoint": shlex.join(spec.entrypoint()),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": settings.cluster.job_ttl_seconds,
            "activeDeadlineSeconds": settings.kubernetes.job_deadline_seconds,
            **({"preRunningDeadlineSeconds": start_deadline} if start_deadline else {}),
            "backoffLimit": settings.kubernetes.job_backoff_limit,
            "submissionMode": "K8sJobMode",
            "submitterPodTemplate": _submitter(settings),
            "rayClusterSpec": {
                "rayVersion": RAY_VERSION,
                "headGroupSpec": _head(settings, spec, env),
                "workerGroupSpecs": [_worker(settings, spec, env)],
            },
        },
    }
