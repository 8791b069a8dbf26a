"""One frozen settings object, built once from the environment, in sections by concern.

Every field is read from ``ICEBATCH_<FIELD NAME>`` (pydantic-settings; structured values are JSON). What
a *consumer* decides (its task, threshold, budget, model, GPUs) is not here but in the consumers file
(``icebatch.core.consumers``). Handlers, the job and the CLI build ``Settings.from_env()`` once and pass
it down; nothing else reads ``os.environ``.

| section     | concern                                              | who uses it          |
| ----------- | ---------------------------------------------------- | -------------------- |
| (top)       | local state, deployment name, where jobs run, logs   | everyone             |
| catalog     | the Iceberg catalog and the source table             | launcher, job        |
| launch      | launch policy, local job modes, sizing               | launcher             |
| kubernetes  | the EKS API, the RayJob's image and lifetime         | launcher             |
| cluster     | the GPU workers: instance types, requests, idle tail | launcher, job (cost) |
| engine      | the model and vLLM / endpoint settings               | job                  |
| cost        | the hourly rate                                      | job, reporter        |
| aws         | region, endpoint override, bus, topic, idempotency   | everyone             |

The job's pod gets every setting of the sections it uses (``Settings.job_environment``): a new job
setting reaches the pod without being listed anywhere.

Example::

    >>> s = Settings.from_env({"ICEBATCH_HOME": "/tmp/ib", "ICEBATCH_BATCH_SIZE": "32"})
    >>> s.engine.batch_size, s.catalog.source_table
    (32, 'support.tickets')
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError
from pydantic_settings.sources.utils import parse_env_vars

from icebatch.core import untrusted
from icebatch.core.costs.instances import (
    INSTANCE_TYPES,
    BillingRate,
    Resources,
    billing_rate,
    can_host,
    parse_cpu,
    parse_memory,
)
from icebatch.core.costs.prices import AS_OF as BATCH_PRICES_AS_OF
from icebatch.core.costs.prices import DEFAULT_SPEC as DEFAULT_BATCH_PRICES
from icebatch.core.costs.prices import BatchPrice, parse_prices
from icebatch.core.errors import ConfigError
from icebatch.core.failpoints import POINTS

ENV_PREFIX = "ICEBATCH_"
TABLE_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")
DEPLOYMENT = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,63}$")
# Not settings: read by the Makefile, the tests or the benchmarks, allowed beside the settings.
# not settings: the dev environment's (Makefile), and the mark a local job's processes inherit (its watchdog's:
# icebatch_job.local.reaper)
# not settings: the Makefile's and the tests', and what the job exports to the processes it starts
_IGNORED_VARS = {
    "ICEBATCH_VENV",
    "ICEBATCH_CACHE",
    "ICEBATCH_PYTHON",
    "ICEBATCH_TEST_KEEP",
    "ICEBATCH_JOB_TREE",  # icebatch_job.local.reaper
    "ICEBATCH_ENGINE_START_LOG",  # icebatch_job.process.engine_start
}
_SECRET = re.compile(r"CREDENTIAL|TOKEN|SECRET|PASSWORD|KEY", re.IGNORECASE)
_environ: ContextVar[Mapping[str, str] | None] = ContextVar("icebatch_environ", default=None)


class _Environ(EnvSettingsSource):
    """pydantic-settings' environment source, reading the mapping ``Settings.from_env`` was given."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        env = os.environ if _environ.get() is None else _environ.get()
        assert env is not None
        # names are upper case only (ICEBATCH_BATCH_SIZE, not icebatch_batch_size); empty means unset
        return parse_env_vars({k: v for k, v in env.items() if k.isupper()}, False, True)


_EXACT_TEXT: dict[type, tuple[re.Pattern[str], str]] = {
    bool: (re.compile(r"true|false"), "`true` or `false`"),
    int: (re.compile(r"-?[0-9]{1,18}"), "a whole number (digits only)"),
    float: (
        re.compile(r"-?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE][-+]?[0-9]{1,2})?"),
        "a finite decimal number",
    ),
}


