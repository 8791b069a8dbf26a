"""The Lambdas as Lambda runs them: the bundle `sam build` makes, under the runtime interface client.

The aws tier's other tests call each handler as a Python function in a fresh process. Here each function's
bundle (functions/Makefile's recipe, for the template's platform) runs as Lambda's Python runtime runs it:
``python -m awslambdaric <Handler>`` in its task root, with only the packages Lambda's image provides beside
it (boto3, the runtime interface client), polling a Runtime API that the test serves on 127.0.0.1
(tests/support/runtime_api.py), with the function's environment as deployed and AWS APIs in moto. What that
adds: init outside the handler, then invocation after invocation in one warm process; Lambda's context
(request id, deadline, ARN) from the API's headers; an error posted as the runtime posts it; a process that
dies mid-invocation, and its retry in a new one.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from icebatch.core.catalog import open_catalog
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets

from tests.aws.world import NAMESPACE, World
from tests.support.aws import client
from tests.support.iam_audit import denied, role_statements
from tests.support.runtime_api import LambdaProcess, RuntimeApi

pytestmark = pytest.mark.aws
ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "sam" / "events"
STACK = "icebatch-runtime"  # this module's stack (tests/aws/conftest.py)
RUNTIME_CLIENT = "awslambdaric==4.2.2"  # what Lambda's python3.11 image runs a handler with


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The functions' bundle as `sam build` makes it, and the packages Lambda's image provides, in a folder."""
    from bench.launcher_weight import build_bundle, uv

    built, runtime, _ = build_bundle(tmp_path_factory.mktemp("build"))
    subprocess.run(
        [uv(), "pip", "install", "-q", "--target", str(runtime), "--python-version", "3.11", RUNTIME_CLIENT],
        check=True,
        timeout=600,
    )
    return built, runtime


@pytest.fixture
def api() -> Iterator[RuntimeApi]:
    served = RuntimeApi()
    yield served
    served.stop()


@pytest.fixture
def started(world: World, bundle: tuple[Path, Path], api: RuntimeApi, tmp_path: Path) -> Iterator[Any]:
    """Start functions as Lambda starts them; each is killed at the test's end."""
    processes: list[LambdaProcess] = []

    def start(logical: str, **overrides: str) -> LambdaProcess:
        task_root, runtime = bundle
        env = world.deployed.lambda_env(logical, **overrides)
        env.update(
            {
                "AWS_LAMBDA_RUNTIME_API": api.address,
                "PYTHONPATH": f"{task_root}:{runtime}",  # the task root, then the runtime's packages
                "LAMBDA_TASK_ROOT": str(task_root),
                "AWS_EXECUTION_ENV": "AWS_Lambda_python3.11",
                "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(world.deployed.stack.properties(logical).get("MemorySize", 512)),
                "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{env['AWS_LAMBDA_FUNCTION_NAME']}",
                "AWS_LAMBDA_LOG_STREAM_NAME": "2026/12/07/[$LATEST]0123456789abcdef",
            }
        )
        handler = world.deployed.stack.properties(logical)["Handler"]
        processes.append(LambdaProcess(handler, task_root, env, tmp_path / f"{logical}-{len(processes)}.log"))
        return processes[-1]

    yield start
    for p in processes:
        p.kill()


def _records(function: LambdaProcess) -> list[dict[str, Any]]:
    """The function's structured log records and EMF documents (each a JSON line, as CloudWatch Logs gets them)."""
    out = []
    for line in function.output().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _source(world: World, rows: int, seed: int) -> int:
    """``rows`` tickets more in the world's table; how many it holds (no job runs here: all are backlog)."""
    settings = world.launcher_settings()
    table = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    append_tickets(table, generate_tickets(rows, random.Random(seed)))
    return int(table.refresh().scan().to_arrow().num_rows)


def _glue_commit(world: World) -> dict[str, Any]:
    """sam/events' Glue table change, for this world's table, as the deployed rule delivers it."""
    event: dict[str, Any] = json.loads((EVENTS / "glue-table-change.json").read_text())
    event["detail"].update(databaseName=world.database, tableName="tickets")
    event["resources"] = [f"arn:aws:glue:us-east-1:123456789012:table/{world.database}/tickets"]
    return event


def test_the_launcher_answers_trigger_after_trigger_in_one_warm_process_each_with_its_own_context(
    world: World, started: Any, api: RuntimeApi
) -> None:
    # given a table with a few tickets (fewer than either bundled consumer's threshold), and the launcher's bundle
    # started by the runtime interface client with the function's environment as deployed
    rows = _source(world, 5, seed=11)
    launcher = started("LauncherFunction")
    # when the deployed nightly schedule's input, a Glue commit of the table and a malformed event reach it in turn
    nightly = api.invoke(launcher, world.deployed.schedule_input("LauncherFunctionNightly"))
    commit = api.invoke(launcher, _glue_commit(world))
    malformed = api.invoke(launcher, json.loads((EVENTS / "malformed" / "not-an-object.json").read_text()))
    # then each is answered on the Runtime API as the handler answers: a decision per consumer, the table's rows
    for answer in (nightly, commit):
        assert answer.kind == "response" and answer.body["status"] == "ok", answer
        assert sorted((d["consumer"], d["backlog_rows"]) for d in answer.body["decisions"]) == [
            ("privacy", rows),
            ("triage", rows),
        ]
    assert [d["origin"] for d in commit.body["decisions"]] == ["glue", "glue"], commit.body
    # and the malformed event is a clean answer that says what is wrong, not an error the platform would retry
    assert malformed.kind == "response" and malformed.body["status"] == "rejected", malformed
    assert "JSON object" in malformed.body["reason"], malformed.body
    # and one process served all three (initialized once, then warm), its records each carrying its own request
    assert launcher.proc.poll() is None and len(api.served) == 3
    records = _records(launcher)
    decided = [r["function_request_id"] for r in records if r.get("message") == "launch decision"]
    assert decided == [api.served[0]] * 2 + [api.served[1]] * 2, decided
    rejected = [r for r in records if r.get("message") == "rejected event"]
    assert [r["function_request_id"] for r in rejected] == [api.served[2]]
    # and each invocation's metrics are its own: the decisions counted per invocation, none carried over
    counted = [r["Decisions"] for r in records if "_aws" in r and "Decisions" in r]
    assert counted == [[2], [2]], counted


