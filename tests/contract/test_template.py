"""template.yaml against the contracts in code: same event patterns, least privilege, dead letters."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from icebatch.core.rules import PATTERNS, SCHEDULES
from icebatch.core.settings import env_names

from tests.support.cfn import load_template, refs_as_placeholders

pytestmark = pytest.mark.contract
ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = load_template(ROOT / "template.yaml")
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
FUNCTIONS = {k: v for k, v in RESOURCES.items() if v["Type"] == "AWS::Serverless::Function"}
EVENT_FUNCTIONS = {k: v for k, v in FUNCTIONS.items() if v["Properties"].get("Events")}


def _event(function: str, name: str) -> dict[str, Any]:
    return FUNCTIONS[function]["Properties"]["Events"][name]["Properties"]


@pytest.mark.parametrize(
    ("function", "event", "pattern"),
    [
        ("ReporterFunction", "JobFinished", "reporter"),
        ("LauncherFunction", "GlueTableChange", "launcher-glue-table-change"),
        ("LauncherFunction", "MetadataObjectCreated", "launcher-s3-metadata-object"),
        ("LauncherFunction", "DeferredRun", "launcher-deferred-run"),
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


def _catalog(statements: list[Any], s3tables: bool | None) -> list[dict[str, Any]]:
    """The statements a stack of that ``Catalog`` has (``!If [UseS3Tables, ...]`` chosen), or both kinds' (None)."""
    found = []
    for s in statements:
        if "Fn::If" not in s:
            found.append(s)
            continue
        condition, when, otherwise = s["Fn::If"]
        assert condition == "UseS3Tables", s
        branches = [when, otherwise] if s3tables is None else [when if s3tables else otherwise]
        found += [b for b in branches if b != {"Ref": "AWS::NoValue"}]
    return found


def _statements(s3tables: bool | None = None) -> list[dict[str, Any]]:
    found = []
    for fn in FUNCTIONS.values():
        for policy in fn["Properties"].get("Policies", []):
            if isinstance(policy, dict) and "Statement" in policy:
                found += _catalog(policy["Statement"], s3tables)
    for res in RESOURCES.values():
        doc = res.get("Properties", {}).get("PolicyDocument")
        if doc:
            found += _catalog(doc["Statement"], s3tables)
    return found


def test_no_wildcard_actions_and_scoped_resources() -> None:
    for statement in _statements():
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        for action in actions:
            assert action != "*" and not action.endswith(":*"), statement
        resources = statement.get("Resource", [])
        for resource in resources if isinstance(resources, list) else [resources]:
            assert resource != "*", statement
    launcher = {
        s["Sid"]: s
        for s in _catalog(FUNCTIONS["LauncherFunction"]["Properties"]["Policies"][0]["Statement"], s3tables=False)
    }
    assert launcher["DescribeTheCluster"]["Action"] == ["eks:DescribeCluster"]
    assert "${ClusterName}" in launcher["DescribeTheCluster"]["Resource"]["Fn::Sub"]
    # the launcher reads table metadata, never data files
    assert [r["Fn::Sub"] for r in launcher["ReadIcebergMetadataOnly"]["Resource"]] == [
        "arn:${AWS::Partition}:s3:::${WarehouseBucket}/${SourceTablePrefix}metadata/*",
        "arn:${AWS::Partition}:s3:::${WarehouseBucket}/${ResultsTablesPrefix}*_results/metadata/*",
    ]
    assert all("table/${SourceDatabase}/" in r["Fn::Sub"] for r in launcher["ReadIcebergTables"]["Resource"][2:])
    assert launcher["AnnounceJobsAndReportSilentFailures"]["Condition"] == {
        "StringEquals": {"events:source": ["icebatch"]}
    }
    reporter = FUNCTIONS["ReporterFunction"]["Properties"]["Policies"]
    assert {"SNSPublishMessagePolicy": {"TopicName": {"Fn::GetAtt": ["ReportsTopic", "TopicName"]}}} in reporter


def test_every_function_has_an_on_failure_destination_and_every_rule_a_dead_letter_queue() -> None:
    for name, fn in EVENT_FUNCTIONS.items():
        on_failure = fn["Properties"]["EventInvokeConfig"]["DestinationConfig"]["OnFailure"]
        assert on_failure["Type"] == "SQS", name
        assert fn["Properties"]["EventInvokeConfig"]["MaximumRetryAttempts"] <= 2, name
        for event_name, event in fn["Properties"]["Events"].items():
            assert "DeadLetterConfig" in event["Properties"], f"{name}.{event_name}"