def _scalar(annotation: Any) -> type | None:
    """bool, int or float for a field of that type (or optional), else None."""
    kinds = [a for a in (get_args(annotation) or (annotation,)) if a is not type(None)]
    return kinds[0] if len(kinds) == 1 and kinds[0] in _EXACT_TEXT else None


class Section(BaseSettings):
    """A group of settings read from ``ICEBATCH_*`` variables."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="ignore", case_sensitive=False, allow_inf_nan=False
    )
    title: ClassVar[str] = ""

    @field_validator("*", mode="before")
    @classmethod
    def _exact_text(cls, value: Any, info: ValidationInfo) -> Any:
        """A variable's text is exactly its value: no `yes`/`on`/`1` for true, `2_048`, ` 5`, `+5`, `inf`, `nan`."""
        kind = _scalar(cls.model_fields[info.field_name].annotation) if info.field_name else None
        if isinstance(value, str) and kind is not None:
            pattern, what = _EXACT_TEXT[kind]
            if not pattern.fullmatch(value):
                raise ValueError(f"'{untrusted.summarize(value, 40)}' is not {what}")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _Environ(settings_cls, case_sensitive=False, env_prefix=ENV_PREFIX)

    @classmethod
    def env_name(cls, field: str) -> str:
        return ENV_PREFIX + field.upper()


# ---------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------
class CatalogSettings(Section):
    title: ClassVar[str] = "catalog"

    catalog_name: str = Field(default="icebatch", description="Name given to the pyiceberg catalog.")
    catalog_type: Literal["sql", "glue", "pyiceberg"] = Field(
        default="sql",
        description="`sql` (SQLite under ICEBATCH_HOME, the embedded default), `glue`, or `pyiceberg`: the catalog "
        "named ICEBATCH_CATALOG_NAME as pyiceberg configures it (`.pyiceberg.yaml`, `PYICEBERG_CATALOG__<NAME>__*`): "
        "REST (S3 Tables, Polaris, Nessie, Lakekeeper), Hive, SQL elsewhere.",
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
    source_table: str = Field(
        default="support.tickets",
        description="The source table `namespace.table` (consumers may name another).",
    )

    @field_validator("source_table")
    @classmethod
    def _identifier(cls, value: str) -> str:
        return table_identifier(value)


class LaunchSettings(Section):
    title: ClassVar[str] = "launch"

    consumers_file: Path | None = Field(
        default=None,
        description="The consumers of the table (YAML): their tasks, thresholds, budgets. Default: the project's "
        "`consumers.yaml` beside its home (the command line; `icebatch init` writes one), else the example's "
        "(`consumers/consumers.yaml` in the installed `icebatch` package, bundled with the functions).",
    )
    dry_run: bool = Field(default=False, description="Decide and build manifests, never submit (shadow mode).")
    share_jobs: bool = Field(
        default=True,
        description="Consumers of one model that launch at the same time share one job: one node, one model load, "
        "one engine; each run keeps its own range, results, watermark and report, and pays its share of the node by "
        "tokens. `false`: a job per consumer.",
    )
    max_attempts: int = Field(
        default=3, ge=1, le=100, description="Failed jobs from the same watermark before launches stop for an operator."
    )
    local_mode: Literal["inprocess", "ray-jobs"] = Field(
        default="inprocess",
        description="Local backend: run the job in the launcher's process, or submit it to a local Ray "
        "cluster through Ray's job submission API.",
    )
    ray_address: str | None = Field(
        default=None,
        description="Ray dashboard address for `ray-jobs` mode (e.g. `http://127.0.0.1:8265`). "
        "Default: the home's own head, started on demand on free ports of 127.0.0.1 "
        "(its address in `$ICEBATCH_HOME/ray-head.json`).",
    )
    rows_per_gpu_hour: int = Field(
        default=120_000,
        ge=1,
        le=10**9,
        description="Planning throughput of one GPU: sizes the worker group and the estimates.",
    )
    startup_seconds_prior: int = Field(
        default=180,
        ge=0,
        le=86400,
        description="What an estimate assumes one GPU worker's start-up costs (node, image, model load, engine) "
        "until the consumer has runs of its task version to measure it from.",
    )
    row_tokens_prior: int = Field(
        default=250,
        ge=0,
        le=1_000_000,
        description="What an estimate assumes the input columns of one row add to its prompt, in tokens (about 4 "
        "characters each), until the consumer has runs of its task version to measure it from. The default, 250, "
        "is about 1,000 characters: a short message and its subject.",
    )
    target_job_hours: float = Field(
        default=1.0, gt=0, le=168, description="Size the worker group so the backlog drains in about this long."
    )
    finished_job_retention_seconds: int = Field(
        default=7 * 86400, ge=0, le=366 * 86400, description="Reported, finished RayJobs are deleted after this long."
    )


class KubernetesSettings(Section):
    title: ClassVar[str] = "kubernetes"

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
        default="icebatch-job", description="Kubernetes service account of the job pods (its IAM role: JobRole)."
    )
    job_deadline_seconds: int = Field(default=4 * 3600, ge=60, le=7 * 86400, description="`activeDeadlineSeconds`.")
    job_start_deadline_seconds: int = Field(
        default=1800,
        ge=0,
        le=7 * 86400,
        description="`preRunningDeadlineSeconds` (KubeRay 1.6+): a RayJob whose cluster (head and GPU workers: "
        "nodes to provision, the image to pull) is not running its job after this long fails "
        "(`PreRunningDeadlineExceeded`) instead of waiting until `activeDeadlineSeconds` (0: no such deadline).",
    )
    job_backoff_limit: int = Field(default=1, ge=0, le=100, description="`backoffLimit` of the RayJob.")


