"""The Lambda bundle, built by functions/Makefile's own recipe (what `sam build` runs), really runs the
launcher — and carries only what the Lambdas run."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.settings import Settings
from icebatch_job.example.tickets import ensure_source_table, generate

from tests.support.k8s_api import RayJobApi

pytestmark = pytest.mark.functional
ROOT = Path(__file__).resolve().parents[2]

# Lambda's runtime: import the handler named by the template, call it with the event and a context
LAMBDA = """
import importlib, json, sys
handler = sys.argv[1]
sys.path[:0] = sys.argv[3:]
lambda_handler = importlib.import_module(f"icebatch.control.handlers.{handler}").lambda_handler
class Context:
    function_name, memory_limit_in_mb, function_version = "launcher", 512, "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:launcher"
    aws_request_id = "local"
    def get_remaining_time_in_millis(self): return 60_000
r = lambda_handler(json.load(open(sys.argv[2])), Context())
bad = [m for m in ("pyarrow", "ray", "vllm", "torch", "icebatch.tools", "icebatch_job") if m in sys.modules]
assert not bad, bad
print(json.dumps(r))
"""


@pytest.fixture
def k8s() -> Iterator[RayJobApi]:
    api = RayJobApi(namespaces={"icebatch"})
    api.url = api.start()  # type: ignore[attr-defined]
    yield api
    api.stop()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The bundle `sam build` makes (functions/Makefile's own recipe, for the template's platform), and the
    packages the Lambda runtime provides (boto3), installed beside it."""
    from bench.launcher_weight import build_bundle

    bundle, runtime, _ = build_bundle(tmp_path_factory.mktemp("build"))
    return bundle, runtime