def test_an_error_is_posted_as_the_runtime_posts_it_and_the_process_serves_the_next_invocation(
    world: World, started: Any, api: RuntimeApi
) -> None:
    # given the launcher's bundle, whose AWS APIs cannot be reached (an endpoint nothing listens on)
    launcher = started("LauncherFunction", ICEBATCH_AWS_ENDPOINT_URL="http://127.0.0.1:9")
    # when the nightly schedule reaches it, twice
    answers = [api.invoke(launcher, world.deployed.schedule_input("LauncherFunctionNightly")) for _ in range(2)]
    # then each is an error document on the Runtime API (a transient error: Lambda retries it, then the dead-letter
    # queue keeps it): the error's type, a message that says what could not be reached, and the stack it came from
    for answer in answers:  # (the nightly run reconciles first: the cluster's API is its first call)
        assert answer.kind == "error" and answer.body["errorType"] == "ClusterUnavailableError", answer
        assert answer.body["errorMessage"].startswith("cannot reach the EKS API") and "127.0.0.1:9" in str(answer.body)
        assert answer.body["stackTrace"] and answer.body["requestId"] == answer.request_id, answer.body
    # and the process lived on to take the second, as a warm Lambda does
    assert launcher.proc.poll() is None and len(api.served) == 2


def test_a_launcher_killed_mid_invocation_after_creating_its_rayjob_is_retried_into_one_job(
    world: World, started: Any, api: RuntimeApi
) -> None:
    # given a table with new tickets, no job running (any earlier one ended, as KubeRay marks it), and the
    # launcher's bundle under the runtime client
    _source(world, 3, seed=12)
    for name in world.k8s.names(NAMESPACE):
        world.k8s.set_status(name, NAMESPACE, jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
    first = started("LauncherFunction")
    before = set(world.k8s.names(NAMESPACE))
    # when a forced launch is killed the moment its RayJob is created (as Lambda kills a function at its
    # deadline, at the worst moment: the job exists, the function never heard so, nothing was answered)
    world.k8s.on_create = lambda _job: first.kill()
    try:
        killed = api.invoke(first, json.loads((EVENTS / "manual-force.json").read_text()))
    finally:
        world.k8s.on_create = None
    # then Lambda's answer is the runtime's exit, and the one job it created is there
    assert killed.kind == "exit" and killed.body["errorType"] == "Runtime.ExitError", killed.body
    [job] = set(world.k8s.names(NAMESPACE)) - before
    # when Lambda retries the event in a new process (a cold start), and the event comes once more (at least once)
    retry = started("LauncherFunction")
    answers = [api.invoke(retry, json.loads((EVENTS / "manual-force.json").read_text())) for _ in range(2)]
    for answer in answers:
        assert answer.kind == "response" and answer.body["status"] == "ok", answer
    # then the one job the killed invocation created (both consumers' runs: they share a model) is found by the
    # retries for each consumer, and nothing is started again
    jobs = set(world.k8s.names(NAMESPACE)) - before
    assert jobs == {job} and "icebatch.io/shared-with" in world.k8s.objects[(NAMESPACE, job)]["metadata"]["annotations"]
    for answer in answers:
        decisions = answer.body["decisions"]
        assert len(decisions) == 2 and {d["decision"] for d in decisions} == {"already_launched"}, decisions
        assert all(job in d["reason"] for d in decisions), decisions
    # and every AWS call it made was allowed by its role as deployed
    calls = world.recorder.by(world.deployed.key("LauncherFunctionRole"))
    assert calls and denied(calls, role_statements(world.deployed.stack, "LauncherFunctionRole")) == []


def test_the_reporter_reports_a_completion_under_the_runtime_client(
    world: World, started: Any, api: RuntimeApi
) -> None:
    # given the reporter's bundle under the runtime client, and a job's completion as the deployed rule delivers it
    reporter = started("ReporterFunction")
    event = json.loads((EVENTS / "completed.json").read_text())
    event["detail"].update(deployment=STACK, run_id="triage-20261207T010000-5e1f0a")
    # when it is invoked
    answer = api.invoke(reporter, event)
    # then it answers "reported", and the report is on the deployed topic (read by its subscribed queue)
    assert answer.kind == "response" and answer.body["status"] == "reported", answer
    got = client("sqs", world.endpoint).receive_message(QueueUrl=world.reports, WaitTimeSeconds=5)
    bodies = [json.loads(json.loads(m["Body"])["Message"]) for m in got.get("Messages", [])]
    assert any(b.get("run_id") == "triage-20261207T010000-5e1f0a" for b in bodies), bodies