# What a GPU worker's processes need in host memory besides /dev/shm: the engine (vLLM, torch, the CUDA
# context, one safetensors shard at a time while loading), Ray's raylet and the worker (docs/deploy.md,
# "Sizing the GPU worker").
ENGINE_HOST_MIB = 6 * 1024


class ClusterSettings(Section):
    title: ClassVar[str] = "cluster"

    gpu_node_pool: str = Field(default="icebatch-gpu", description="Karpenter NodePool for the GPU workers.")
    cpu_node_pool: str = Field(
        default="icebatch-cpu",
        max_length=63,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$",
        description="Karpenter NodePool for the Ray head and the job's submitter (small on-demand CPU nodes, "
        "`jobimage/k8s/karpenter.yaml`). Empty: they run wherever the cluster has untainted CPU capacity.",
    )
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
    worker_shm: str = Field(
        default="2Gi",
        description="Memory-backed `/dev/shm` of a GPU worker pod (a container's is 64 MB otherwise): Ray's object "
        "store (80 % of it, `object-store-memory`) and NCCL live there. It counts in ICEBATCH_WORKER_MEMORY, "
        f"which must leave at least {ENGINE_HOST_MIB // 1024} Gi beside it for the engine's processes.",
    )
    job_ttl_seconds: int = Field(
        default=60, ge=0, le=7 * 86400, description="`ttlSecondsAfterFinished`: how long a finished cluster lingers."
    )
    karpenter_consolidate_seconds: int = Field(
        default=30, ge=0, le=86400, description="Karpenter `consolidateAfter` for empty GPU nodes (idle tail)."
    )

    @field_validator("worker_cpu")
    @classmethod
    def _cpu_quantity(cls, value: str) -> str:
        parse_cpu(value)
        return value

    @field_validator("worker_memory", "worker_shm")
    @classmethod
    def _memory_quantity(cls, value: str) -> str:
        parse_memory(value)
        return value

    @model_validator(mode="after")
    def _room_beside_the_shared_memory(self) -> ClusterSettings:
        left = parse_memory(self.worker_memory) - parse_memory(self.worker_shm)
        if left < ENGINE_HOST_MIB:
            raise ValueError(
                f"ICEBATCH_WORKER_MEMORY={self.worker_memory} leaves {max(left, 0)} MiB beside ICEBATCH_WORKER_SHM="
                f"{self.worker_shm} (memory-backed, counted in the pod's limit); the engine's processes need "
                f"{ENGINE_HOST_MIB} MiB: raise ICEBATCH_WORKER_MEMORY or lower ICEBATCH_WORKER_SHM"
            )
        return self

    @property
    def worker_requests(self) -> Resources:
        return Resources(cpu_milli=parse_cpu(self.worker_cpu), memory_mib=parse_memory(self.worker_memory))

    def hosting_instance_types(self, gpus: int = 1) -> list[str]:
        """The allowed instance types a worker with ``gpus`` fits (types unknown to ``icebatch.core.costs.instances``
        are kept)."""
        requests = self.worker_requests
        return [
            t for t in self.gpu_instance_types if t not in INSTANCE_TYPES or can_host(INSTANCE_TYPES[t], requests, gpus)
        ]