def test_a_launch_decision_runs_from_the_bundle_and_the_bundle_holds_no_tooling(
    settings: Settings, built: tuple[Path, Path], k8s: RayJobApi
) -> None:
    generate(ensure_source_table(open_catalog(settings), settings.catalog.source_table), tickets=20, batches=2, seed=1)
    bundle, runtime = built
    # the bundle: the core, the control plane and the consumers file; no CLI, local backend or job
    assert (bundle / "icebatch" / "core").is_dir() and (bundle / "icebatch" / "control").is_dir()
    assert (bundle / "icebatch" / "consumers" / "consumers.yaml").is_file()
    assert not (bundle / "icebatch" / "tools").exists() and not (bundle / "icebatch_job").exists()
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            LAMBDA,
            "launcher",
            str(ROOT / "sam/events/schedule.json"),
            str(bundle),
            str(runtime),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={
            "ICEBATCH_HOME": str(settings.home),
            "ICEBATCH_DRY_RUN": "true",
            "ICEBATCH_BACKEND": "kuberay",
            "ICEBATCH_EVENT_BUS": "default",  # as template.yaml sets it (the local bus is tooling)
            "ICEBATCH_EKS_CLUSTER": "c",
            "ICEBATCH_K8S_API_SERVER": k8s.url,  # type: ignore[attr-defined]
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "POWERTOOLS_METRICS_NAMESPACE": "icebatch/test",
            "NO_PROXY": "127.0.0.1",
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    response = json.loads(done.stdout.strip().splitlines()[-1])
    assert response["status"] == "ok", response
    assert [(d["consumer"], d["decision"], d["backlog_rows"]) for d in response["decisions"]] == [
        ("triage", "dry_run", 20),
        ("privacy", "dry_run", 20),
    ]


def test_the_reporter_runs_from_the_bundle_against_aws_apis(
    settings: Settings, built: tuple[Path, Path], aws_endpoint: str
) -> None:
    from tests.support.aws import REGION, client

    # given the reporter's topic (delivering to a queue) and idempotency table, in moto
    bundle, runtime = built
    sns, sqs = client("sns", aws_endpoint), client("sqs", aws_endpoint)
    topic = sns.create_topic(Name="bundle-reports")["TopicArn"]
    inbox = sqs.create_queue(QueueName="bundle-reports-inbox")["QueueUrl"]
    inbox_arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=inbox_arn)
    client("dynamodb", aws_endpoint).create_table(
        TableName="bundle-idempotency",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    # when the reporter, imported from the bundle alone (and the runtime's boto3), gets a completion event
    event = ROOT / "sam/events/completed.json"
    done = subprocess.run(
        [sys.executable, "-I", "-c", LAMBDA, "reporter", str(event), str(bundle), str(runtime)],
        capture_output=True,
        text=True,
        timeout=180,
        env={
            "ICEBATCH_HOME": str(settings.home),
            "ICEBATCH_DEPLOYMENT": json.loads(event.read_text())["detail"]["deployment"],
            "ICEBATCH_SNS_TOPIC_ARN": topic,
            "ICEBATCH_IDEMPOTENCY_TABLE": "bundle-idempotency",
            "ICEBATCH_AWS_ENDPOINT_URL": aws_endpoint,
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "POWERTOOLS_METRICS_NAMESPACE": "icebatch/test",
            "NO_PROXY": "127.0.0.1",
        },
    )
    # then it published the report: the topic delivered it
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["status"] == "reported", done.stdout[-2000:]
    messages = sqs.receive_message(QueueUrl=inbox, WaitTimeSeconds=2).get("Messages", [])
    assert messages and "Subject" in json.loads(messages[0]["Body"])


def _wheel_tags(bundle: Path) -> dict[str, list[str]]:
    """Each installed distribution's wheel tags (its WHEEL file's ``Tag:`` lines)."""
    return {
        info.parent.name: [
            line.split(":", 1)[1].strip() for line in info.read_text().splitlines() if line.startswith("Tag:")
        ]
        for info in bundle.glob("*.dist-info/WHEEL")
    }


ELF_MACHINE = {"x86_64": 0x3E, "arm64": 0xB7}  # e_machine of an ELF header


def _lambda_loads(tag: str, wheel_arch: str) -> bool:
    """Whether Lambda's python3.11 on Amazon Linux 2 (glibc 2.26) for ``wheel_arch`` loads a wheel of this tag."""
    python_tag, abi, platform = tag.split("-")
    if platform == "any":
        return abi == "none"
    glibc = re.fullmatch(rf"manylinux(?:2014|_2_(\d+))_{wheel_arch}", platform)
    return (
        python_tag in {"cp311", "cp32", "cp38", "cp39"}
        and abi in {"cp311", "abi3", "none"}
        and glibc is not None
        and int(glibc.group(1) or 17) <= 26
    )


@pytest.mark.parametrize("arch", ["x86_64", "arm64"])
def test_the_bundle_is_built_for_the_lambda_platform_whatever_the_build_machine(tmp_path: Path, arch: str) -> None:
    from bench.launcher_weight import uv

    # given this build machine (x86_64 Linux with a newer glibc than Lambda's Amazon Linux 2), building for the
    # template's architecture and for arm64, a platform this machine is not (as a Mac or a Graviton laptop is not
    # x86_64): the platform comes from the recipe, never from the host
    bundle = tmp_path / "bundle"
    python = shutil.which("python3.11") or sys.executable
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(ROOT / "functions"),
            "build-LauncherFunction",
            f"ARTIFACTS_DIR={bundle}",
            f"PYTHON={python}",
            f"UV={uv()}",
            f"LAMBDA_ARCH={arch}",
        ],
        check=True,
        capture_output=True,
    )
    # then every distribution is a binary wheel for Lambda's python3.11 on that architecture (manylinux2014:
    # glibc 2.17, which Amazon Linux 2's 2.26 loads), or pure Python
    wheel_arch = {"x86_64": "x86_64", "arm64": "aarch64"}[arch]
    tags = _wheel_tags(bundle)
    assert len(tags) > 20, tags
    for dist, dist_tags in tags.items():
        assert any(_lambda_loads(tag, wheel_arch) for tag in dist_tags), (dist, dist_tags)  # a wheel: any tag
    # and every compiled extension is a library for that architecture
    libraries = [lib for lib in bundle.rglob("*.so*") if lib.is_file()]
    assert libraries
    for lib in libraries:
        header = lib.read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == ELF_MACHINE[arch], lib


def test_the_recipe_builds_for_the_architecture_the_template_declares() -> None:
    from tests.support.cfn import load_template

    template = load_template(ROOT / "template.yaml")
    assert template["Globals"]["Function"]["Runtime"] == "python3.11"
    makefile = (ROOT / "functions" / "Makefile").read_text()
    [default] = re.findall(r"^LAMBDA_ARCH \?= (\S+)$", makefile, flags=re.M)
    assert template["Globals"]["Function"]["Architectures"] == [default]
    assert "-r requirements.lock" in makefile and "--only-binary" in makefile
    # and the lock pins every requirement of the bundle, within its range (`make lock` resolves it again)
    from packaging.requirements import Requirement

    pinned = dict(
        line.split("==", 1)
        for line in (ROOT / "functions" / "requirements.lock").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    for line in (ROOT / "functions" / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            assert requirement.specifier.contains(pinned[requirement.name.lower()]), (
                line,
                pinned.get(requirement.name),
            )
