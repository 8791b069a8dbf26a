"""One frozen settings object, built once from the environment.

Every field is read from ``ICEBATCH_<FIELD_NAME_IN_UPPER_CASE>``; structured fields (dicts, lists) take
JSON. Nothing else in icebatch reads ``os.environ``: handlers build ``Settings.from_env()`` once at cold
start and pass it down.

Example::

    >>> s = Settings.from_env({"ICEBATCH_HOME": "/tmp/ib", "ICEBATCH_BACKLOG_THRESHOLD": "500"})
    >>> s.backlog_threshold, s.results_table
    (500, 'support.tickets_triage_results')
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from icebatch.errors import ConfigError
from icebatch.instances import (
    INSTANCE_TYPES,
    BillingRate,
    Resources,
    billing_rate,
    can_host,
    parse_cpu,
    parse_memory,
)

ENV_PREFIX = "ICEBATCH_"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")
_CONSUMER = re.compile(r"^[a-z][a-z0-9-]{0,19}$")


class Settings(BaseModel):
    """Everything icebatch can be told. See README "Configuration" (generated from these fields)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # --- where things live ------------------------------------------------------------------------
    home: Path = Field(
        default=Path(".icebatch"),
        description="Folder for local state: SQL catalog, warehouse, tiny model, caches, reports, Ray temp.",
    )
    catalog_name: str = Field(default="icebatch", description="Name given to the pyiceberg catalog.")
    catalog_type: Literal["sql", "glue"] = Field(
        default="sql", description="`sql` (SQLite under ICEBATCH_HOME, the embedded default) or `glue`."
    )
    catalog_uri: str | None = Field(
        default=None, description="SQL catalog URI. Default: `sqlite:///$ICEBATCH_HOME/catalog.db`."
    )
    warehouse: str | None = Field(
        default=None,
        description="Warehouse location for new tables. Default: `file://$ICEBATCH_HOME/warehouse` "
        "(sql); required as `s3://bucket/prefix` for glue.",
    )
    catalog_properties: dict[str, str] = Field(
        default_factory=dict,
        description="Extra pyiceberg catalog properties as JSON, e.g. "
        '`{"glue.endpoint": "...", "s3.region": "eu-west-1"}`. They override the derived ones.',
    )
    source_table: str = Field(default="support.tickets", description="Source table `namespace.table`.")
    source_id_column: str = Field(
        default="ticket_id", description="Column that identifies a source row (copied to the results)."
    )
    consumer: str = Field(
        default="triage",
        description="Consumer (task) name: one results table and one watermark per consumer. "
        "Lower case, digits and `-`, at most 20 characters.",
    )
    results_table_override: str | None = Field(
        default=None,
        alias="results_table",
        description="Results (ledger) table. Default: `<namespace>.<source table>_<consumer>_results`.",
    )

    # --- launch policy ------------------------------------------------------------------------------
    backlog_threshold: int = Field(
        default=100, ge=1, description="Append events launch a job when at least this many rows wait."
    )
    max_staleness_seconds: int = Field(
        default=6 * 3600,
        ge=0,
        description="Append events also launch when the oldest waiting row landed longer ago than this "
        "(0 disables the rule).",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        description="Failed jobs from the same watermark before launches stop for an operator.",
    )
    dry_run: bool = Field(default=False, description="Decide and build manifests, never submit (shadow mode).")
    backend: Literal["local", "kuberay"] = Field(
        default="local", description="Where jobs run: `local` (this machine) or `kuberay` (RayJob on EKS)."
    )
    local_mode: Literal["inprocess", "ray-jobs"] = Field(
        default="inprocess",
        description="Local backend: run the job in the launcher's process, or submit it to a local Ray "
        "cluster through Ray's job submission API.",
    )
    ray_address: str | None = Field(
        default=None,
        description="Ray dashboard address for `ray-jobs` mode (e.g. `http://127.0.0.1:8265`). "
        "Default: start a local head bound to 127.0.0.1.",
    )

    # --- KubeRay / EKS --------------------------------------------------------------------------------
    eks_cluster: str | None = Field(default=None, description="EKS cluster name (kuberay backend).")
    k8s_namespace: str = Field(default="icebatch", description="Namespace the RayJobs are created in.")
    k8s_api_server: str | None = Field(
        default=None,
        description="Kubernetes API URL. Default: from `eks:DescribeCluster`. Set for tests or non-EKS.",
    )
    k8s_verify_ssl: bool = Field(default=True, description="Verify the API server's TLS certificate.")
    job_image: str = Field(
        default="public.ecr.aws/icebatch/job:0.1.0", description="Container image of the job (jobimage/)."
    )
    service_account: str = Field(
        default="icebatch-job", description="Kubernetes service account of the job pods (S3/Glue via IRSA)."
    )
    gpu_node_pool: str = Field(default="icebatch-gpu", description="Karpenter NodePool for the GPU workers.")
    gpu_instance_types: list[str] = Field(
        default_factory=lambda: ["g6.xlarge", "g6.2xlarge", "g5.xlarge", "g5.2xlarge"],
        description="Allowed GPU instance types (JSON list).",
    )
    worker_cpu: str = Field(
        default="3", description="CPU request of a GPU worker pod (Kubernetes quantity, e.g. `3` or `3500m`)."
    )
    worker_memory: str = Field(
        default="12Gi",
        description="Memory request (and limit) of a GPU worker pod. It must fit what Karpenter leaves "
        "allocatable on the instance types, or Karpenter buys a bigger, dearer node.",
    )
    max_gpus: int = Field(default=4, ge=1, description="Upper bound on GPU workers of one job.")
    rows_per_gpu_hour: int = Field(
        default=120_000, ge=1, description="Planning throughput of one GPU, used to size the worker group."
    )
    target_job_hours: float = Field(
        default=1.0, gt=0, description="Size the worker group so the backlog drains in about this long."
    )
    job_ttl_seconds: int = Field(
        default=60, ge=0, description="`ttlSecondsAfterFinished`: how long a finished cluster lingers."
    )
    job_deadline_seconds: int = Field(default=4 * 3600, ge=60, description="`activeDeadlineSeconds`.")
    job_backoff_limit: int = Field(default=1, ge=0, description="`backoffLimit` of the RayJob.")
    finished_job_retention_seconds: int = Field(
        default=7 * 86400, ge=0, description="Reported, finished RayJobs are deleted after this long."
    )

    # --- the engine -----------------------------------------------------------------------------------
    model_source: str | None = Field(
        default=None,
        description="Model path, HF id or `s3://` URI (streamed with runai_streamer). Default: the tiny "
        "local model under ICEBATCH_HOME, built on first use.",
    )
    model_load_format: Literal["download", "runai_streamer"] = Field(
        default="download",
        description="How an `s3://` model reaches the engine: `download` (to the node's disk, by Ray Data LLM, "
        "before the engine starts) or `runai_streamer` (streamed into GPU memory; needs `runai-model-streamer[s3]`, "
        "which the job image installs).",
    )
    task_file: Path | None = Field(
        default=None, description="Task spec JSON (prompt, output schema, sampling). Default: ticket triage."
    )
    engine_mode: Literal["engine", "endpoint"] = Field(
        default="engine",
        description="`engine`: vLLM in the job (ray.data.llm). `endpoint`: call an OpenAI-compatible server.",
    )
    endpoint_url: str | None = Field(
        default=None,
        description="Base URL of the OpenAI-compatible server (endpoint mode), e.g. `http://h:8000/v1`.",
    )
    endpoint_model: str | None = Field(default=None, description="Model name sent to the endpoint.")
    endpoint_concurrency: int = Field(default=8, ge=1, description="Requests in flight to the endpoint.")
    endpoint_max_retries: int = Field(default=4, ge=0, description="Retries per request (with backoff).")
    device: Literal["auto", "cpu", "gpu"] = Field(
        default="auto", description="`auto` picks gpu when the Ray cluster has GPUs, else cpu."
    )
    accelerator_type: str | None = Field(default=None, description="Ray accelerator type, e.g. `L4`.")
    dtype: str = Field(default="auto", description="vLLM dtype.")
    max_model_len: int = Field(default=2048, ge=128, description="Context length; longer inputs are truncated.")
    gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1, description="vLLM (GPU only).")
    kv_cache_gib: float = Field(default=1.0, gt=0, description="KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE).")
    enable_prefix_caching: bool = Field(default=True, description="vLLM prefix caching (shared system prompt).")
    enable_chunked_prefill: bool = Field(default=True, description="vLLM chunked prefill.")
    max_num_batched_tokens: int | None = Field(default=None, description="vLLM max_num_batched_tokens.")
    max_num_seqs: int | None = Field(default=None, description="vLLM max_num_seqs (default: vLLM's).")
    enforce_eager: bool | None = Field(
        default=None, description="Skip graph compilation (default: on for CPU, off for GPU)."
    )
    batch_size: int = Field(default=64, ge=1, description="Rows per batch sent to an engine replica.")
    concurrency: int = Field(default=1, ge=1, description="Engine replicas (one GPU each).")
    structured_output: bool = Field(default=True, description="Constrain output to the task's JSON schema.")
    max_inference_error_rate: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="A run whose share of `inference_error` rows (engine/endpoint failures, not bad answers) "
        "exceeds this commits nothing and fails: its range stays pending for the next run.",
    )

    # --- cost ---------------------------------------------------------------------------------------
    gpu_hourly_rate: float | None = Field(
        default=None,
        ge=0,
        description="$ per GPU worker-hour. Default: the on-demand price (us-east-1) of the cheapest allowed "
        "instance type that can host the worker; reports name the type.",
    )
    karpenter_consolidate_seconds: int = Field(
        default=30, ge=0, description="Karpenter `consolidateAfter` for empty GPU nodes (idle tail)."
    )

    # --- events and reports ---------------------------------------------------------------------------
    event_bus: str = Field(
        default="local", description="`local` (in-process bus) or an EventBridge bus name (e.g. `default`)."
    )
    sns_topic_arn: str | None = Field(default=None, description="Topic for cost reports (reporter Lambda).")
    aws_region: str | None = Field(
        default=None, description="AWS region. Default: `AWS_REGION` (set by Lambda), else `AWS_DEFAULT_REGION`."
    )
    aws_endpoint_url: str | None = Field(
        default=None, description="Endpoint override for every AWS client (moto, LocalStack)."
    )
    idempotency_table: str | None = Field(
        default=None,
        description="DynamoDB table for the reporter's idempotency on event ids (default: a file under "
        "ICEBATCH_HOME locally).",
    )
    log_level: str = Field(default="INFO", description="Log level.")

    # ---------------------------------------------------------------------------------------------
    @field_validator("source_table", "results_table_override")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        if value is not None and not _IDENT.match(value):
            raise ValueError(f"{value!r} is not `namespace.table` (letters, digits, underscores)")
        return value

    @field_validator("consumer")
    @classmethod
    def _consumer(cls, value: str) -> str:
        if not _CONSUMER.match(value):
            raise ValueError(
                f"{value!r} must start with a letter and use lower case, digits and '-' (at most 20): it "
                "becomes part of Kubernetes names and table names"
            )
        return value

    @field_validator("worker_cpu")
    @classmethod
    def _cpu_quantity(cls, value: str) -> str:
        parse_cpu(value)
        return value

    @field_validator("worker_memory")
    @classmethod
    def _memory_quantity(cls, value: str) -> str:
        parse_memory(value)
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> Settings:
        if self.backend == "kuberay":
            self.billing()  # some allowed instance type must be able to host the worker
        if self.backend == "kuberay" and not (self.eks_cluster or self.k8s_api_server):
            raise ValueError(
                "backend=kuberay needs ICEBATCH_EKS_CLUSTER (or ICEBATCH_K8S_API_SERVER for a non-EKS API)"
            )
        if self.engine_mode == "endpoint" and not self.endpoint_url:
            raise ValueError("engine_mode=endpoint needs ICEBATCH_ENDPOINT_URL (an OpenAI-compatible base URL)")
        return self

    # --- derived ----------------------------------------------------------------------------------
    @property
    def results_table(self) -> str:
        if self.results_table_override:
            return self.results_table_override
        namespace, name = self.source_table.split(".")
        return f"{namespace}.{name}_{self.consumer.replace('-', '_')}_results"

    @property
    def worker_requests(self) -> Resources:
        return Resources(cpu_milli=parse_cpu(self.worker_cpu), memory_mib=parse_memory(self.worker_memory))

    def billing(self) -> BillingRate:
        """The rate reports bill per GPU worker-hour, and the instance type it assumes."""
        try:
            return billing_rate(list(self.gpu_instance_types), self.worker_requests, 1, self.gpu_hourly_rate)
        except ValueError as e:
            raise ValueError(
                f"{e}: lower ICEBATCH_WORKER_MEMORY/ICEBATCH_WORKER_CPU, allow bigger ICEBATCH_GPU_INSTANCE_TYPES, "
                "or set ICEBATCH_GPU_HOURLY_RATE"
            ) from e

    @property
    def hosting_instance_types(self) -> list[str]:
        """The allowed instance types a worker fits (types unknown to ``icebatch.instances`` are kept)."""
        requests = self.worker_requests
        return [
            t for t in self.gpu_instance_types if t not in INSTANCE_TYPES or can_host(INSTANCE_TYPES[t], requests, 1)
        ]

    @property
    def home_abs(self) -> Path:
        return self.home.expanduser().resolve()

    @property
    def reports_dir(self) -> Path:
        return self.home_abs / "reports"

    @property
    def tiny_model_dir(self) -> Path:
        return self.home_abs / "models" / "tiny-llama"

    def catalog_props(self, *, control_plane: bool = False) -> dict[str, str]:
        """pyiceberg catalog properties.

        ``control_plane=True`` selects icebatch's small metadata FileIO (boto3 for s3://, the OS for
        file://) so that reading metadata never imports pyarrow or s3fs (the Lambda bundle has neither).
        """
        props: dict[str, str] = {"type": self.catalog_type}
        if self.catalog_type == "sql":
            props["uri"] = self.catalog_uri or f"sqlite:///{self.home_abs / 'catalog.db'}"
            props["warehouse"] = self.warehouse or f"file://{self.home_abs / 'warehouse'}"
        elif self.warehouse:
            props["warehouse"] = self.warehouse
        if self.catalog_type == "glue":
            if self.aws_region:
                props.setdefault("glue.region", self.aws_region)
                props.setdefault("s3.region", self.aws_region)
                props.setdefault("client.region", self.aws_region)
            if self.aws_endpoint_url:
                props.setdefault("glue.endpoint", self.aws_endpoint_url)
                props.setdefault("s3.endpoint", self.aws_endpoint_url)
        if control_plane:
            props["py-io-impl"] = "icebatch.metadata_io.MetadataFileIO"
        props.update(self.catalog_properties)
        return props

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed (validated)."""
        data = self.model_dump(by_alias=True)
        data.update(changes)
        try:
            return Settings.model_validate(data)
        except ValidationError as e:
            raise ConfigError(_explain(e)) from e

    # --- construction -------------------------------------------------------------------------------
    @classmethod
    def env_names(cls) -> dict[str, str]:
        """Field name -> environment variable."""
        return {name: ENV_PREFIX + (f.alias or name).upper() for name, f in cls.model_fields.items()}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``ICEBATCH_*`` variables; raise ConfigError naming the variable to fix."""
        env = os.environ if environ is None else environ
        data: dict[str, Any] = {}
        for name, var in cls.env_names().items():
            if var not in env or env[var] == "":
                continue
            raw = env[var]
            field = cls.model_fields[name]
            key = field.alias or name
            if _is_structured(field.annotation):
                try:
                    data[key] = json.loads(raw)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{var} must be JSON ({e.msg} at position {e.pos}); got {raw!r}") from e
            else:
                data[key] = raw
        if "aws_region" not in data and (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")):
            # Lambda's runtime (and most shells) name the region here; the job's pods get it from the launcher
            data["aws_region"] = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        known = set(cls.env_names().values())
        unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known and not _ignored(k))
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {', '.join(unknown)}; see `icebatch config --help` for the valid names"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise ConfigError(_explain(e)) from e


_IGNORED_VARS = {"ICEBATCH_VENV", "ICEBATCH_CACHE", "ICEBATCH_PYTHON", "ICEBATCH_TEST_KEEP"}


def _ignored(var: str) -> bool:
    return var in _IGNORED_VARS


def _is_structured(annotation: Any) -> bool:
    text = str(annotation)
    return text.startswith(("dict", "list", "typing.Dict", "typing.List"))


def _explain(error: ValidationError) -> str:
    names = Settings.env_names()
    by_alias = {(f.alias or n): n for n, f in Settings.model_fields.items()}
    lines = []
    for item in error.errors():
        loc = str(item["loc"][0]) if item["loc"] else ""
        field = by_alias.get(loc, loc)
        var = names.get(field, "settings")
        lines.append(f"{var}: {item['msg']}")
    return "invalid configuration: " + "; ".join(lines)