class EngineSettings(Section):
    title: ClassVar[str] = "engine"

    model_source: str | None = Field(
        default=None,
        description="Default model of the consumers: a local path, a Hugging Face id or an `s3://` prefix. "
        "Default: the tiny local model under ICEBATCH_HOME, built on first use.",
    )
    model_load_format: Literal["download", "runai_streamer", "nvme_streamer", "dummy"] = Field(
        default="download",
        description="How an `s3://` model reaches the engine: `download` (to the node's disk, by Ray Data LLM, "
        "before the engine starts; vLLM's default loader reads it back), `runai_streamer` (streamed from S3 into GPU "
        "memory at each engine start) or `nvme_streamer` (copied once to the node's disk, on EKS the NVMe-backed "
        "model cache, by each GPU worker's init container before Ray starts there; streamed from that copy at each "
        "engine start). The streamers need `runai-model-streamer[s3]`, which the job image installs. `dummy`: random "
        "weights of the model's architecture, from its config.json alone (benchmarks only: `make bench-gpu`, "
        "`bench.pipeline_vs_bare --model small`).",
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
    endpoint_concurrency: int = Field(default=8, ge=1, le=1024, description="Requests in flight to the endpoint.")
    endpoint_max_retries: int = Field(default=4, ge=0, le=20, description="Retries per request (with backoff).")
    device: Literal["auto", "cpu", "gpu"] = Field(
        default="auto", description="`auto` picks gpu when the Ray cluster has GPUs, else cpu."
    )
    accelerator_type: str | None = Field(default=None, description="Ray accelerator type, e.g. `L4`.")
    dtype: Literal["auto", "bfloat16", "float16", "half", "float32", "float"] = Field(
        default="auto",
        description="vLLM dtype (its names). `auto`: the model's own, but float32 on a CPU without native "
        "bfloat16 (AVX512-BF16, AMX), which emulates it at about half the speed.",
    )
    max_model_len: int = Field(
        default=2048, ge=128, le=2**20, description="Context length; longer inputs are truncated."
    )
    gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1, description="vLLM (GPU only).")
    kv_cache_gib: float = Field(
        default=1.0, gt=0, le=4096, description="KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE)."
    )
    enable_prefix_caching: bool = Field(default=True, description="vLLM prefix caching (shared system prompt).")
    enable_chunked_prefill: bool = Field(default=True, description="vLLM chunked prefill.")
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        le=2**20,
        description="vLLM max_num_batched_tokens (default: vLLM's offline defaults, as `vllm.LLM` gets them: 4096 "
        "per replica on CPU, 8192 on a GPU, 16384 on H100/H200/B200).",
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        le=65_536,
        description="vLLM max_num_seqs (default: vLLM's offline default: 256 per replica).",
    )
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        le=8,
        description="GPUs per engine replica: vLLM tensor parallelism across the GPUs of one worker (each RayJob "
        "worker asks for this many `nvidia.com/gpu`, on an instance type that has them).",
    )
    enforce_eager: bool | None = Field(
        default=None, description="Skip graph compilation (default: on for CPU, off for GPU)."
    )
    engine_metrics: bool | None = Field(
        default=None,
        description="vLLM's engine stats (queues, KV cache use, latencies) on Ray's Prometheus endpoint (default: on "
        "for GPU, off for CPU, where collecting them costs ~8 % of generation on two cores; `vllm.LLM` has them off).",
    )
    batch_size: int = Field(default=64, ge=1, le=65_536, description="Rows per batch sent to an engine replica.")
    concurrency: int = Field(
        default=1, ge=1, le=64, description="Engine replicas (one GPU worker each; see ICEBATCH_TENSOR_PARALLEL_SIZE)."
    )
    structured_output: bool = Field(default=True, description="Constrain output to the task's JSON schema.")
    max_inference_error_rate: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="A run whose share of `inference_error` rows (engine/endpoint failures, not bad answers) "
        "exceeds this fails before the chunk that crosses it: earlier chunks stay, the rest stays pending.",
    )

    @model_validator(mode="after")
    def _endpoint(self) -> EngineSettings:
        if self.engine_mode == "endpoint" and not self.endpoint_url:
            raise ValueError("engine_mode=endpoint needs ICEBATCH_ENDPOINT_URL (an OpenAI-compatible base URL)")
        return self


