"""The Lambda bundle, built by functions/Makefile's own recipe (what `sam build` runs), really runs the
launcher — and carries only what the Lambdas run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.settings import Settings
from icebatch_job.tickets import ensure_source_table, generate

from tests.support.k8s_api import RayJobApi

pytestmark = pytest.mark.functional
ROOT = Path(__file__).resolve().parents[2]

# Lambda's runtime: import the handler named by the template, call it with the event and a context
LAMBDA = """
import json, sys
sys.path[:0] = sys.argv[2:]
from icebatch.control.handlers.launcher import lambda_handler
class Context:
    function_name, memory_limit_in_mb, function_version = "launcher", 512, "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:launcher"
    aws_request_id = "local"
r = lambda_handler(json.load(open(sys.argv[1])), Context())
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


def test_a_launch_decision_runs_from_the_bundle_and_the_bundle_holds_no_tooling(
    settings: Settings, tmp_path: Path, k8s: RayJobApi
) -> None:
    from bench.launcher_weight import build_bundle

    generate(ensure_source_table(open_catalog(settings), settings.catalog.source_table), tickets=20, batches=2, seed=1)
    bundle, runtime, _ = build_bundle(tmp_path / "build")
    # the bundle: the core, the control plane and the consumers file; no CLI, local backend or job
    assert (bundle / "icebatch" / "core").is_dir() and (bundle / "icebatch" / "control").is_dir()
    assert (bundle / "consumers" / "consumers.yaml").is_file()
    assert not (bundle / "icebatch" / "tools").exists() and not (bundle / "icebatch_job").exists()
    done = subprocess.run(
        [sys.executable, "-I", "-c", LAMBDA, str(ROOT / "sam/events/schedule.json"), str(bundle), str(runtime)],
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
