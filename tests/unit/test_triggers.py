from __future__ import annotations

import json
from pathlib import Path

import pytest
from icebatch.control.triggers import parse_trigger, relevance
from icebatch.core.errors import InvalidEventError

pytestmark = pytest.mark.unit
EVENTS = Path(__file__).resolve().parents[2] / "sam" / "events"


def load(name: str) -> dict:
    return json.loads((EVENTS / name).read_text())


@pytest.mark.parametrize(
    ("name", "kind", "origin"),
    [
        ("schedule.json", "schedule", "scheduler"),
        ("scheduled-rule.json", "schedule", "rule"),
        ("glue-table-change.json", "append", "glue"),
        ("glue-other-table.json", "append", "glue"),
        ("s3-metadata-object.json", "append", "s3"),
        ("s3-unrelated-object.json", "append", "s3"),
        ("manual.json", "manual", "manual"),
        ("manual-dry-run.json", "manual", "manual"),
        ("manual-force.json", "manual", "manual"),
    ],
)
def test_every_sam_event_file_parses(name: str, kind: str, origin: str) -> None:
    t = parse_trigger(load(name))
    assert (t.kind, t.origin) == (kind, origin)


def test_manual_flags_and_relevance() -> None:
    assert parse_trigger(load("manual-dry-run.json")).dry_run is True
    assert parse_trigger(load("manual-force.json")).force is True
    glue = parse_trigger(load("glue-table-change.json"))
    assert relevance(glue, "support.tickets", None) is None
    assert "support.invoices" in relevance(parse_trigger(load("glue-other-table.json")), "support.tickets", None)
    location = "s3://icebatch-warehouse/warehouse/support.db/tickets"
    assert relevance(parse_trigger(load("s3-metadata-object.json")), "support.tickets", location) is None
    why = relevance(parse_trigger(load("s3-unrelated-object.json")), "support.tickets", location)
    assert why is not None and "not under" in why
    other = relevance(parse_trigger(load("s3-metadata-object.json")), "support.tickets", "s3://b/other")
    assert other is not None


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("glue-missing-table-name.json", "detail.tableName: Field required"),
        ("unknown-shape.json", "unrecognised event (keys: Records)"),
        ("manual-typo.json", "forse"),
        ("unsupported-detail-type.json", "'aws.ec2' / 'EC2 Instance State-change Notification'"),
        ("not-an-object.json", "expected a JSON object"),
    ],
)
def test_malformed_events_are_clear_errors(name: str, message: str) -> None:
    with pytest.raises(InvalidEventError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_trigger(json.loads((EVENTS / "malformed" / name).read_text()))
