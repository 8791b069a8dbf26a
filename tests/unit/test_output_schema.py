"""Verdicts mean what the output schema says: every keyword enforced on each answer, or refused when the task loads.

The property test checks the answers the task accepts against an oracle written here from JSON Schema's own words
(not the jsonschema library the task uses), for schemas and answers Hypothesis draws.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import math
import re
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from icebatch.core.task import FORMATS, TaskSpec, load_task

pytestmark = pytest.mark.unit
BASE = load_task().model_dump()


def task(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> TaskSpec:
    schema = {"type": "object", "properties": properties, **extra}
    if required is not None:
        schema["required"] = required
    return TaskSpec.model_validate({**BASE, "output_schema": schema})


@pytest.mark.parametrize(
    ("properties", "required", "extra", "refusal"),
    [
        ({"topic": {"type": "string"}}, ["topic", "score"], {}, "requires ['score'], which are not among its"),
        ({"lang": {"type": "string", "const": "en", "enum": ["fr", "de"]}}, None, {}, "const 'en' is not in its enum"),
        ({"score": {"type": "integer", "exclusiveMinimum": 5, "maximum": 5}}, None, {}, "leave no value"),
        ({"score": {"type": "number", "minimum": 3, "maximum": 1}}, None, {}, "leave no value"),
        ({"s": {"type": "string", "minLength": 5, "maxLength": 2}}, None, {}, "minLength 5 is above maxLength 2"),
        ({"s": {"type": "string", "enum": ["a", 3]}}, None, {}, "the value 3 it allows does not satisfy"),
        ({"s": {"type": "string", "format": "hostname"}}, None, {}, "format 'hostname' is not one icebatch checks"),
        ({"s": {"type": "string", "oneOf": [{"const": "a"}]}}, None, {}, "says ['oneOf'], which icebatch does not"),
        ({"s": {"type": "string", "pattern": "("}}, None, {}, "'(' is not a 'regex'"),
        ({"s": {"type": "array"}}, None, {}, "supported: ['boolean', 'integer', 'number', 'string']"),
        ({"s": {"type": "string"}}, None, {"additionalProperties": True}, "additionalProperties must be false"),
        ({"s": {"type": "string"}}, None, {"minProperties": 1}, "says ['minProperties']"),
        ({"s": {"type": "string", "minLength": -1}}, None, {}, "is not a JSON Schema"),
    ],
)
def test_a_schema_no_answer_could_satisfy_or_that_says_what_is_not_checked_is_refused_when_the_task_loads(
    properties: dict, required: list | None, extra: dict, refusal: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(refusal)):
        task(properties, required, **extra)


@pytest.mark.parametrize(
    ("prop", "good", "bad"),
    [
        ({"type": "integer", "exclusiveMinimum": 0}, 1, -3),
        ({"type": "string", "const": "en"}, "en", "fr"),
        ({"type": "number", "multipleOf": 0.5}, 2.5, 2.3),
        ({"type": "string", "format": "email"}, "a@b.example", "not an address"),
        ({"type": "string", "format": "date"}, "2026-12-06", "06/12/2026"),
        ({"type": "string", "pattern": "^[A-Z]{2}$"}, "EN", "en"),
        ({"type": "integer", "maximum": 10}, 10, 11),
    ],
)
def test_each_keyword_is_enforced_on_every_answer(prop: dict, good: Any, bad: Any) -> None:
    t = task({"x": prop}, ["x"])
    assert t.parse(json.dumps({"x": good})) == ({"x": good}, None)
    verdict, reason = t.parse(json.dumps({"x": bad}))
    assert verdict is None and reason is not None and reason.startswith("schema: x: ")


def test_an_integer_written_with_a_zero_fraction_is_an_integer_and_booleans_are_not_numbers() -> None:
    t = task({"n": {"type": "integer"}, "b": {"type": "boolean"}}, ["n"])
    assert t.parse('{"n": 3.0, "b": true}') == ({"n": 3, "b": True}, None)
    assert t.parse('{"n": true}')[0] is None and t.parse('{"n": 3.5}')[0] is None


def test_structured_output_gets_the_schema_answers_are_checked_against() -> None:
    t = task({"x": {"type": "integer", "exclusiveMinimum": 0}}, ["x"])
    assert json.loads(t.output_schema_json) == t.answer_schema
    assert t.answer_schema["additionalProperties"] is False and t.answer_schema["properties"] == t.output_fields


# --- the property: whatever the task accepts satisfies the schema ------------------------------------------------
def _satisfies(value: Any, prop: dict[str, Any]) -> bool:
    """JSON Schema's meaning of the keywords a property may have, written out (the test's oracle)."""
    kind = prop["type"]
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "string" and not isinstance(value, str):
        return False
    if kind == "boolean" and not isinstance(value, bool):
        return False
    if kind == "number" and not is_number:
        return False
    if kind == "integer" and not (is_number and float(value).is_integer()):
        return False
    if "enum" in prop and not any(_same(value, v) for v in prop["enum"]):
        return False
    if "const" in prop and not _same(value, prop["const"]):
        return False
    if isinstance(value, str):
        if len(value) < prop.get("minLength", 0) or len(value) > prop.get("maxLength", math.inf):
            return False
        if "pattern" in prop and re.search(prop["pattern"], value) is None:
            return False
        if "format" in prop and not _formatted(value, prop["format"]):
            return False
    if is_number:
        checks = [
            ("minimum", lambda b: value >= b),
            ("maximum", lambda b: value <= b),
            ("exclusiveMinimum", lambda b: value > b),
            ("exclusiveMaximum", lambda b: value < b),
            ("multipleOf", lambda m: value % m == 0),
        ]
        if not all(check(prop[k]) for k, check in checks if k in prop):
            return False
    return True


def _same(a: Any, b: Any) -> bool:
    """JSON's equality: numbers by value (1 is 1.0), no boolean equal to a number, else the same type and value."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def _formatted(value: str, fmt: str) -> bool:
    """The formats icebatch checks, as it documents them: a full date (YYYY-MM-DD), a UUID in its dashed form, an IP
    address (IPv6 without a scope), an email address as anything with an @ (a lenient check, as jsonschema's)."""
    try:
        if fmt == "date":
            return re.fullmatch(r"\d{4}-\d{2}-\d{2}", value, re.ASCII) is not None and bool(
                datetime.date.fromisoformat(value)
            )
        if fmt == "uuid":
            return bool(uuid.UUID(value)) and all(value[i] == "-" for i in (8, 13, 18, 23))
        if fmt == "ipv4":
            return bool(ipaddress.IPv4Address(value))
        if fmt == "ipv6":
            return not ipaddress.IPv6Address(value).scope_id
        return "@" in value  # email
    except (ValueError, IndexError):
        return False


