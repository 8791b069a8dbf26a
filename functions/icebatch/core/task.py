"""The task: what to ask about each row and what shape the answer must have.

A task spec is a JSON or YAML file (``.yaml``/``.yml``: long prompts as block scalars) named by a consumer
(``functions/icebatch/consumers/consumers.yaml``; ticket triage is ``functions/icebatch/consumers/tasks/triage.json``;
JSON Schemas of both files, for editors, in ``functions/icebatch/consumers/schemas/``):

- ``system_prompt`` and ``user_template`` (``{column}`` placeholders over ``input_columns``),
- ``output_schema``: a flat JSON Schema object (string/enum/integer/number/boolean properties), checked when the
  file loads (``check_output_schema``: the meta-schema, ``required`` among the properties, every keyword one that is
  enforced, nothing no answer could satisfy). It is handed to vLLM's structured output and validates every answer
  (the ``jsonschema`` library, formats included), and its properties are the verdict columns of the results table,
- ``sampling``: sampling parameters (``max_tokens`` bounds the cost of a row), the ones vLLM's engine and
  an OpenAI-compatible server both take (``Sampling``); anything else is an error when the file loads,
  not when a GPU node has started,
- ``truncate_column``: the column shortened when a prompt does not fit ``max_model_len``.

A new task is a new spec file and a consumer entry, not code. Bump ``version`` when the prompt or schema
changes meaning: the consumer then processes the table again under the new version (a backfill), and the
old version's results stay as they are.
"""

from __future__ import annotations

import json
import re
import string
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from icebatch.core.config_files import closest, field_problem, load_json, load_yaml, read_text
from icebatch.core.errors import TaskSpecError

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

# the running example's task (functions/icebatch/consumers/tasks/): ticket triage
DEFAULT_TASK = Path(__file__).resolve().parents[1] / "consumers" / "tasks" / "triage.json"
_SUPPORTED = {"string", "integer", "number", "boolean"}
# What an output schema may say, each enforced on every answer (the rest is refused when the task loads)
OBJECT_KEYWORDS = {"type", "properties", "required", "additionalProperties", "title", "description", "$schema"}
PROPERTY_KEYWORDS = {
    "type",
    "enum",
    "const",
    "title",
    "description",
    "examples",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
}
# formats checked by jsonschema itself, the same in the Lambda bundle and the job image (no optional package)
FORMATS = ("date", "email", "ipv4", "ipv6", "uuid")


MAX_OUTPUT_TOKENS = 32_768  # per row; ICEBATCH_MAX_MODEL_LEN must leave room for the prompt as well
MIN_PROMPT_TOKENS = 32  # what max_model_len must leave for a prompt after max_tokens
Column = Annotated[str, Field(min_length=1, max_length=255)]