def test_function_environment_names_are_real_settings() -> None:
    known = set(env_names().values())
    for name, fn in FUNCTIONS.items():
        env = {
            **TEMPLATE["Globals"]["Function"]["Environment"]["Variables"],
            **fn["Properties"]["Environment"]["Variables"],
        }
        unknown = {k for k in env if k.startswith("ICEBATCH_") and k not in known}
        assert not unknown, f"{name}: {unknown}"


def test_sam_env_json_and_event_files_cover_every_trigger() -> None:
    env = json.loads((ROOT / "sam" / "env.json").read_text())
    assert set(env) == set(EVENT_FUNCTIONS)
    assert env["LauncherFunction"]["ICEBATCH_DRY_RUN"] == "true"  # poking with sam local invoke launches nothing
    events = {p.name for p in (ROOT / "sam" / "events").glob("*.json")}
    for required in (
        "schedule.json",
        "glue-table-change.json",
        "s3-metadata-object.json",
        "manual.json",
        "manual-dry-run.json",
        "completed.json",
        "failed.json",
    ):
        assert required in events


def test_dead_letter_queues_accept_only_the_stacks_own_rules() -> None:
    # given each queue policy, then EventBridge may send to it only on behalf of the rules that use it
    for queue, function in (
        ("LauncherDeadLetterQueue", "LauncherFunction"),
        ("ReporterDeadLetterQueue", "ReporterFunction"),
    ):
        [policy] = [
            r
            for r in RESOURCES.values()
            if r["Type"] == "AWS::SQS::QueuePolicy" and r["Properties"]["Queues"] == [{"Ref": queue}]
        ]
        rules = sorted(
            f"{function}{name}"
            for name, e in FUNCTIONS[function]["Properties"]["Events"].items()
            if e["Type"] == "EventBridgeRule"
        )
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            assert statement["Principal"] == {"Service": "events.amazonaws.com"}, statement
            arns = statement["Condition"]["ArnEquals"]["aws:SourceArn"]
            arns = arns if isinstance(arns, list) else [arns]
            assert sorted(a["Fn::GetAtt"][0] for a in arns) == rules


def test_the_nightly_schedule_is_named_per_stack() -> None:
    # SAM names a ScheduleV2 after its logical id unless told otherwise: two stacks in one account collide
    nightly = _event("LauncherFunction", "Nightly")
    assert nightly.get("OmitName") is True or "${AWS::StackName}" in str(nightly.get("Name", ""))


def test_glue_changes_are_only_real_table_commits() -> None:
    pattern = _event("LauncherFunction", "GlueTableChange")["Pattern"]
    # BatchUpdateTable is not a Glue API; CreateTable arrives as a *Database* State Change
    assert pattern["detail"]["typeOfChange"] == ["UpdateTable"]


def test_s3_events_match_only_metadata_files() -> None:
    pattern = refs_as_placeholders(_event("LauncherFunction", "MetadataObjectCreated")["Pattern"])
    assert pattern["detail"]["object"]["key"] == [{"wildcard": "${SourceTablePrefix}metadata/*.metadata.json"}]


def test_every_permanent_error_metric_has_an_alarm() -> None:
    from icebatch.control.handlers import PERMANENT_ERROR_METRICS

    alarms = {
        (r["Properties"]["MetricName"], tuple((d["Name"], d["Value"]) for d in r["Properties"]["Dimensions"]))
        for r in RESOURCES.values()
        if r["Type"] == "AWS::CloudWatch::Alarm"
        and r["Properties"].get("Namespace") == {"Fn::Sub": "icebatch/${AWS::StackName}"}
    }
    for service, names in PERMANENT_ERROR_METRICS.items():
        for name in names:
            assert (name, (("service", service),)) in alarms, (service, name)
    assert TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]["POWERTOOLS_METRICS_NAMESPACE"] == {
        "Fn::Sub": "icebatch/${AWS::StackName}"
    }


def test_a_private_cluster_endpoint_can_be_reached_from_a_vpc() -> None:
    vpc = FUNCTIONS["LauncherFunction"]["Properties"]["VpcConfig"]["Fn::If"]
    assert vpc[0] == "LauncherInVpc" and vpc[1]["SubnetIds"] == {"Ref": "LauncherSubnetIds"}
    assert vpc[2] == {"Ref": "AWS::NoValue"}


