"""The prompt stage's tokenizer of an ``s3://`` model: the prefix's small files copied once into the job's cache.

Driven against moto's S3 over HTTP with boto3 configured as on a pod (``AWS_ENDPOINT_URL_S3`` standing in for the
region's endpoint): what is copied, what is not (weights, sub-folders, names that are not plain file names), and
what an empty prefix says.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from icebatch.core.errors import ModelUnavailableError
from icebatch_job.stages.model import tokenizer_path

from tests.support.aws import CREDS, REGION, client

pytestmark = pytest.mark.functional


@pytest.fixture
def bucket(aws_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A bucket of models, the job's S3 client pointed at it, and a fresh cache."""
    name = f"models-{uuid.uuid4().hex[:10]}"
    client("s3", aws_endpoint).create_bucket(Bucket=name)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return name


def test_the_tokenizer_files_are_copied_and_nothing_else(aws_endpoint: str, bucket: str, tmp_path: Path) -> None:
    # given a model's prefix with its tokenizer, its weights, a sub-folder, and objects whose names are not plain
    # file names there ('..' would write beside the cache folder, '.' onto it)
    s3 = client("s3", aws_endpoint)
    files = {
        "tokenizer.json": b"{}",
        "tokenizer_config.json": b'{"chat_template": "x"}',
        "config.json": b'{"model_type": "llama"}',
        "model.safetensors": b"weights",
        "original/consolidated.00.pth": b"weights",
        "..": b"outside",
        ".": b"onto",
    }
    for name, body in files.items():
        s3.put_object(Bucket=bucket, Key=f"llama/{name}", Body=body)
    # when the job asks for the tokenizer
    local = Path(tokenizer_path(f"s3://{bucket}/llama/"))
    # then the plain files but weights are in its cache folder, and nothing was written beside it
    assert sorted(p.name for p in local.iterdir()) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in local.parent.iterdir()) == [local.name]
    assert (local / "tokenizer_config.json").read_bytes() == files["tokenizer_config.json"]
    # and a second ask reads the cache, not S3 (the objects gone, the same folder)
    s3.delete_object(Bucket=bucket, Key="llama/tokenizer.json")
    assert tokenizer_path(f"s3://{bucket}/llama/") == str(local)


def test_a_prefix_without_a_tokenizer_says_what_to_check(aws_endpoint: str, bucket: str) -> None:
    # given a prefix holding weights alone
    client("s3", aws_endpoint).put_object(Bucket=bucket, Key="bare/model.safetensors", Body=b"w")
    # when the job asks for the tokenizer, then it is told there is none, and what to check
    with pytest.raises(ModelUnavailableError, match=r"no tokenizer under s3://.*bare/.*s3:GetObject"):
        tokenizer_path(f"s3://{bucket}/bare/")
