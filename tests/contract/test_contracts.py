"""The event contracts: pydantic models, the JSON Schemas in eventbridge/, the rule patterns and the
example events (old events included) must agree; a breaking schema change fails here."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from icebatch.core.events import DETAIL_MODELS, SCHEMA_VERSION
from icebatch.core.rules import PATTERNS, fill, matches
from icebatch.tools import contracts

pytestmark = pytest.mark.contract
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "eventbridge" / "examples"
SAM_EVENTS = ROOT / "sam" / "events"


def _schema(detail_type: str) -> dict:
    return json.loads(
        (ROOT / "eventbridge" / "schemas" / f"{contracts.slug(detail_type)}.v{SCHEMA_VERSION}.json").read_text()
    )


def _examples(kind: str) -> list[Path]:
    return sorted((EXAMPLES / kind).glob("*.json"))


def test_checked_in_contract_files_are_generated_from_the_code() -> None:
    assert contracts.check() == [], "run `icebatch contracts write` and commit the result"


@pytest.mark.parametrize(
    "path", [*_examples("valid"), SAM_EVENTS / "completed.json", SAM_EVENTS / "failed.json"], ids=lambda p: p.name
)
def test_valid_examples_satisfy_schema_and_model(path: Path) -> None:
    event = json.loads(path.read_text())
    detail_type = event["detail-type"]
    jsonschema.Draft202012Validator(_schema(detail_type)).validate(event["detail"])
    DETAIL_MODELS[detail_type].model_validate(event["detail"])
    stack = {"AWS::StackName": event["detail"].get("deployment", "")}
    routed = matches(fill(PATTERNS["reporter"], stack), event)
    assert routed == (detail_type in {"Batch Job Completed", "Batch Job Failed"})
    assert matches(fill(PATTERNS["launcher-deferred-run"], stack), event) == (detail_type == "Batch Job Deferred")


@pytest.mark.parametrize("path", _examples("invalid"), ids=lambda p: p.name)
def test_invalid_examples_fail_schema_and_model(path: Path) -> None:
    event = json.loads(path.read_text())
    detail_type = event["detail-type"]
    assert list(jsonschema.Draft202012Validator(_schema(detail_type)).iter_errors(event["detail"])), (
        "schema accepted it"
    )
    with pytest.raises(ValueError):
        DETAIL_MODELS[detail_type].model_validate(event["detail"])


def test_every_detail_type_has_a_schema_and_a_valid_example() -> None:
    seen = {json.loads(p.read_text())["detail-type"] for p in _examples("valid")}
    assert seen == set(DETAIL_MODELS)


def test_schemas_are_valid_json_schema() -> None:
    for detail_type in DETAIL_MODELS:
        jsonschema.Draft202012Validator.check_schema(_schema(detail_type))


def test_launcher_patterns_route_the_sam_events() -> None:
    values = {
        "SourceDatabase": "support",
        "SourceTableName": "tickets",
        "WarehouseBucket": "icebatch-warehouse",
        "SourceTablePrefix": "warehouse/support.db/tickets/",
    }
    glue = fill(PATTERNS["launcher-glue-table-change"], values)
    s3 = fill(PATTERNS["launcher-s3-metadata-object"], values)
    load = lambda name: json.loads((SAM_EVENTS / name).read_text())  # noqa: E731
    assert matches(glue, load("glue-table-change.json"))
    assert not matches(glue, load("glue-other-table.json"))
    assert matches(s3, load("s3-metadata-object.json"))
    assert not matches(s3, load("s3-unrelated-object.json"))
    assert not matches(s3, load("s3-manifest-object.json"))  # a commit writes manifests first: not a commit yet
    assert not matches(PATTERNS["reporter"], load("glue-table-change.json"))


@pytest.mark.parametrize(
    ("pattern", "event", "expected"),
    [
        ({"a": ["x"]}, {"a": "x"}, True),
        ({"a": ["x"]}, {"a": "y"}, False),
        ({"a": [{"prefix": "ab"}]}, {"a": "abc"}, True),
        ({"a": [{"suffix": ".json"}]}, {"a": "m.metadata.json"}, True),
        ({"a": [{"anything-but": ["x"]}]}, {"a": "y"}, True),
        ({"a": [{"anything-but": ["x"]}]}, {"a": "x"}, False),
        ({"a": [{"exists": False}]}, {}, True),
        ({"a": [{"exists": True}]}, {}, False),
        ({"a": {"b": ["x"]}}, {"a": {"b": "x"}}, True),
        ({"a": {"b": ["x"]}}, {"a": "flat"}, False),
        ({"a": ["x"]}, {"a": ["y", "x"]}, True),
        ({"a": [{"wildcard": "*.metadata.json"}]}, {"a": "v3.metadata.json"}, True),
    ],
)
def test_local_pattern_matching_follows_eventbridge_semantics(pattern: dict, event: dict, expected: bool) -> None:
    assert matches(pattern, event) is expected
