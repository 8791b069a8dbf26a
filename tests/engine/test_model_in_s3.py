"""A model in S3 loaded into the real engine from S3's API (moto over HTTP): streamed by the run:ai streamer
(``ICEBATCH_MODEL_LOAD_FORMAT=runai_streamer``), or downloaded to the node's disk first by Ray Data LLM (``download``,
the default). ``nvme_streamer``, the template's, is the production flow's (tests/aws)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.settings import Settings
from icebatch_job.example.tickets import ensure_source_table, generate

from tests.engine.conftest import job_process_env, ledger
from tests.support.aws import CREDS, REGION, client

pytestmark = [pytest.mark.engine]


@pytest.mark.parametrize("load_format", ["runai_streamer", "download"])
def test_a_model_in_s3_reaches_the_engine_and_every_ticket_is_labelled(
    own_settings: Settings, tiny_model: Path, aws_endpoint: str, load_format: str
) -> None:
    # given the tiny model in a bucket, and 40 tickets
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3 = client("s3", aws_endpoint)
    s3.create_bucket(Bucket=bucket)
    for path in sorted(tiny_model.iterdir()):
        s3.upload_file(str(path), bucket, f"tiny-llama/{path.name}")
    s = own_settings
    generate(ensure_source_table(open_catalog(s), s.catalog.source_table), tickets=40, batches=1, seed=5)
    env = job_process_env(s, s.launch.consumers_file) | {
        "ICEBATCH_MODEL_SOURCE": f"s3://{bucket}/tiny-llama/",
        "ICEBATCH_MODEL_LOAD_FORMAT": load_format,
        "ICEBATCH_AWS_ENDPOINT_URL": aws_endpoint,
        "ICEBATCH_AWS_REGION": REGION,
        **CREDS,
    }
    # when the job runs as its pod runs it
    done = subprocess.run(
        [sys.executable, "-m", "icebatch_job", "run"], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    # then every ticket has one verdict
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = ledger(s).results()
    assert results is not None
    ids = results.scan(selected_fields=("source_id", "status")).to_arrow().column("source_id").to_pylist()
    assert len(ids) == 40 and len(set(ids)) == 40
    # and the engine's weights came from S3 as a stream, never written to the node's disk, or were downloaded there
    # first (the tokenizer was, either way: the prompt stage reads it there)
    on_disk = [p.name for p in s.home.rglob("*.safetensors")]
    assert on_disk == ([] if load_format == "runai_streamer" else ["model.safetensors"]), on_disk
    assert [p for p in s.home.rglob("tokenizer.json")]
