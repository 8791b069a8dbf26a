"""Deploying template.yaml into moto the way CloudFormation would, and invoking its functions as Lambda would.

The template is SAM-transformed first (samtranslator, tests/support/sam_translate.py), so what is created
here is what a deploy creates: the queues and their policies, the topic, the idempotency table, the IAM
roles, the EventBridge rules with their patterns *as deployed*, the schedule, the alarms, and the
warehouse bucket's EventBridge switch (the custom resource's own handler, answering a local
"CloudFormation" over HTTP).

moto cannot run Lambda functions (no Docker here), so each function gets an SQS inbox: its rules
target the inbox instead of the function, and the tests drain the inbox into the function's handler,
run in a fresh process with exactly the environment the template gives the function (plus the
endpoint override that points AWS clients at moto, and Lambda's own variables).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.aws import REGION, assume, client, enforceable, enforcing
from tests.support.cfn import Stack
from tests.support.http_server import cloudformation_responses
from tests.support.sam_translate import translated

ACCOUNT = "123456789012"
LAMBDA_TIMEOUT = 300

# What Lambda's Python runtime does with the function's Handler setting, given an event.
_INVOKE = """
import importlib, json, os, sys
from icebatch.tools.invoke import LocalContext
module, _, name = sys.argv[1].rpartition(".")
handler = getattr(importlib.import_module(module), name)
event = json.load(open(sys.argv[2]))
response = handler(event, LocalContext(function_name=os.environ["AWS_LAMBDA_FUNCTION_NAME"]))
json.dump(response, open(sys.argv[3], "w"))
"""


@dataclass
class Invocation:
    response: dict[str, Any]
    stdout: str  # structured logs and CloudWatch EMF lines, as Lambda would ship them
    stderr: str
    raised: str | None = None  # the handler raised (``Deployed.invoke(check=False)``): the end of what it printed

    def metrics(self) -> list[dict[str, Any]]:
        """The EMF metric blobs printed by the invocation."""
        out = []
        for line in self.stdout.splitlines():
            try:
                blob = json.loads(line)
            except ValueError:
                continue
            if isinstance(blob, dict) and "_aws" in blob:
                out.append(blob)
        return out


@dataclass
class Deployed:
    stack: Stack
    endpoint: str
    home: Path
    inboxes: dict[str, str] = field(default_factory=dict)  # function logical id -> queue URL
    rules: dict[str, str] = field(default_factory=dict)  # rule logical id -> rule name
    schedules: dict[str, str] = field(default_factory=dict)  # schedule logical id -> schedule name
    credentials: dict[str, dict[str, str]] = field(default_factory=dict)  # role logical id -> a session of it

    def role_env(self, role: str) -> dict[str, str]:
        """The credentials the role's code runs with: a session of the role, assumed when it was deployed."""
        return self.credentials[role]

    def key(self, role: str) -> str:
        """The access key the role's calls are signed with (``iam_audit.Recorder.by``)."""
        return self.role_env(role)["AWS_ACCESS_KEY_ID"]

    @contextmanager
    def role_granting(self, role: str, statements: list[dict[str, Any]]) -> Iterator[None]:
        """The role with these statements alone (as moto can enforce them) for the block, its own policies after."""
        iam, name = client("iam", self.endpoint), self.stack.physical[role]
        own = {
            p: iam.get_role_policy(RoleName=name, PolicyName=p)["PolicyDocument"]
            for p in iam.list_role_policies(RoleName=name)["PolicyNames"]
        }
        for policy in own:
            iam.delete_role_policy(RoleName=name, PolicyName=policy)
        document = {"Version": "2012-10-17", "Statement": enforceable(statements)}
        iam.put_role_policy(RoleName=name, PolicyName="audit", PolicyDocument=json.dumps(document))
        try:
            yield
        finally:
            iam.delete_role_policy(RoleName=name, PolicyName="audit")
            for policy, document in own.items():
                iam.put_role_policy(RoleName=name, PolicyName=policy, PolicyDocument=json.dumps(document))

    # --- the functions ------------------------------------------------------------------------------
    def function_env(self, logical: str) -> dict[str, str]:
        variables = self.stack.properties(logical).get("Environment", {}).get("Variables", {})
        return {k: "" if v is None else str(v) for k, v in variables.items()}

    def lambda_env(self, logical: str, **overrides: str) -> dict[str, str]:
        """What the function's process sees in Lambda: its variables, the runtime's, and moto's endpoint."""
        env = {
            **self.function_env(logical),
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            **self.role_env(self.role_of(logical)),
            "AWS_LAMBDA_FUNCTION_NAME": f"{self.stack.name}-{logical}",
            "LAMBDA_TASK_ROOT": "/var/task",
            # the one difference from AWS: every AWS client goes to moto
            "ICEBATCH_AWS_ENDPOINT_URL": self.endpoint,
            "ICEBATCH_HOME": str(self.home / logical),  # /tmp/icebatch in Lambda; one per function here
            "NO_PROXY": "127.0.0.1,localhost",
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": os.environ["PYTHONPATH"],
            "HOME": str(self.home),
        }
        env.update(overrides)
        return env

    def role_of(self, function: str) -> str:
        """The logical id of a function's execution role (SAM names it <function>Role)."""
        role = self.stack.template["Resources"][function]["Properties"]["Role"]
        return str(role["Fn::GetAtt"][0])

    def invoke(self, logical: str, event: Any, *, check: bool = True, **overrides: str) -> Invocation:
        """Run the function's handler on ``event`` in a fresh process (a cold start, as in Lambda); a handler that
        raised fails the test, unless ``check`` is False (then ``raised`` holds what it printed)."""
        work = self.home / "invocations" / uuid.uuid4().hex[:8]
        work.mkdir(parents=True)
        (work / "event.json").write_text(json.dumps(event))
        handler = self.stack.properties(logical)["Handler"]
        done = subprocess.run(
            [sys.executable, "-c", _INVOKE, handler, str(work / "event.json"), str(work / "response.json")],
            capture_output=True,
            text=True,
            env=self.lambda_env(logical, **overrides),
            timeout=LAMBDA_TIMEOUT,
        )
        if done.returncode != 0:
            if check:
                raise AssertionError(f"{logical} raised (exit {done.returncode}):\n{done.stderr[-4000:]}")
            return Invocation({}, done.stdout, done.stderr, raised=done.stderr[-4000:] or f"exit {done.returncode}")
        return Invocation(json.loads((work / "response.json").read_text()), done.stdout, done.stderr)

    # --- what the rules delivered --------------------------------------------------------------------
    def drain(self, logical: str, *, expect: int | None = None) -> list[dict[str, Any]]:
        """Events the function's rules delivered (to its inbox), oldest first."""
        sqs = client("sqs", self.endpoint)
        events: list[dict[str, Any]] = []
        for _ in range(8):
            got = sqs.receive_message(QueueUrl=self.inboxes[logical], MaxNumberOfMessages=10, WaitTimeSeconds=1)
            messages = got.get("Messages", [])
            for m in messages:
                events.append(json.loads(m["Body"]))
                sqs.delete_message(QueueUrl=self.inboxes[logical], ReceiptHandle=m["ReceiptHandle"])
            if not messages and (expect is None or len(events) >= expect):
                break
        return events

    def schedule_input(self, logical: str) -> dict[str, Any]:
        """The input the deployed schedule hands its target."""
        schedule = client("scheduler", self.endpoint).get_schedule(Name=self.schedules[logical])
        result: dict[str, Any] = json.loads(schedule["Target"]["Input"])
        return result