class ProgressSettings(Section):
    title: ClassVar[str] = "progress"

    chunk_rows: int = Field(
        default=1200,
        ge=1,
        le=1_000_000,
        description="A run commits its results every this many finished rows (with its progress, one Iceberg "
        "commit each): a crash or a spot interruption redoes at most one chunk. Measured cost at the default: "
        "docs/performance.md.",
    )
    chunk_seconds: float = Field(
        default=300,
        ge=0,
        le=86400,
        description="... or every this many seconds, whichever comes first (0: rows only).",
    )
    drain_seconds: float = Field(
        default=60,
        gt=0,
        le=110,
        description="On SIGTERM (spot notice, drain, deadline) the job commits the rows it has finished and "
        "exits within this many seconds (a spot notice gives 120); a second signal exits at once.",
    )
    stall_seconds: int = Field(
        default=1800,
        ge=0,
        le=7 * 86400,
        description="A job that has waited this long for a result (the first one: counted from the pipeline's "
        "start, the engine's start included) stops as on SIGTERM and reports a resumable failure, instead of "
        "billing its nodes until its deadline (0: wait until the deadline).",
    )
    failpoint: str | None = Field(
        default=None,
        description="Fault injection for tests and chaos drills: `<point>[@<n>]` pauses the job the n-th "
        "time it reaches the point (docs/concepts/protocol.md lists them) so that it can be killed there.",
    )

    @field_validator("failpoint")
    @classmethod
    def _failpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        name, at, nth = value.partition("@")
        if name not in POINTS or (at and not (nth.isdigit() and 0 < int(nth) <= 10**6)):
            raise ValueError(f"{value[:60]!r} is not `<point>[@<n>]` with a point among {', '.join(POINTS)}")
        return value


