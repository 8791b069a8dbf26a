"""The job's Iceberg I/O with EKS Pod Identity's credentials: no static keys anywhere.

On EKS the job pod gets its role from the Pod Identity agent: ``AWS_CONTAINER_CREDENTIALS_FULL_URI`` and a
token file (``AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE``) whose content goes in the ``Authorization`` header.
boto3 (the Glue catalog) and pyarrow's S3 filesystem (pyiceberg's FileIO: every data and metadata file) must
each follow that chain; pyarrow before 21 bundled an AWS SDK that did not reach the agent
(apache/arrow#45603; 21 assumes AWS SDK for C++ 1.11), so the job image requires pyarrow>=21
(jobimage/requirements.txt, checked in tests/contract/test_job_image.py). Here a local endpoint serves the
credentials as the agent does, and the job's code paths read and write through moto with nothing else to
sign with. (A loopback endpoint cannot tell the SDK versions apart: they differ in accepting the agent's
link-local address, which this machine does not route; the version floor is the image's requirement.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from icebatch.core.settings import Settings

from tests.support.aws import REGION, client
from tests.support.http_server import QuietHandler, serving

pytestmark = pytest.mark.functional
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "eks-pod-identity-token-" + uuid.uuid4().hex

JOB = """
import json, random, sys
from icebatch.core.catalog import open_catalog
from icebatch.core.ledger import open_ledger
from icebatch.core.settings import Settings
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets
from tests.support.consumers import triage
from tests.support.runs import ledger_ids, run_once, source_ids

settings = Settings.model_validate_json(sys.argv[1])
source = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
append_tickets(source, generate_tickets(7, random.Random(1)))
ledger = open_ledger(settings, triage(settings))
run_once(ledger)
print(json.dumps({"source": sorted(source_ids(ledger)), "results": sorted(ledger_ids(ledger)),
                  "io": type(ledger.source().io).__name__}))
"""


@pytest.fixture
def pod_identity_agent() -> Iterator[tuple[str, list[str]]]:
    """Serves credentials as EKS's Pod Identity agent does: only to a request that carries the pod's token."""
    seen: list[str] = []

    class Agent(QuietHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            if self.headers.get("Authorization") != TOKEN:
                self.send_response(400)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = json.dumps(
                {
                    "AccessKeyId": "ASIAPODIDENTITY",
                    "SecretAccessKey": "secret",
                    "Token": "session",
                    "Expiration": "2099-01-01T00:00:00Z",
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serving(Agent) as url:
        yield f"{url}/v1/credentials", seen


def test_the_jobs_iceberg_io_runs_on_pod_identity_credentials_alone(
    aws_endpoint: str, tmp_path: Path, pod_identity_agent: tuple[str, list[str]]
) -> None:
    # given a warehouse and a Glue catalog (moto), and a pod whose only credentials come from the agent
    agent_url, seen = pod_identity_agent
    bucket = f"wh-{uuid.uuid4().hex[:10]}"
    client("s3", aws_endpoint).create_bucket(Bucket=bucket)
    token_file = tmp_path / "eks-pod-identity-token"
    token_file.write_text(TOKEN)
    props = {
        "glue.endpoint": aws_endpoint,
        "glue.region": REGION,
        "s3.endpoint": aws_endpoint,
        "s3.region": REGION,
        "client.region": REGION,
        "warehouse": f"s3://{bucket}/warehouse",
    }
    settings = Settings(
        home=tmp_path / "home",
        catalog_type="glue",
        catalog_properties=props,
        source_table=f"db_{uuid.uuid4().hex[:8]}.tickets",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ICEBATCH_"))}
    env.update(
        AWS_CONTAINER_CREDENTIALS_FULL_URI=agent_url,
        AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=str(token_file),
        AWS_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(tmp_path / "no-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
        NO_PROXY="127.0.0.1,localhost",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "functions"), str(ROOT / "jobimage")]),
    )
    # when the job's code creates the table, appends, runs and commits its results (Glue through boto3, every
    # data and metadata file through pyiceberg's pyarrow FileIO)
    done = subprocess.run(
        [sys.executable, "-c", JOB, settings.model_dump_json()], env=env, capture_output=True, text=True, timeout=300
    )
    # then it all went through, signed with the agent's credentials, fetched with the pod's token
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["io"] == "PyArrowFileIO"
    assert len(out["source"]) == 7 and out["results"] == out["source"]
    assert seen and set(seen) == {TOKEN}