class Sampling(BaseModel):
    """Sampling parameters of a task: those vLLM's engine and its OpenAI-compatible server both take.

    Each row gets one answer (no ``n``), and the job asks for structured output and final outputs itself.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    max_tokens: int = Field(ge=1, le=MAX_OUTPUT_TOKENS, description="Bounds the output tokens, and the cost, of a row.")
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, description="-1 or 0: off")
    min_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=10)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(default=None, max_length=16)
    min_tokens: int | None = Field(default=None, ge=0, le=MAX_OUTPUT_TOKENS)
    ignore_eos: bool | None = None
    detokenize: bool | None = Field(
        default=None,
        description="vLLM's own: the job parses each answer's text, so it must stay on (unset or true).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Sampling:
        if self.min_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) exceeds max_tokens ({self.max_tokens})")
        if self.detokenize is False:
            raise ValueError("detokenize: false leaves the answers without text, and the job parses text: drop it")
        return self

    def params(self) -> dict[str, Any]:
        """The parameters set, as the engine and the server take them."""
        return self.model_dump(exclude_none=True)


class TaskSpec(BaseModel):
    """A prompt, an output schema and sampling parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Task name (recorded with every run): letters, digits, '.', '_' and '-'.",
    )
    version: int = Field(
        default=1,
        ge=1,
        le=2**31 - 1,  # the results table's task_version column is a 32-bit integer
        description="Bump when the prompt or schema changes meaning.",
    )
    description: str = Field(default="", max_length=1024)
    id_column: Column = Field(description="Source column that identifies a row.")
    input_columns: list[Column] = Field(min_length=1, description="Source columns the prompt uses.")
    truncate_column: Column | None = Field(default=None, description="Column shortened to fit max_model_len.")
    system_prompt: str
    user_template: str
    output_schema: dict[str, Any]
    sampling: Sampling = Field(default_factory=lambda: Sampling(temperature=0.0, max_tokens=160))

    @field_validator("output_schema")
    @classmethod
    def _checked(cls, schema: dict[str, Any]) -> dict[str, Any]:
        check_output_schema(schema)
        return schema

    @model_validator(mode="after")
    def _template_uses_inputs(self) -> TaskSpec:
        names = {f for _, f, _, _ in string.Formatter().parse(self.user_template) if f}
        unknown = sorted(names - set(self.input_columns))
        if unknown:
            # which of the two is misspelt: a placeholder close to a listed column, or a listed column close to it
            listed = [c for c in self.input_columns if c not in names]
            hint = closest(unknown[0], listed) or f" (add {unknown[0]!r} to input_columns)"
            raise ValueError(
                f"user_template reads {{{unknown[0]}}}, but input_columns {self.input_columns} does not list it{hint}"
            )
        if self.truncate_column and self.truncate_column not in self.input_columns:
            raise ValueError(f"truncate_column {self.truncate_column!r} is not in input_columns")
        return self

    # --- derived -------------------------------------------------------------------------------
    @property
    def max_tokens(self) -> int:
        return self.sampling.max_tokens

    @property
    def output_fields(self) -> dict[str, dict[str, Any]]:
        return dict(self.output_schema["properties"])

    @property
    def label_fields(self) -> list[str]:
        """Enum properties: the label breakdowns of a run report."""
        return [k for k, v in self.output_fields.items() if "enum" in v]

    @property
    def output_schema_json(self) -> str:
        """The schema structured output gets: the one answers are validated against (``answer_schema``)."""
        return json.dumps(self.answer_schema, separators=(",", ":"))

    @cached_property
    def answer_schema(self) -> dict[str, Any]:
        """The schema every answer must satisfy, as structured output gets it: the task's, with no key beyond its
        properties (they are the results table's columns)."""
        return {**self.output_schema, "additionalProperties": False}

    @cached_property
    def _validator(self) -> Validator:
        from jsonschema import Draft202012Validator, FormatChecker

        return Draft202012Validator(self.answer_schema, format_checker=FormatChecker(FORMATS))

    def render_user(self, row: dict[str, Any]) -> str:
        values = {c: _text(row.get(c)) for c in self.input_columns}
        return self.user_template.format(**values)

    @staticmethod
    def value_text(value: Any) -> str:
        """How a row's value reads in the prompt."""
        return _text(value)

    def is_empty_input(self, row: dict[str, Any]) -> bool:
        """Every input column null, empty or whitespace: there is nothing to label (status ``empty_input``)."""
        return all(row.get(c) is None or not str(row.get(c)).strip() for c in self.input_columns)

    def messages(self, row: dict[str, Any]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.render_user(row)},
        ]

    def parse(self, text: str) -> tuple[dict[str, Any] | None, str | None]:
        """Validate one model answer: (verdict, None) or (None, reason). A verdict holds every property (None where
        the answer leaves an optional one out); integers read as ints (JSON's 3.0 is the integer 3)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            return None, f"not JSON: {e.msg} at position {e.pos}"
        errors = sorted(self._validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
        if errors:
            first = errors[0]
            where = ".".join(str(p) for p in first.absolute_path) or "answer"
            return None, f"schema: {where}: {first.message[:300]} ({len(errors)} error(s))"
        verdict = {name: data.get(name) for name in self.output_fields}
        for name, prop in self.output_fields.items():
            if prop.get("type") == "integer" and isinstance(verdict[name], float):
                verdict[name] = int(verdict[name])
        return verdict, None


def check_output_schema(schema: dict[str, Any]) -> None:
    """Refuse an output schema that is not one (its meta-schema), that names a required property it lacks, says
    something no answer is checked against, or that no answer could satisfy; ValueError says which and why."""
    from jsonschema import Draft202012Validator, SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        raise ValueError(f"output_schema is not a JSON Schema: {e.message[:200]}") from None
    if schema.get("type") != "object" or not isinstance(schema.get("properties"), dict):
        raise ValueError("output_schema must be a JSON Schema object with `properties`")
    _only(schema, OBJECT_KEYWORDS, "output_schema")
    if schema.get("additionalProperties", False) is not False:
        raise ValueError("output_schema: additionalProperties must be false (each property is a results column)")
    missing = [name for name in schema.get("required", []) if name not in schema["properties"]]
    if missing:
        raise ValueError(
            f"output_schema requires {missing}, which are not among its properties: no answer can have them"
        )
    for name, prop in schema["properties"].items():
        _check_property(name, prop)


def _only(schema: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(schema) - allowed)
    if unknown:
        raise ValueError(
            f"{where} says {unknown}, which icebatch does not check answers against (it knows: {sorted(allowed)})"
        )


def _check_property(name: str, prop: Any) -> None:
    from jsonschema import Draft202012Validator, FormatChecker

    where = f"output property {name!r}"
    if not name.isidentifier():
        raise ValueError(f"{where} must be a valid column name")
    if not isinstance(prop, dict) or prop.get("type") not in _SUPPORTED:
        kind = prop.get("type") if isinstance(prop, dict) else prop
        raise ValueError(
            f"{where} has type {kind!r}; supported: {sorted(_SUPPORTED)} (flat objects only: each property becomes a "
            "results column)"
        )
    _only(prop, PROPERTY_KEYWORDS, where)
    if "format" in prop and prop["format"] not in FORMATS:
        raise ValueError(f"{where}: format {prop['format']!r} is not one icebatch checks (it knows: {list(FORMATS)})")
    if "pattern" in prop:
        try:
            re.compile(prop["pattern"])
        except re.error as e:
            raise ValueError(f"{where}: pattern {prop['pattern']!r} is not a regular expression ({e})") from None
        if (construct := unenforceable(prop["pattern"])) is not None:
            raise ValueError(
                f"{where}: pattern {prop['pattern']!r} uses {construct}, which the engine's structured output cannot "
                "enforce (its regular expressions have no look-around, backreferences, word boundaries, atomic "
                "groups or conditionals): every row would fail. Write the pattern without it"
            )
    bare = {k: v for k, v in prop.items() if k not in ("enum", "const")}
    validator = Draft202012Validator(bare, format_checker=FormatChecker(FORMATS))
    values = [*prop.get("enum", []), *([prop["const"]] if "const" in prop else [])]
    wrong = [v for v in values if not validator.is_valid(v)]
    if wrong:
        raise ValueError(f"{where}: the value {wrong[0]!r} it allows does not satisfy its own type and bounds")
    if "enum" in prop and "const" in prop and prop["const"] not in prop["enum"]:
        raise ValueError(f"{where}: const {prop['const']!r} is not in its enum: no answer can satisfy both")
    _check_bounds(where, prop)


# group openings and escapes a regular expression may use that structured output's (the guidance backend's, a Rust
# regex without look-around) refuses; the engine would refuse the task at its first row, after the start-up was paid
_GROUPS = {
    "(?=": "a look-ahead `(?=`",
    "(?!": "a negative look-ahead `(?!`",
    "(?<=": "a look-behind `(?<=`",
    "(?<!": "a negative look-behind `(?<!`",
    "(?P=": "a named backreference `(?P=`",
    "(?>": "an atomic group `(?>`",
    "(?(": "a conditional `(?(`",
    "(?#": "a comment `(?#`",
}
_ESCAPES = {
    "b": "`\\b` (a word boundary; in a class, a backspace)",
    "B": "a non-boundary `\\B`",
    "Z": "`\\Z`",
    "G": "`\\G`",
}
_DIGITS = set("123456789")  # \1 to \9: a backreference (\0 is a character)


def unenforceable(pattern: str) -> str | None:
    """The first construct of ``pattern`` (outside character classes) that structured output cannot enforce."""
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            escaped = pattern[i + 1 : i + 2]
            if escaped in _ESCAPES or (not in_class and escaped in _DIGITS):
                return _ESCAPES.get(escaped, f"a backreference `\\{escaped}`")
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 2 if pattern[i + 1 : i + 2] == "]" else 3 if pattern[i + 1 : i + 3] == "^]" else 1  # a literal `]`
            continue
        elif c == "(":
            found = next((name for opening, name in _GROUPS.items() if pattern.startswith(opening, i)), None)
            if found is not None:
                return found
        i += 1
    return None


def _check_bounds(where: str, prop: dict[str, Any]) -> None:
    """Bounds no value fits: a minimum above the maximum (or exclusive ones meeting), minLength above maxLength."""
    low = [(prop[k], k == "exclusiveMinimum") for k in ("minimum", "exclusiveMinimum") if k in prop]
    high = [(prop[k], k == "exclusiveMaximum") for k in ("maximum", "exclusiveMaximum") if k in prop]
    for lo, lo_open in low:
        for hi, hi_open in high:
            if lo > hi or (lo == hi and (lo_open or hi_open)):
                raise ValueError(f"{where}: its bounds ({lo} to {hi}) leave no value an answer could have")
    if prop.get("minLength", 0) > prop.get("maxLength", float("inf")):
        raise ValueError(f"{where}: minLength {prop['minLength']} is above maxLength {prop['maxLength']}")


def _text(value: Any) -> str:
    if value is None or value == "":
        return "(empty)"
    return str(value)


def load_task(path: Path | None = None) -> TaskSpec:
    """Load and validate a task spec; TaskSpecError says what is wrong with the file."""
    source = path or DEFAULT_TASK
    text = read_text(source, what="task file", hint="a consumer's `task:` in the consumers file", error=TaskSpecError)
    what = f"task file {source}"
    yaml_file = source.suffix.lower() in (".yaml", ".yml")  # multi-line prompts as block scalars (`|`)
    raw = (
        load_yaml(text, what=what, error=TaskSpecError)
        if yaml_file
        else load_json(text, what=what, error=TaskSpecError)
    )
    try:
        return TaskSpec.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(field_problem(x, TaskSpec) for x in e.errors())
        raise TaskSpecError(f"task file {source} is invalid: {problems}") from e