class CostSettings(Section):
    title: ClassVar[str] = "cost"

    gpu_hourly_rate: float | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="$ per GPU worker-hour. Default: the on-demand price (us-east-1) of the cheapest allowed "
        "instance type that can host the worker; reports name the type.",
    )
    batch_api_prices: str = Field(
        default=DEFAULT_BATCH_PRICES,
        max_length=2000,
        description="What a run's tokens would cost at batch APIs, beside the GPU's, in each report: "
        "`provider:model=<input $/1M tokens>/<output $/1M tokens>`, `;`-separated (at most 10), or `off`. Default: "
        f"batch list prices of {BATCH_PRICES_AS_OF} (OpenAI, Anthropic, Bedrock batch: 50% of list).",
    )

    report_last_runs: int = Field(
        default=5,
        ge=0,
        le=50,
        description="Each report lists the consumer's last runs before this one (when, rows, cost, $ per 1k rows) "
        "from its ledger, to set this run beside them; 0 leaves them out. The reporter reads the results table's "
        "metadata for it (its role may: template.yaml); when it cannot, the report goes without them.",
    )

    @field_validator("batch_api_prices")
    @classmethod
    def _prices(cls, value: str) -> str:
        parse_prices(value)
        return value

    def batch_prices(self) -> tuple[BatchPrice, ...]:
        return parse_prices(self.batch_api_prices)


class AwsSettings(Section):
    title: ClassVar[str] = "aws"

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


class TopSettings(Section):
    title: ClassVar[str] = ""

    home: Path = Field(
        default=Path(".icebatch"),
        description="Folder for local state: SQL catalog, warehouse, tiny model, caches, reports, Ray temp. Unset, "
        "the command line uses the `.icebatch` folder of the current folder or of the nearest folder above it that "
        "has one (as git finds `.git`); outside any, only `init`, `generate`, `demo` and `model` make one here.",
    )
    deployment: str = Field(
        default="local",
        description="Name of this deployment (the stack name in AWS): events, RayJobs and reports carry it, "
        "and a deployment acts only on its own.",
    )
    backend: Literal["local", "kuberay"] = Field(
        default="local", description="Where jobs run: `local` (this machine) or `kuberay` (RayJob on EKS)."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="Log level.")
    job_consumer: str | None = Field(
        default=None,
        description="Set by the launcher for a job: the consumer it runs for, with its task (JSON). Not set by hand.",
    )
    job_launched_at: float | None = Field(
        default=None,
        ge=0,
        description="Set by the launcher for a job: when it submitted the RayJob (Unix seconds). The time from it to "
        "the job's process (the GPU node, the image pull, the Ray cluster's start) is measured and billed with the "
        "run. Not set by hand.",
    )
    job_engine: Literal["on", "off"] = Field(
        default="on",
        description="Set by the launcher for a job: `off` when it gave the run no GPU (rows deleted or rewritten, "
        "none added). Such a run removes verdicts; rows whose content changed and need the model are left to the "
        "range's next attempt, which gets a GPU. Not set by hand.",
    )

    @field_validator("deployment")
    @classmethod
    def _deployment(cls, value: str) -> str:
        if not DEPLOYMENT.match(value):
            raise ValueError(f"{value[:80]!r} must be letters, digits and '-' (at most 64), starting with a letter")
        return value


SECTIONS: dict[str, type[Section]] = {
    "top": TopSettings,
    "catalog": CatalogSettings,
    "launch": LaunchSettings,
    "kubernetes": KubernetesSettings,
    "cluster": ClusterSettings,
    "engine": EngineSettings,
    "progress": ProgressSettings,
    "cost": CostSettings,
    "aws": AwsSettings,
}
# What the job's pod is given (all of it: a new job setting needs no list entry).
JOB_SECTIONS = ("top", "catalog", "cluster", "engine", "progress", "cost", "aws")