def _property(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["string", "integer", "number", "boolean"]))
    prop: dict[str, Any] = {"type": kind}
    if kind == "string":
        if draw(st.booleans()):
            prop["maxLength"] = draw(st.integers(0, 6))
        if draw(st.booleans()):
            prop["minLength"] = draw(st.integers(0, prop.get("maxLength", 6)))
        choice = draw(st.sampled_from(["none", "enum", "const", "pattern", "format"]))
        if choice == "enum":
            prop["enum"] = draw(st.lists(st.text("ab", max_size=3), min_size=1, max_size=3, unique=True))
        elif choice == "const":
            prop["const"] = draw(st.text("ab", max_size=3))
        elif choice == "pattern":
            prop["pattern"] = draw(st.sampled_from(["^a", "b$", "^[ab]+$", "a.b"]))
        elif choice == "format":
            prop["format"] = draw(st.sampled_from(FORMATS))
        if "enum" in prop or "const" in prop:  # keep the schema satisfiable: lengths that admit the values
            prop.pop("minLength", None), prop.pop("maxLength", None)
    elif kind in ("integer", "number"):
        for key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf"):
            if draw(st.booleans()):
                prop[key] = draw(st.integers(1, 4)) if key == "multipleOf" else draw(st.integers(-5, 5))
        low = max([prop.get("minimum", -99), prop.get("exclusiveMinimum", -99) + 1])
        high = min([prop.get("maximum", 99), prop.get("exclusiveMaximum", 99) - 1])
        if low > high:
            for key in ("maximum", "exclusiveMaximum"):
                prop.pop(key, None)
        if draw(st.booleans()) and "multipleOf" not in prop:
            prop["enum"] = [v for v in range(-6, 7) if low <= v <= high][:3] or [low]
    return prop


