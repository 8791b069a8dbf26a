"""Where the model comes from: a local folder, the tiny local model, an ``s3://`` prefix or a hub id.

``s3://`` models are loaded the way Ray Data LLM loads them: its vLLM stage downloads the model to the
node's disk (``ICEBATCH_MODEL_LOAD_FORMAT=download``), or downloads only the config and tokenizer and
streams the weights (``runai_streamer``). The prompt stage needs the tokenizer too, on whatever node it
runs: ``tokenizer_path`` downloads the prefix's files other than weights, with boto3, into the job's cache.

``check_model`` runs on the driver before Ray starts, so that a wrong path or a missing permission is
one clear error instead of an engine actor that Ray restarts over and over.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from icebatch.core.consumers import Consumer
from icebatch.core.errors import ModelUnavailableError, TransientError
from icebatch.core.settings import Settings
from icebatch.core.untrusted import summarize

from icebatch_job.process.runtime import is_remote_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
MODEL_KINDS = (
    "a local model folder, an s3:// prefix holding config.json, the tokenizer and *.safetensors, or a Hugging Face id"
)
MODEL_FIX = f"Set ICEBATCH_MODEL_SOURCE to {MODEL_KINDS}; or unset it to use the tiny local model"


def model_fix(settings: Settings, consumer: Consumer | None) -> str:
    """What to change when the model cannot be read: the consumer's own ``model:`` where it names one, else the
    deployment's setting."""
    if consumer is None or not consumer.model:
        return MODEL_FIX
    where = settings.launch.consumers_file or "the consumers file"
    return (
        f"Fix the `model:` of consumer {consumer.name!r} in {where} ({MODEL_KINDS}), or remove it to use "
        "ICEBATCH_MODEL_SOURCE's"
    )


def resolve_model(settings: Settings, consumer: Consumer | None = None) -> str:
    """The consumer's model, else the deployment's (checked), else the tiny local model (built on first use)."""
    source = consumer.model_source(settings) if consumer else settings.engine.model_source
    if source:
        check_model(settings, source, fix=model_fix(settings, consumer))
        return source
    from icebatch_job.example.tiny_model import build_tiny_model

    return str(build_tiny_model(settings.tiny_model_dir))


def check_model(settings: Settings, source: str, *, fix: str = MODEL_FIX) -> None:
    """Fail fast, with the fix (``model_fix``: where the model is named), when the model cannot be read from where
    it is said to be."""
    if source.startswith("s3://"):
        _check_s3_model(settings, source, fix)
    elif not is_remote_model(source):
        if not (Path(source) / "config.json").is_file():
            raise ModelUnavailableError(f"model {source!r} is not a model folder (no config.json). {fix}")
    elif not source.startswith(("gs://", "hf://")):
        _check_hub_model(settings, source, fix)


def hub_access(settings: Settings) -> tuple[Path, bool, str | None]:
    """How the job's processes reach Hugging Face models: the cache (``HF_HOME``, as ``job_environment`` sets
    it, unless set already), whether the cache only (``HF_HUB_OFFLINE``), and a mirror (``HF_ENDPOINT``).
    These are Hugging Face's own variables, read as its libraries read them, not icebatch settings."""
    environ = os.environ  # noqa: TID251
    cache = Path(environ.get("HF_HOME") or settings.home / "cache" / "huggingface") / "hub"
    offline = environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    return cache, offline, environ.get("HF_ENDPOINT") or None