def test_the_job_has_its_own_least_privilege_identity() -> None:
    role = RESOURCES["JobRole"]["Properties"]
    [trust] = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    statements = {s["Sid"]: s for s in _catalog(role["Policies"][0]["PolicyDocument"]["Statement"], s3tables=False)}
    assert statements["ReportCompletionAndFailure"]["Condition"] == {"StringEquals": {"events:source": ["icebatch"]}}
    writes = statements["WriteTheResultsTable"]["Resource"]["Fn::Sub"]
    assert writes.endswith("${WarehouseBucket}/${ResultsTablesPrefix}*_results/*")
    association = RESOURCES["JobPodIdentity"]["Properties"]
    assert association["RoleArn"] == {"Fn::GetAtt": ["JobRole", "Arn"]}
    assert association["ServiceAccount"] == {"Ref": "JobServiceAccount"}


def test_each_stack_names_its_own_service_account() -> None:
    import tomllib

    # given EKS's rule: one Pod Identity association per cluster, namespace and service account
    parameter = TEMPLATE["Parameters"]["JobServiceAccount"]
    # then the template has no shared default (a second stack on the cluster would fail to create its own),
    # only names Kubernetes accepts, and the shipped configurations give each stack its own
    assert "Default" not in parameter and parameter["MaxLength"] == 63
    config = tomllib.loads((ROOT / "sam" / "samconfig.toml").read_text())
    accounts = {
        env: dict(o.split("=", 1) for o in config[env]["deploy"]["parameters"]["parameter_overrides"])[
            "JobServiceAccount"
        ]
        for env in ("default", "prod")
    }
    assert len(set(accounts.values())) == 2, accounts
    assert all(re.fullmatch(parameter["AllowedPattern"], a) for a in accounts.values())


def test_the_deploy_steps_name_only_parameters_the_shipped_configuration_sets() -> None:
    import tomllib

    # given the documentation's deploy step and the shipped prod configuration
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    step = deploy[deploy.index("4. **The application.**") :].split("\n5. ", 1)[0]
    named = set(re.findall(r"`([A-Z][A-Za-z]+)`", step)) & set(TEMPLATE["Parameters"])
    config = tomllib.loads((ROOT / "sam" / "samconfig.toml").read_text())
    prod = dict(o.split("=", 1) for o in config["prod"]["deploy"]["parameters"]["parameter_overrides"])
    # then each parameter the step asks for is one the configuration sets (there to be filled or checked)
    assert len(named) >= 10 and named <= set(prod), sorted(named - set(prod))
    # and the documentation names only the event schemas that exist
    schemas = {p.stem.split(".")[0] for p in (ROOT / "eventbridge" / "schemas").glob("*.json")}
    events = (ROOT / "docs" / "concepts" / "events-and-costs.md").read_text()
    listed = re.search(r'\("Batch Job Submitted".*?\)', events, flags=re.S)
    assert listed is not None
    assert {n.lower().replace(" ", "-") for n in re.findall(r'"([^"]+)"', listed.group(0))} == schemas


# What S3 Tables' Iceberg REST endpoint asks of the caller for each call a role makes (the AWS S3 user guide,
# "Accessing tables using the Amazon S3 Tables Iceberg REST endpoint": its table of REST operations and IAM actions)
_REST_ACTIONS = {
    "getConfig": {"s3tables:GetTableBucket"},
    "loadNamespaceMetadata": {"s3tables:GetNamespace"},
    "tableExists": {"s3tables:GetTable"},
    "loadTable": {"s3tables:GetTableMetadataLocation", "s3tables:GetTableData"},
    "createTable": {"s3tables:CreateTable", "s3tables:PutTableData"},
    "updateTable": {"s3tables:UpdateTableMetadataLocation", "s3tables:PutTableData", "s3tables:GetTableData"},
}
_BUCKET = "arn:${AWS::Partition}:s3tables:${AWS::Region}:${AWS::AccountId}:bucket/${TableBucketName}"
_CALLS = {  # role -> (REST operation, the table it is on: source, results or None for the bucket)
    "launcher": [
        ("getConfig", None),
        ("loadNamespaceMetadata", None),
        ("tableExists", "results"),
        ("loadTable", "source"),
        ("loadTable", "results"),
    ],
    "job": [
        ("getConfig", None),
        ("loadNamespaceMetadata", None),
        ("loadTable", "source"),
        ("tableExists", "results"),
        ("createTable", "results"),
        ("loadTable", "results"),
        ("updateTable", "results"),
    ],
    "reporter": [("getConfig", None), ("tableExists", "results"), ("loadTable", "results")],
}


def _role_statements(role: str, s3tables: bool) -> list[dict[str, Any]]:
    if role == "job":
        return _catalog(RESOURCES["JobRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"], s3tables)
    fn = FUNCTIONS["LauncherFunction" if role == "launcher" else "ReporterFunction"]
    docs = [p for p in fn["Properties"]["Policies"] if isinstance(p, dict) and "Statement" in p]
    return [s for doc in docs for s in _catalog(doc["Statement"], s3tables)]


