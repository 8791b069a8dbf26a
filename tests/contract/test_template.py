"""template.yaml against the contracts in code: same event patterns, least privilege, dead letters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from icebatch.rules import PATTERNS, SCHEDULES
from icebatch.settings import Settings

from tests.support.cfn import load_template, refs_as_placeholders

pytestmark = pytest.mark.contract
ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = load_template(ROOT / "template.yaml")
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
FUNCTIONS = {k: v for k, v in RESOURCES.items() if v["Type"] == "AWS::Serverless::Function"}


def _event(function: str, name: str) -> dict[str, Any]:
    return FUNCTIONS[function]["Properties"]["Events"][name]["Properties"]


@pytest.mark.parametrize(
    ("function", "event", "pattern"),
    [
        ("ReporterFunction", "JobFinished", "reporter"),
        ("LauncherFunction", "GlueTableChange", "launcher-glue-table-change"),
        ("LauncherFunction", "MetadataObjectCreated", "launcher-s3-metadata-object"),
    ],
)
def test_template_patterns_equal_the_eventbridge_folder(function: str, event: str, pattern: str) -> None:
    in_template = refs_as_placeholders(_event(function, event)["Pattern"])
    in_folder = json.loads((ROOT / "eventbridge" / "patterns" / f"{pattern}.json").read_text())
    assert in_template == in_folder == PATTERNS[pattern]


def test_nightly_schedule_equals_the_eventbridge_folder() -> None:
    nightly = _event("LauncherFunction", "Nightly")
    spec = SCHEDULES["nightly"]
    assert json.loads(nightly["Input"]) == spec["Input"]
    assert nightly["ScheduleExpression"] == {"Ref": "ScheduleExpression"}
    assert TEMPLATE["Parameters"]["ScheduleExpression"]["Default"] == spec["Default"]
    assert nightly["ScheduleExpressionTimezone"] == spec["ScheduleExpressionTimezone"]


def _statements() -> list[dict[str, Any]]:
    found = []
    for fn in FUNCTIONS.values():
        for policy in fn["Properties"].get("Policies", []):
            if isinstance(policy, dict) and "Statement" in policy:
                found += policy["Statement"]
    for res in RESOURCES.values():
        doc = res.get("Properties", {}).get("PolicyDocument")
        if doc:
            found += doc["Statement"]
    return found


def test_no_wildcard_actions_and_scoped_resources() -> None:
    for statement in _statements():
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        for action in actions:
            assert action != "*" and not action.endswith(":*"), statement
        resources = statement.get("Resource", [])
        for resource in resources if isinstance(resources, list) else [resources]:
            assert resource != "*", statement
    launcher = {s["Sid"]: s for s in FUNCTIONS["LauncherFunction"]["Properties"]["Policies"][0]["Statement"]}
    assert launcher["DescribeTheCluster"]["Action"] == ["eks:DescribeCluster"]
    assert "${ClusterName}" in launcher["DescribeTheCluster"]["Resource"]["Fn::Sub"]
    assert "${WarehousePrefix}" in launcher["ReadIcebergMetadata"]["Resource"]["Fn::Sub"]
    assert all("table/${SourceDatabase}/" in r["Fn::Sub"] for r in launcher["ReadIcebergTables"]["Resource"][2:])
    reporter = FUNCTIONS["ReporterFunction"]["Properties"]["Policies"]
    assert {"SNSPublishMessagePolicy": {"TopicName": {"Fn::GetAtt": ["ReportsTopic", "TopicName"]}}} in reporter


def test_every_function_has_an_on_failure_destination_and_every_rule_a_dead_letter_queue() -> None:
    for name, fn in FUNCTIONS.items():
        on_failure = fn["Properties"]["EventInvokeConfig"]["DestinationConfig"]["OnFailure"]
        assert on_failure["Type"] == "SQS", name
        assert fn["Properties"]["EventInvokeConfig"]["MaximumRetryAttempts"] <= 2, name
        for event_name, event in fn["Properties"]["Events"].items():
            assert "DeadLetterConfig" in event["Properties"], f"{name}.{event_name}"


def test_function_environment_names_are_real_settings() -> None:
    known = set(Settings.env_names().values())
    for name, fn in FUNCTIONS.items():
        env = {
            **TEMPLATE["Globals"]["Function"]["Environment"]["Variables"],
            **fn["Properties"]["Environment"]["Variables"],
        }
        unknown = {k for k in env if k.startswith("ICEBATCH_") and k not in known}
        assert not unknown, f"{name}: {unknown}"


def test_sam_env_json_and_event_files_cover_every_trigger() -> None:
    env = json.loads((ROOT / "sam" / "env.json").read_text())
    assert set(env) == set(FUNCTIONS)
    assert env["LauncherFunction"]["ICEBATCH_DRY_RUN"] == "true"  # poking with sam local invoke launches nothing
    events = {p.name for p in (ROOT / "sam" / "events").glob("*.json")}
    for required in ("schedule.json", "glue-table-change.json", "s3-metadata-object.json", "manual.json",
                     "manual-dry-run.json", "completed.json", "failed.json"):  # fmt: skip
        assert required in events