def _check_hub_model(settings: Settings, source: str, fix: str) -> None:
    """A hub id's config.json, from the cache or the hub (``HF_HUB_OFFLINE``: the cache only), as the engine
    will load it; the engine actor would otherwise fail at its start with a page of traceback."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    cache, offline, endpoint = hub_access(settings)
    try:
        hf_hub_download(
            source, "config.json", cache_dir=cache, local_files_only=offline, endpoint=endpoint, etag_timeout=10
        )
    except HFValidationError as e:
        raise ModelUnavailableError(f"model {summarize(source, 100)!r} is not a Hugging Face id. {fix}") from e
    except RepositoryNotFoundError as e:  # a gated one too (401/403): the token is what is missing
        raise ModelUnavailableError(
            f"model {source!r} is not on the Hugging Face hub, or it needs a token the job does not have (HF_TOKEN). "
            f"{fix}"
        ) from e
    except LocalEntryNotFoundError as e:
        if offline:
            raise ModelUnavailableError(
                f"model {source!r} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set: download it "
                f"there first, or unset HF_HUB_OFFLINE. {fix}"
            ) from e
        raise TransientError(
            f"could not reach the Hugging Face hub for model {source!r} (and it is not in the cache, {cache}): retry "
            "later, or give the job a copy it can reach (a local folder or an s3:// prefix)"
        ) from e
    except EntryNotFoundError as e:
        raise ModelUnavailableError(f"model {source!r} has no config.json on the hub. {fix}") from e
    except HfHubHTTPError as e:
        why = summarize(str(e), 200)
        raise TransientError(f"the Hugging Face hub did not answer for model {source!r}: {why}") from e


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> (``bucket``, ``a/b/``): the bucket and the prefix of the files under it."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix.rstrip("/") + "/" if prefix else ""


def prefix_files(s3: Any, bucket: str, prefix: str) -> dict[str, list[Any]]:
    """The files directly under ``prefix`` (not its sub-prefixes, nor names that are not plain file names), with
    what S3 says of each: name -> [size, ETag]."""
    files: dict[str, list[Any]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        for item in page.get("Contents", []):
            name = item["Key"][len(prefix) :]
            if name not in ("", ".", "..") and "/" not in name:
                files[name] = [item["Size"], item["ETag"]]
    return files


def _check_s3_model(settings: Settings, source: str, fix: str) -> None:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split_s3(source)
    s3 = boto3.client("s3", region_name=settings.aws.aws_region, endpoint_url=settings.aws.aws_endpoint_url)
    try:
        s3.head_object(Bucket=bucket, Key=prefix + "config.json")
    except ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        if code in {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}:
            raise ModelUnavailableError(f"no config.json under {source} ({code}). {fix}") from e
        if code in {"403", "AccessDenied", "Forbidden"}:
            raise ModelUnavailableError(
                f"the job may not read {source} ({code}): grant its role s3:GetObject on the prefix and "
                "s3:ListBucket on the bucket for it (template.yaml: JobRole)"
            ) from e
        raise TransientError(f"could not check the model at {source} ({code})") from e
    except BotoCoreError as e:
        raise TransientError(f"could not reach S3 to check the model at {source}: {e}") from e


WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")  # what the tokenizer never needs


def tokenizer_path(source: str) -> str:
    """A local folder holding the model's tokenizer: ``source`` itself, or for an ``s3://`` prefix a copy of
    its files other than weights (config, tokenizer, chat template), downloaded once into the job's cache.

    The S3 client is boto3's, configured from the job's environment as every other (region, and
    ``AWS_ENDPOINT_URL_S3`` where the deployment points S3 elsewhere).
    """
    if not source.startswith("s3://"):
        return source
    import hashlib

    environ = os.environ  # noqa: TID251  # the caches job_environment set for the job's processes, Ray's workers too
    cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "icebatch" / "tokenizers"
    local = cache / hashlib.sha256(source.encode()).hexdigest()[:16]
    if not any((local / name).is_file() for name in TOKENIZER_FILES):
        _download_tokenizer(source, local)
    return str(local)


def _download_tokenizer(source: str, local: Path) -> None:
    import shutil
    import tempfile

    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split_s3(source)
    s3 = boto3.client("s3")
    local.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{local.name}-", dir=local.parent))
    fix = "check the prefix and that the job's role may s3:GetObject and s3:ListBucket it (template.yaml: JobRole)"
    try:
        for name in prefix_files(s3, bucket, prefix):
            if not name.endswith(WEIGHTS):
                s3.download_file(bucket, prefix + name, str(partial / name))
        if not any((partial / name).is_file() for name in TOKENIZER_FILES):
            raise ModelUnavailableError(f"no tokenizer under {source} (none of {', '.join(TOKENIZER_FILES)}): {fix}")
        try:
            partial.rename(local)  # whole or not at all
        except OSError:  # another stage's copy came first
            if not any((local / name).is_file() for name in TOKENIZER_FILES):
                raise
    except ClientError as e:
        raise ModelUnavailableError(f"could not download the tokenizer of {source} ({e}): {fix}") from e
    except BotoCoreError as e:
        raise TransientError(f"could not reach S3 for the tokenizer of {source}: {e}") from e
    finally:
        shutil.rmtree(partial, ignore_errors=True)