# ---------------------------------------------------------------------------------------------------
# deploying
# ---------------------------------------------------------------------------------------------------
def _physical_name(stack: str, logical: str, limit: int) -> str:
    """CloudFormation's generated names: ``<stack>-<logical id>-<random>``, cut to the service's limit."""
    suffix = uuid.uuid4().hex[:12].upper()
    return f"{stack[: limit // 3]}-{logical[: limit - limit // 3 - 14]}-{suffix}"[:limit]


def deploy(name: str, parameters: dict[str, str], *, endpoint: str, home: Path) -> Deployed:
    """Create the stack's resources in moto, as `sam deploy` would (the resources icebatch's tests need)."""
    stack = Stack(translated(), name, parameters, region=REGION, account=ACCOUNT)
    deployed = Deployed(stack, endpoint, home)
    sqs, sns = client("sqs", endpoint), client("sns", endpoint)
    events, scheduler = client("events", endpoint), client("scheduler", endpoint)

    for logical in stack.resources("AWS::SQS::Queue"):
        url = sqs.create_queue(QueueName=_physical_name(name, logical, 80))["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        stack.physical[logical] = url
        stack.attributes[(logical, "Arn")] = arn
        stack.attributes[(logical, "QueueName")] = arn.rsplit(":", 1)[-1]
    for logical in stack.resources("AWS::KMS::Key"):
        key = client("kms", endpoint).create_key(Description=logical)["KeyMetadata"]
        stack.physical[logical] = key["KeyId"]
        stack.attributes[(logical, "Arn")] = key["Arn"]
    for logical in stack.resources("AWS::SNS::Topic"):
        props = stack.properties(logical)
        attributes = {"KmsMasterKeyId": props["KmsMasterKeyId"]} if "KmsMasterKeyId" in props else {}
        arn = sns.create_topic(Name=_physical_name(name, logical, 256), Attributes=attributes)["TopicArn"]
        stack.physical[logical] = arn
        stack.attributes[(logical, "TopicName")] = arn.rsplit(":", 1)[-1]
    for logical in stack.resources("AWS::DynamoDB::Table"):
        props = stack.properties(logical)
        table = _physical_name(name, logical, 255)
        client("dynamodb", endpoint).create_table(
            TableName=table,
            KeySchema=props["KeySchema"],
            AttributeDefinitions=props["AttributeDefinitions"],
            BillingMode=props["BillingMode"],
        )
        stack.physical[logical] = table
        stack.attributes[(logical, "Arn")] = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}"
    for logical in stack.resources("AWS::Lambda::Function"):
        function = f"{name}-{logical}"[:64]
        stack.physical[logical] = function
        stack.attributes[(logical, "Arn")] = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function}"
        if any(
            r["Properties"]["Targets"][0]["Arn"] == {"Fn::GetAtt": [logical, "Arn"]}
            for r in stack.resources("AWS::Events::Rule").values()
        ):
            deployed.inboxes[logical] = sqs.create_queue(QueueName=f"{function}-inbox"[:80])["QueueUrl"]
    for logical in stack.resources("AWS::IAM::Role"):
        role = _physical_name(name, logical, 64)
        stack.physical[logical] = role
        stack.attributes[(logical, "Arn")] = f"arn:aws:iam::{ACCOUNT}:role/{role}"
    iam = client("iam", endpoint)
    for logical in stack.resources("AWS::IAM::Role"):
        props = stack.properties(logical)
        iam.create_role(
            RoleName=stack.physical[logical], AssumeRolePolicyDocument=json.dumps(props["AssumeRolePolicyDocument"])
        )
        for policy in props.get("Policies", []):
            # IAM takes a document without a Version (as SAM writes its own); moto insists on one
            document = {"Version": "2012-10-17", **policy["PolicyDocument"]}
            if enforcing(endpoint):  # what moto can check of it (tests/support/aws.py; iam_audit checks the rest)
                statements = document["Statement"]
                document["Statement"] = enforceable([statements] if isinstance(statements, dict) else statements)
            iam.put_role_policy(
                RoleName=stack.physical[logical], PolicyName=policy["PolicyName"], PolicyDocument=json.dumps(document)
            )
        deployed.credentials[logical] = assume(endpoint, stack.attributes[(logical, "Arn")], f"{name}-{logical}")

    function_arns = {stack.attributes[(f, "Arn")]: f for f in deployed.inboxes}
    for logical in stack.resources("AWS::Events::Rule"):
        props = stack.properties(logical)
        rule = _physical_name(name, logical, 64)
        arn = events.put_rule(
            Name=rule,
            EventPattern=json.dumps(props["EventPattern"]),
            EventBusName=props.get("EventBusName", "default"),
            State=props.get("State", "ENABLED"),
        )["RuleArn"]
        stack.physical[logical] = rule
        stack.attributes[(logical, "Arn")] = arn
        deployed.rules[logical] = rule
        targets = []
        for target in props["Targets"]:
            function = function_arns.get(target["Arn"])
            if function is None:
                raise AssertionError(
                    f"rule {logical} targets {target['Arn']}, which this harness does not stand in for"
                )
            inbox_arn = sqs.get_queue_attributes(QueueUrl=deployed.inboxes[function], AttributeNames=["QueueArn"])
            targets.append({"Id": target["Id"], "Arn": inbox_arn["Attributes"]["QueueArn"]})
        events.put_targets(Rule=rule, EventBusName=props.get("EventBusName", "default"), Targets=targets)
    for logical in stack.resources("AWS::SQS::QueuePolicy"):
        props = stack.properties(logical)
        for url in props["Queues"]:
            sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(props["PolicyDocument"])})
    for logical in stack.resources("AWS::Scheduler::Schedule"):
        props = stack.properties(logical)
        schedule = props.get("Name") or _physical_name(name, logical, 64)
        scheduler.create_schedule(
            Name=schedule,
            ScheduleExpression=props["ScheduleExpression"],
            ScheduleExpressionTimezone=props.get("ScheduleExpressionTimezone", "UTC"),
            FlexibleTimeWindow=props["FlexibleTimeWindow"],
            Target={
                k: props["Target"][k]
                for k in ("Arn", "RoleArn", "Input", "RetryPolicy", "DeadLetterConfig")
                if k in props["Target"]
            },
        )
        deployed.schedules[logical] = schedule
    cloudwatch = client("cloudwatch", endpoint)
    for logical in stack.resources("AWS::CloudWatch::Alarm"):
        props = stack.properties(logical)
        cloudwatch.put_metric_alarm(AlarmName=_physical_name(name, logical, 255), **props)
    _custom_resources(deployed)
    return deployed


def _custom_resources(deployed: Deployed) -> None:
    """Create the stack's custom resources by invoking their functions as CloudFormation does."""
    stack = deployed.stack
    functions = {stack.attributes[(f, "Arn")]: f for f in stack.resources("AWS::Lambda::Function")}
    for logical, resource in stack.resources().items():
        if not resource["Type"].startswith("Custom::"):
            continue
        props = stack.properties(logical)
        with cloudformation_responses() as (url, answers):
            event = {
                "RequestType": "Create",
                "ServiceToken": props["ServiceToken"],
                "ResponseURL": url,
                "StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{stack.name}/0",
                "RequestId": str(uuid.uuid4()),
                "LogicalResourceId": logical,
                "ResourceType": resource["Type"],
                "ResourceProperties": props,
            }
            deployed.invoke(functions[props["ServiceToken"]], event)
        if not answers or answers[-1]["Status"] != "SUCCESS":
            raise AssertionError(f"custom resource {logical} failed: {answers}")
        stack.physical[logical] = answers[-1]["PhysicalResourceId"]
