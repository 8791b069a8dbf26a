"""The consumers of a table: each an LLM task with its own results table, watermark, policy and budget.

A deployment declares them in a small YAML file (``ICEBATCH_CONSUMERS_FILE``, default
``functions/icebatch/consumers/consumers.yaml``, bundled with the functions)::

    consumers:
      - name: triage
        task: tasks/triage.json          # relative to the consumers file
        backlog_threshold: 100
        budget: {max_usd_per_run: 25.0}

The launcher evaluates every consumer of the table that changed. A job runs for one consumer, whose
resolved declaration — the task spec included — the launcher hands it (``ICEBATCH_JOB_CONSUMER``), so
the job runs exactly the task version the launcher estimated, without a file of its own.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from icebatch.core import untrusted
from icebatch.core.config_files import field_problem, load_yaml, read_text
from icebatch.core.errors import ConfigError, TaskSpecError
from icebatch.core.settings import Settings, table_identifier
from icebatch.core.task import MIN_PROMPT_TOKENS, TaskSpec, load_task

CONSUMER_NAME = re.compile(untrusted.CONSUMER_NAME)
DEFAULT_CONSUMERS_FILE = Path(__file__).resolve().parents[1] / "consumers" / "consumers.yaml"
MAX_CONSUMERS = 50
# A job gets its consumer in one environment variable (ICEBATCH_JOB_CONSUMER), and Linux refuses to start a
# process with a variable over 128 KiB (MAX_ARG_STRLEN, name included): the pod of a RayJob would not start.
MAX_JOB_CONSUMER_BYTES = 128 * 1024 - len("ICEBATCH_JOB_CONSUMER=") - 1


class Budget(BaseModel):
    """Spending limits of a consumer, in USD (the cost model's GPU lifetime figure)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    max_usd_per_run: float | None = Field(default=None, gt=0, description="Refuse a run estimated above this.")
    max_usd_per_day: float | None = Field(
        default=None, gt=0, description="Refuse a run that would take today's (UTC) spend above this."
    )


Threshold = Annotated[int, Field(ge=1, le=10**12)]
Staleness = Annotated[int, Field(ge=0, le=366 * 86400)]
Gpus = Annotated[int, Field(ge=1, le=64)]
ModelName = Annotated[str, Field(min_length=1, max_length=1024)]
# what a row of the source is called in reports, SNS subjects and the CLI ("tickets", "reviews")
RowNoun = Annotated[str, Field(pattern=r"^[a-z][a-z -]{0,22}[a-z]$")]
UsdPer1kRows = Annotated[float, Field(gt=0, le=10_000)]
# a batch API price's name (``ICEBATCH_BATCH_API_PRICES``), ``cheapest`` of them, or ``off``
CostReference = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")]
MAX_USD_PER_1K_ROWS = (
    "The cost gate's ceiling: an append launches a run only when its estimate, start-up and idle tail included, "
    "is at most this many $ per 1k rows (or when the oldest waiting row reaches max_staleness_seconds). Default: "
    "the cost_reference's price for the same tokens."
)
COST_REFERENCE = (
    "What a run is compared with when max_usd_per_1k_rows is not set: a batch API of ICEBATCH_BATCH_API_PRICES by "
    "name (`openai-batch:gpt-4o-mini`), `cheapest` of them for the run's tokens, or `off` (no cost gate: an append "
    "launches at backlog_threshold)."
)
LINGER_SECONDS = (
    "How long a job that drained its range looks back for, and waits for, more rows: it keeps its GPU node while "
    "the rows that landed within this window would have paid for a cold start. Default on EKS: what a cold start "
    "costs in time (the measured start-up and the idle tail); a local job (it runs in the command that launched it) "
    "lingers only where this is set."
)
OnDelete = Literal["delete", "keep"]
OnUpdate = Literal["relabel", "keep_first"]
ON_DELETE = (
    "Verdicts of rows deleted from the source: `delete` (removed by the next run, in the commit that moves the "
    "watermark) or `keep` (the results stay a record of what was labelled)."
)
ON_UPDATE = (
    "A labelled row whose content (its id and the columns the task reads) changed: `relabel` (sent to the model "
    "again, its new verdict replacing the old) or `keep_first` (not sent again: its first verdict stays)."
)


def _consumer_name(value: str) -> str:
    if not CONSUMER_NAME.match(value):
        raise ValueError(
            f"{value[:40]!r} must start with a letter and use lower case, digits and '-' (at most 20): it "
            "becomes part of Kubernetes names and table names"
        )
    return value


class _Entry(BaseModel):
    """One consumer as written in the consumers file."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    name: str
    task: str = Field(description="Task spec file, relative to the consumers file.")
    source_table: str | None = None
    results_table: str | None = None
    backlog_threshold: Threshold = 100
    max_staleness_seconds: Staleness = 6 * 3600
    max_gpus: Gpus = 4
    model: ModelName | None = None
    max_usd_per_1k_rows: UsdPer1kRows | None = Field(default=None, description=MAX_USD_PER_1K_ROWS)
    cost_reference: CostReference = Field(default="cheapest", description=COST_REFERENCE)
    linger_seconds: Annotated[int, Field(ge=0, le=86400)] | None = Field(default=None, description=LINGER_SECONDS)
    budget: Budget | None = None
    row_noun: RowNoun = Field(default="rows", description='What a source row is called in reports ("tickets").')
    on_delete: OnDelete = Field(default="delete", description=ON_DELETE)
    on_update: OnUpdate = Field(default="relabel", description=ON_UPDATE)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _consumer_name(value)


class Consumer(BaseModel):
    """A consumer, resolved: its task loaded, its tables named."""

    # strict and bounded as the consumers file is: the job reads it from ICEBATCH_JOB_CONSUMER
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    name: str
    task: TaskSpec
    source_table: str
    results_table: str
    backlog_threshold: Threshold = 100
    max_staleness_seconds: Staleness = 6 * 3600
    max_gpus: Gpus = 4
    model: ModelName | None = None
    max_usd_per_1k_rows: UsdPer1kRows | None = Field(default=None, description=MAX_USD_PER_1K_ROWS)
    cost_reference: CostReference = Field(default="cheapest", description=COST_REFERENCE)
    linger_seconds: Annotated[int, Field(ge=0, le=86400)] | None = Field(default=None, description=LINGER_SECONDS)
    budget: Budget | None = None
    row_noun: RowNoun = Field(default="rows", description='What a source row is called in reports ("tickets").')
    on_delete: OnDelete = Field(default="delete", description=ON_DELETE)
    on_update: OnUpdate = Field(default="relabel", description=ON_UPDATE)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _consumer_name(value)

    @field_validator("source_table", "results_table")
    @classmethod
    def _table(cls, value: str) -> str:
        return table_identifier(value)

    @model_validator(mode="after")
    def _distinct_tables(self) -> Consumer:
        if self.results_table.lower() == self.source_table.lower():
            raise ValueError("the results table cannot be the source table (the source stays read-only)")
        return self

    @property
    def task_version(self) -> int:
        return self.task.version

    def model_source(self, settings: Settings) -> str | None:
        """The consumer's model, else the deployment's default (None: the tiny local model)."""
        return self.model or settings.engine.model_source

    def to_json(self) -> str:
        """The consumer as the launcher hands it to a job (unset optional values left out: they read back None)."""
        return self.model_dump_json(exclude_none=True)


def results_table_for(source_table: str, consumer: str) -> str:
    namespace, name = source_table.split(".")
    return f"{namespace}.{name}_{consumer.replace('-', '_')}_results"


# a job's consumer, or a shared job's (``icebatch_job.shared``), as the launcher hands them over
_JOB_CONSUMERS: TypeAdapter[list[Consumer]] = TypeAdapter(Annotated[list[Consumer], Field(min_length=1, max_length=16)])


def job_consumers_json(consumers: list[Consumer]) -> str:
    """What a job gets in ``ICEBATCH_JOB_CONSUMER``: its consumer, or a shared job's list of them."""
    if len(consumers) == 1:
        return consumers[0].to_json()
    return "[" + ",".join(c.to_json() for c in consumers) + "]"


def load_consumers(settings: Settings) -> list[Consumer]:
    """The deployment's consumers (or, inside a job, the consumers the launcher handed it)."""
    if settings.top.job_consumer:
        given = settings.top.job_consumer
        try:
            shared = given.lstrip().startswith("[")  # a shared job's (``icebatch_job.shared``)
            consumers = _JOB_CONSUMERS.validate_json(given) if shared else [Consumer.model_validate_json(given)]
        except ValidationError as e:
            raise ConfigError(f"ICEBATCH_JOB_CONSUMER is not a consumer: {_first(e)}") from e
    else:
        consumers = read_consumers_file(settings.launch.consumers_file or DEFAULT_CONSUMERS_FILE, settings)
    for consumer in consumers:
        _check_fits(consumer, settings)
        _check_travels(consumer)
        _check_reference(consumer, settings)
    return consumers


def _check_travels(consumer: Consumer) -> None:
    """A consumer must fit in the environment variable that hands it to its job: refused before a launch."""
    size = len(consumer.to_json().encode())
    if size > MAX_JOB_CONSUMER_BYTES:
        raise ConfigError(
            f"consumer {consumer.name!r} is {size:,} bytes as the launcher hands it to a job (its task included, "
            f"in ICEBATCH_JOB_CONSUMER), more than the {MAX_JOB_CONSUMER_BYTES:,} an environment variable can hold "
            "(a job's process would not start). Fix: shorten the task's prompt or output schema"
        )


def _check_reference(consumer: Consumer, settings: Settings) -> None:
    """A cost reference must name a batch price the deployment lists: refused here, not by a launch that waits."""
    names = [p.name for p in settings.cost.batch_prices()]
    if consumer.cost_reference in ("cheapest", "off", *names):
        return
    close = difflib.get_close_matches(consumer.cost_reference, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(
        f"consumer {consumer.name!r}: cost_reference {consumer.cost_reference!r} is no batch price of "
        f"ICEBATCH_BATCH_API_PRICES ({', '.join(names) or 'off'}); {hint}give one of them, `cheapest` or `off`"
    )


def _check_fits(consumer: Consumer, settings: Settings) -> None:
    """A prompt must fit beside a whole answer: refused here, not on a GPU node the job started."""
    room = settings.engine.max_model_len - consumer.task.max_tokens
    if room < MIN_PROMPT_TOKENS:
        raise ConfigError(
            f"consumer {consumer.name!r}: its task's sampling.max_tokens ({consumer.task.max_tokens}) leaves {room} "
            f"of ICEBATCH_MAX_MODEL_LEN ({settings.engine.max_model_len}) tokens for the prompt, less than "
            f"{MIN_PROMPT_TOKENS}. Fix: raise ICEBATCH_MAX_MODEL_LEN or lower max_tokens"
        )


def consumers_file_schema() -> dict[str, Any]:
    """The JSON Schema of a consumers file (``contracts``: for editors; the file is checked by ``_Entry``)."""
    entry = _Entry.model_json_schema()
    definitions = entry.pop("$defs", {})
    return {
        "type": "object",
        "properties": {"consumers": {"type": "array", "items": entry, "minItems": 1, "maxItems": MAX_CONSUMERS}},
        "required": ["consumers"],
        "additionalProperties": False,
        **({"$defs": definitions} if definitions else {}),
    }


def read_consumers_file(path: Path, settings: Settings) -> list[Consumer]:
    what = f"consumers file {path}"
    text = read_text(path, what="consumers file", hint="ICEBATCH_CONSUMERS_FILE", error=ConfigError)
    data = load_yaml(text, what=what, error=ConfigError)
    entries = data.get("consumers") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries or len(entries) > MAX_CONSUMERS:
        raise ConfigError(f"consumers file {path} needs a `consumers:` list of 1 to {MAX_CONSUMERS} entries")
    consumers = [_resolve(path, i, raw, settings) for i, raw in enumerate(entries)]
    for attribute in ("name", "results_table"):
        values = [getattr(c, attribute) for c in consumers]
        duplicates = sorted({v for v in values if values.count(v) > 1})
        if duplicates:
            raise ConfigError(f"consumers file {path}: two consumers share the {attribute} {duplicates[0]!r}")
    return consumers


def _resolve(path: Path, index: int, raw: Any, settings: Settings) -> Consumer:
    where = f"consumers file {path}, entry {index + 1}"
    try:
        entry = _Entry.model_validate(raw)
        task = load_task(path.parent / entry.task)
        source = entry.source_table or settings.catalog.source_table
        return Consumer(
            name=entry.name,
            task=task,
            source_table=source,
            results_table=entry.results_table or results_table_for(source, entry.name),
            backlog_threshold=entry.backlog_threshold,
            max_staleness_seconds=entry.max_staleness_seconds,
            max_gpus=entry.max_gpus,
            model=entry.model,
            max_usd_per_1k_rows=entry.max_usd_per_1k_rows,
            cost_reference=entry.cost_reference,
            linger_seconds=entry.linger_seconds,
            budget=entry.budget,
            row_noun=entry.row_noun,
            on_delete=entry.on_delete,
            on_update=entry.on_update,
        )
    except ValidationError as e:
        raise ConfigError(f"{where}: {_first(e)}") from e
    except (ConfigError, TaskSpecError) as e:
        raise ConfigError(f"{where}: {e}") from e


def consumer_named(consumers: list[Consumer], name: str | None) -> Consumer:
    """The consumer called ``name`` (the only one when ``name`` is None and there is one)."""
    if name is None:
        if len(consumers) == 1:
            return consumers[0]
        raise ConfigError(f"more than one consumer ({', '.join(c.name for c in consumers)}): name one with --consumer")
    for consumer in consumers:
        if consumer.name == name:
            return consumer
    known = ", ".join(c.name for c in consumers)
    raise ConfigError(f"no consumer named {name[:40]!r} (known: {known})")


def _first(e: ValidationError) -> str:
    return field_problem(e.errors()[0], _Entry)
