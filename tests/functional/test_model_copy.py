"""An ``s3://`` model copied to the engine's node (``ICEBATCH_MODEL_LOAD_FORMAT=nvme_streamer``): what a GPU worker's
init container runs (``python -m icebatch_job copy-model``) and the job makes sure of before the engine starts.

Driven against moto's S3 over HTTP with boto3 configured as on a pod: the copy is whole, made once, made anew when
the prefix's objects change, and a prefix that holds no model says so with the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from icebatch.core.errors import ModelUnavailableError
from icebatch_job.stages.model_copy import RECORD, copy_folder, copy_model

from tests.support.aws import CREDS, REGION, client

pytestmark = pytest.mark.functional

FILES = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}", "model.safetensors": b"w" * 70_000}


@pytest.fixture
def model(aws_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A model's prefix in a bucket (a sub-folder beside its files), the job's S3 client pointed at it."""
    bucket = f"models-{uuid.uuid4().hex[:10]}"
    s3 = client("s3", aws_endpoint)
    s3.create_bucket(Bucket=bucket)
    for name, body in {**FILES, "original/consolidated.00.pth": b"w"}.items():
        s3.put_object(Bucket=bucket, Key=f"llama/{name}", Body=body)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)
    return f"s3://{bucket}/llama/"


def test_the_model_is_copied_whole_once_and_again_when_its_objects_change(
    aws_endpoint: str, model: str, tmp_path: Path
) -> None:
    # given a node's cache with no copy
    home = tmp_path / "home"
    # when the model is copied
    copy = Path(copy_model(model, home))
    # then the prefix's files are there, weights included, under the model's own name, and nothing else is
    assert copy == copy_folder(home, model) and copy.name == "llama"
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == FILES
    assert sorted(p.name for p in copy.parent.iterdir()) == sorted([RECORD, "llama"])
    assert [p.name for p in copy.parent.parent.iterdir()] == [copy.parent.name]  # no partial copy left beside it
    # when it is asked for again with the objects unchanged, then the copy is kept as it is
    made = {p.name: p.stat().st_mtime_ns for p in copy.iterdir()}
    assert copy_model(model, home) == str(copy)
    assert {p.name: p.stat().st_mtime_ns for p in copy.iterdir()} == made
    # when the weights at the prefix are replaced, then the next ask makes the copy anew, from them
    bucket = model.removeprefix("s3://").split("/")[0]
    client("s3", aws_endpoint).put_object(Bucket=bucket, Key="llama/model.safetensors", Body=b"v" * 70_000)
    assert copy_model(model, home) == str(copy)
    assert (copy / "model.safetensors").read_bytes() == b"v" * 70_000
    # and a copy whose record cannot be read (a disk's fault, a hand's edit) is made anew, not trusted nor a crash
    (copy.parent / RECORD).write_text("{not json")
    assert copy_model(model, home) == str(copy)
    assert json.loads((copy.parent / RECORD).read_text())["model.safetensors"][0] == 70_000


def test_a_prefix_without_weights_or_access_says_what_to_fix(aws_endpoint: str, model: str, tmp_path: Path) -> None:
    bucket = model.removeprefix("s3://").split("/")[0]
    # given a prefix holding no safetensors, and a bucket that does not exist
    client("s3", aws_endpoint).put_object(Bucket=bucket, Key="empty/config.json", Body=b"{}")
    # when each is copied, then the error names the fix, and no copy is left
    with pytest.raises(ModelUnavailableError, match=r"no \*\.safetensors under .*MODEL_LOAD_FORMAT=download"):
        copy_model(f"s3://{bucket}/empty/", tmp_path)
    with pytest.raises(ModelUnavailableError, match="s3:GetObject and s3:ListBucket"):
        copy_model(f"s3://no-{bucket}/llama/", tmp_path)
    assert list(tmp_path.rglob("*.json")) == []


def test_the_init_container_command_copies_the_model_and_prints_its_folder(
    aws_endpoint: str, model: str, tmp_path: Path
) -> None:
    # given the job image's command line, configured as a worker pod's (its settings, this machine as the node)
    env = {
        "ICEBATCH_HOME": str(tmp_path),
        "ICEBATCH_AWS_ENDPOINT_URL": aws_endpoint,
        "ICEBATCH_AWS_REGION": REGION,
        "ICEBATCH_MODEL_LOAD_FORMAT": "nvme_streamer",
        **CREDS,
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ["PYTHONPATH"],
    }
    command = [sys.executable, "-m", "icebatch_job", "copy-model"]
    # when it copies the model
    done = subprocess.run([*command, model], env=env, capture_output=True, text=True, timeout=120, check=False)
    # then stdout is the copy's folder, and the copy is there
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"{copy_folder(tmp_path, model)}\n" and (Path(done.stdout.strip()) / "config.json").is_file()
    # and what is not a model prefix is refused by the command line (2), a missing model too, with the fix
    for bad in ("/models/llama", "s3://x"):
        refused = subprocess.run([*command, bad], env=env, capture_output=True, text=True, timeout=60, check=False)
        assert refused.returncode == 2 and "is not an s3:// model prefix" in refused.stderr, refused.stderr
    bucket = model.removeprefix("s3://").split("/")[0]
    missing = subprocess.run(
        [*command, f"s3://{bucket}/nothing/"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert missing.returncode == 2 and "no *.safetensors under" in missing.stderr, missing.stderr