@st.composite
def schemas_and_answers(draw: st.DrawFn) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4, unique=True))
    properties = {n: _property(draw) for n in names}
    required = draw(st.lists(st.sampled_from(names), unique=True))
    values = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-8, 8),
        st.floats(-8, 8, allow_nan=False),
        st.text("ab@.-1", max_size=7),
        st.sampled_from(["2026-12-06", "127.0.0.1", "::1", str(uuid.UUID(int=7)), "a@b"]),
    )
    keys = st.sampled_from([*names, "extra"])
    answer = draw(st.dictionaries(keys, values, max_size=5))
    for name in names:  # about half the time, a value the property allows (enum's or const's)
        if draw(st.booleans()) and ("enum" in properties[name] or "const" in properties[name]):
            answer[name] = properties[name].get("const", properties[name].get("enum", [None])[0])
    return properties, required, answer


@settings(max_examples=400, deadline=None)
@given(schemas_and_answers())
def test_whatever_the_task_accepts_satisfies_its_schema_and_what_it_refuses_does_not(drawn: tuple) -> None:
    properties, required, answer = drawn
    try:
        t = task(properties, required)
    except ValueError:
        return  # refused when it loads: no answer of it is ever stored
    verdict, reason = t.parse(json.dumps(answer))
    holds = (
        set(answer) <= set(properties)
        and set(required) <= {k for k in answer}
        and all(_satisfies(v, properties[k]) for k, v in answer.items() if k in properties)
    )
    assert (verdict is not None) == holds, (answer, properties, required, reason)
    if verdict is not None:
        assert {k: v for k, v in verdict.items() if v is not None or k in answer} == answer


REFUSED_BY_STRUCTURED_OUTPUT = [
    r"^(?=T)[A-Za-z ]+$",
    r"^(?!x)[a-z]+$",
    r"(?<=a)b",
    r"(?<!a)b",
    r"\bword\b",
    r"\Bfoo",
    r"(a)\1",
    r"(?P<n>a)(?P=n)",
    r"(?>ab)c",
    r"ab\Z",
    r"[\b]x",
]
ENFORCEABLE = [r"^[A-Z]{2}$", r"[(?=]x", r"[]b]+", r"[^]b]+", r"\(?=x", r"(?:ab)+", r"(?P<x>ab)", r"\d{3}"]


def _guidance_refuses(pattern: str) -> bool:
    """The engine's structured-output library (vLLM's guidance backend) on a schema with this pattern."""
    from llguidance import LLMatcher

    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}, "required": ["s"]}
    return bool(LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(json.dumps(schema)), None))


@pytest.mark.parametrize("pattern", REFUSED_BY_STRUCTURED_OUTPUT)
def test_a_pattern_structured_output_cannot_enforce_is_refused_when_the_task_loads(pattern: str) -> None:
    # given a pattern Python compiles but the engine's structured output refuses (so every row of a run would fail)
    assert re.compile(pattern) and _guidance_refuses(pattern)
    # then the task does not load, and says which construct to remove
    with pytest.raises(ValueError, match=r"uses .+, which the engine's structured output cannot enforce"):
        task({"s": {"type": "string", "pattern": pattern}})


@pytest.mark.parametrize("pattern", ENFORCEABLE)
def test_a_pattern_structured_output_enforces_loads(pattern: str) -> None:
    assert not _guidance_refuses(pattern)
    assert task({"s": {"type": "string", "pattern": pattern}}).output_schema["properties"]["s"]["pattern"] == pattern