def _resources(statement: dict[str, Any]) -> list[Any]:
    resources = statement["Resource"]
    return [r for r in (resources if isinstance(resources, list) else [resources]) if isinstance(r, dict)]


def _grants(statement: dict[str, Any], action: str, table: str | None) -> bool:
    """Whether the statement allows ``action`` on the table bucket (None) or on the stack's source/results table."""
    if action not in statement["Action"]:
        return False
    arns = {r["Fn::Sub"] for r in _resources(statement) if "Fn::Sub" in r}
    if table is None or action == "s3tables:CreateTable":  # bucket-level actions
        return _BUCKET in arns
    names = refs_as_placeholders(statement["Condition"]["StringLike"]["s3tables:tableName"])
    wanted = "${SourceTableName}" if table == "source" else "${SourceTableName}_*_results"
    namespace = statement["Condition"]["StringEquals"]["s3tables:namespace"]
    return f"{_BUCKET}/table/*" in arns and wanted in names and namespace == {"Ref": "SourceDatabase"}


@pytest.mark.parametrize("role", sorted(_CALLS))
def test_an_s3_tables_stack_grants_each_role_the_calls_it_makes_and_no_glue(role: str) -> None:
    # given a stack deployed with Catalog s3tables
    statements = _role_statements(role, s3tables=True)
    # then each REST call the role makes through S3 Tables' endpoint is allowed on what it is made on
    for operation, table in _CALLS[role]:
        for action in _REST_ACTIONS[operation]:
            assert any(_grants(s, action, table) for s in statements), (role, operation, action, table)
    # and no statement is about Glue, and none grants S3 Tables beyond the stack's namespace and tables
    actions = {a for s in statements for a in s["Action"]}
    assert not any(a.startswith("glue:") for a in actions), actions
    for s in statements:
        tables = [r for r in _resources(s) if "/table/" in r.get("Fn::Sub", "")]
        assert not tables or s["Condition"]["StringEquals"] == {"s3tables:namespace": {"Ref": "SourceDatabase"}}, s
    # and a Glue stack has no S3 Tables grant
    assert not any(a.startswith("s3tables:") for s in _role_statements(role, s3tables=False) for a in s["Action"])


def test_an_s3_tables_stack_configures_the_catalog_as_pyiceberg_does() -> None:
    from tests.support.cfn import Stack

    # given a stack with Catalog s3tables and a table bucket, when its functions' environment is resolved
    params = {
        "Catalog": "s3tables",
        "TableBucketName": "lake",
        "ClusterName": "c",
        "WarehouseBucket": "w",
        "ModelBucket": "m",
        "JobServiceAccount": "icebatch-job",
        "JobImage": "i",
    }
    env = Stack(TEMPLATE, "lake-stack", params, region="eu-west-1").resolve(
        TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    )
    # then icebatch opens the pyiceberg catalog "s3tables", which pyiceberg reads as S3 Tables' REST endpoint
    assert (env["ICEBATCH_CATALOG_TYPE"], env["ICEBATCH_CATALOG_NAME"]) == ("pyiceberg", "s3tables")
    config = _pyiceberg_config({k: v for k, v in env.items() if k.startswith("PYICEBERG_")})
    assert config == {
        "type": "rest",
        "uri": "https://s3tables.eu-west-1.amazonaws.com/iceberg",
        "warehouse": "arn:aws:s3tables:eu-west-1:123456789012:bucket/lake",
        "rest.sigv4-enabled": "true",
        "rest.signing-name": "s3tables",
        "rest.signing-region": "eu-west-1",
    }
    # and the rule refuses an s3tables stack without its table bucket
    [assertion] = TEMPLATE["Rules"]["S3TablesNeedsItsTableBucket"]["Assertions"]
    assert assertion["Assert"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "TableBucketName"}, ""]}]}
    # and a Glue stack sets none of it
    glue = Stack(TEMPLATE, "g", {**params, "Catalog": "glue"}).resolve(
        TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    )
    assert glue["ICEBATCH_CATALOG_TYPE"] == "glue" and not [
        k for k in glue if k.startswith(("PYICEBERG_", "ICEBATCH_CATALOG_NAME"))
    ]


def _pyiceberg_config(variables: dict[str, str]) -> Any:
    """The catalog ``s3tables`` as pyiceberg's own configuration reads it from these environment variables."""
    import os
    from unittest import mock

    from pyiceberg.utils.config import Config

    with mock.patch.dict(os.environ, variables, clear=False):
        return Config().get_catalog_config("s3tables")