class Settings(BaseModel):
    """Everything icebatch can be told, by concern. docs/reference/settings.md is generated from the sections."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    top: TopSettings
    catalog: CatalogSettings
    launch: LaunchSettings
    kubernetes: KubernetesSettings
    cluster: ClusterSettings
    engine: EngineSettings
    progress: ProgressSettings
    cost: CostSettings
    aws: AwsSettings

    @model_validator(mode="before")
    @classmethod
    def _sections(cls, data: Any) -> Any:
        """``Settings(home=..., backend=...)``: fields by name go to their section; the rest are defaults.

        Sections are built from what is given only (never from the environment: that is ``from_env``).
        """
        if not isinstance(data, dict):
            return data
        grouped: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        built: dict[str, Any] = {}
        for key, value in data.items():
            if key in SECTIONS:
                if isinstance(value, Section):
                    built[key] = value
                else:
                    grouped[key].update(dict(value or {}))
            else:
                grouped[section_of(key)][key] = value
        with _reading({}):
            return {name: built.get(name) or SECTIONS[name](**grouped[name]) for name in SECTIONS}

    @model_validator(mode="after")
    def _cross_checks(self) -> Settings:
        if self.top.backend == "kuberay":
            self.billing()  # some allowed instance type must be able to host the worker
        return self

    # --- derived ----------------------------------------------------------------------------------
    @property
    def home(self) -> Path:
        return self.top.home.expanduser().resolve()

    @property
    def reports_dir(self) -> Path:
        return self.home / "reports"

    @property
    def tiny_model_dir(self) -> Path:
        return self.home / "models" / "tiny-llama"

    def billing(self) -> BillingRate:
        """The rate reports bill per GPU worker-hour (a worker holds ``tensor_parallel_size`` GPUs), and the
        instance type it assumes."""
        c, gpus = self.cluster, self.engine.tensor_parallel_size
        try:
            return billing_rate(list(c.gpu_instance_types), c.worker_requests, gpus, self.cost.gpu_hourly_rate)
        except ValueError as e:
            raise ValueError(
                f"{e}: lower ICEBATCH_WORKER_MEMORY/ICEBATCH_WORKER_CPU, allow bigger ICEBATCH_GPU_INSTANCE_TYPES, "
                "or set ICEBATCH_GPU_HOURLY_RATE"
            ) from e

    def catalog_props(self, *, control_plane: bool = False) -> dict[str, str]:
        """pyiceberg catalog properties.

        ``control_plane=True`` selects icebatch's small metadata FileIO (boto3 for s3://, the OS for
        file://) so that reading metadata never imports pyarrow or s3fs (the Lambda bundle has neither).
        """
        c, aws = self.catalog, self.aws
        props: dict[str, str] = {} if c.catalog_type == "pyiceberg" else {"type": c.catalog_type}
        if c.catalog_type == "pyiceberg":  # pyiceberg merges its own configuration of the name under these
            pass
        elif c.catalog_type == "sql":
            props["uri"] = c.catalog_uri or f"sqlite:///{self.home / 'catalog.db'}"
            props["warehouse"] = c.warehouse or f"file://{self.home / 'warehouse'}"
        elif c.warehouse:
            props["warehouse"] = c.warehouse
        if c.catalog_type == "glue":
            if aws.aws_region:
                for key in ("glue.region", "s3.region", "client.region"):
                    props.setdefault(key, aws.aws_region)
            if aws.aws_endpoint_url:
                props.setdefault("glue.endpoint", aws.aws_endpoint_url)
                props.setdefault("s3.endpoint", aws.aws_endpoint_url)
        if control_plane:
            props["py-io-impl"] = "icebatch.core.metadata_io.MetadataFileIO"
        props.update(c.catalog_properties)
        return props

    def pyiceberg_catalog_environment(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """With catalog type ``pyiceberg``: the ``PYICEBERG_CATALOG__<NAME>__*`` variables of this process that a
        job's pod needs to open the same catalog, less credentials (a key naming a credential, token, secret or
        password: the pod gets those from its own identity or secret, not from a manifest)."""
        if self.catalog.catalog_type != "pyiceberg":
            return {}
        prefix = f"PYICEBERG_CATALOG__{self.catalog.catalog_name.upper()}__"
        env = os.environ if environ is None else environ
        return {k: v for k, v in sorted(env.items()) if k.startswith(prefix) and not _SECRET.search(k[len(prefix) :])}

    def job_environment(self, **changes: Any) -> dict[str, str]:
        """The ``ICEBATCH_*`` variables of a job's process: every setting of the sections the job uses.

        ``changes`` (field name -> value) override; defaults are left out, ``None`` removes a variable.
        """
        env: dict[str, str] = {}
        for name in JOB_SECTIONS:
            section = getattr(self, name)
            for field, info in type(section).model_fields.items():
                value = changes.get(field, getattr(section, field))
                if value is None or (field not in changes and value == _default(info)):
                    continue
                env[Section.env_name(field)] = env_text(value)
        return dict(sorted(env.items()))

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed (by field name, whatever their section; validated)."""
        data: dict[str, Any] = {name: getattr(self, name).model_dump() for name in SECTIONS}
        for field, value in changes.items():
            data[section_of(field)][field] = value
        try:
            return Settings(**data)
        except ValidationError as e:
            raise ConfigError(explain(e)) from e

    # --- construction -------------------------------------------------------------------------------
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``ICEBATCH_*`` variables; raise ConfigError naming the variable to fix."""
        env = dict(os.environ if environ is None else environ)
        if not env.get("ICEBATCH_AWS_REGION") and (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")):
            # Lambda's runtime (and most shells) name the region here; the job's pods get it from the launcher
            env["ICEBATCH_AWS_REGION"] = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or ""
        known = set(env_names().values())
        unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known and k not in _IGNORED_VARS)
        if unknown:
            shown = ", ".join(name[:64] for name in unknown[:10])
            raise ConfigError(f"unknown setting(s) {shown}; see `icebatch config --help` for the valid names")
        try:
            with _reading(env):
                sections = {name: section() for name, section in SECTIONS.items()}
            return cls(**sections)
        except ValidationError as e:
            raise ConfigError(explain(e)) from e
        except SettingsError as e:
            raise ConfigError(_explain_parse(e)) from e


@contextmanager
def _reading(env: Mapping[str, str]) -> Iterator[None]:
    token = _environ.set(env)
    try:
        yield
    finally:
        _environ.reset(token)


def _default(info: FieldInfo) -> Any:
    return info.get_default(call_default_factory=True)


def ensure_folder(path: Path, *, setting: str = "ICEBATCH_HOME") -> Path:
    """``path``, created if missing, that this process can write; else a ConfigError naming ``setting``."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "a file is there" if path.is_file() else e.strerror
        raise ConfigError(
            f"cannot create the folder {untrusted.summarize(str(path), 200)} ({why}): "
            f"set {setting} to a folder this user can write"
        ) from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(
            f"cannot write in the folder {untrusted.summarize(str(path), 200)}: set {setting} to a folder this "
            "user can write"
        )
    return path


def env_text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def table_identifier(value: str) -> str:
    if not TABLE_IDENTIFIER.match(value):
        raise ValueError(f"{value[:120]!r} is not `namespace.table` (letters, digits, underscores)")
    return value


def section_of(field: str) -> str:
    for name, section in SECTIONS.items():
        if field in section.model_fields:
            return name
    raise ValueError(f"no setting named {field[:64]!r}")


def env_names() -> dict[str, str]:
    """Field name -> environment variable, every section."""
    return {field: Section.env_name(field) for section in SECTIONS.values() for field in section.model_fields}


def explain(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        field = next((str(p) for p in reversed(item["loc"]) if isinstance(p, str) and p in env_names()), "")
        var = env_names().get(field, "settings")
        lines.append(f"{var}: {item['msg']}")
    return "invalid configuration: " + "; ".join(lines)


def _explain_parse(error: SettingsError) -> str:
    m = re.search(r'field "([a-z_]+)"', str(error))
    var = env_names().get(m.group(1), "a setting") if m else "a setting"
    return f"{var} must be JSON (a list or an object, as its description says)"
