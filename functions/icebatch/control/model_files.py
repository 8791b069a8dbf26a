"""The model's own small files, read where the engine will read them, so that the launcher can size it
(``icebatch.core.costs.sizing``) before it buys a GPU node: a local folder, or an ``s3://`` prefix (the launcher's
role may read ``config.json`` and ``model.safetensors.index.json`` there, nothing else). A Hugging Face id
is not read here (the engine's node downloads it): such a model is not sized in advance."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from icebatch.core.aws_clients import aws_client
from icebatch.core.consumers import Consumer
from icebatch.core.costs.sizing import ReadJson, gpu_memory_problem, model_size
from icebatch.core.settings import Settings

log = logging.getLogger(__name__)
MAX_BYTES = 4 * 1024 * 1024  # a config or an index is a few KB; a file this big is not one


def model_files(settings: Settings, source: str) -> ReadJson | None:
    """A reader of the model's JSON files (None: a source this does not read)."""
    if source.startswith("s3://"):
        bucket, _, prefix = source.removeprefix("s3://").partition("/")
        s3 = aws_client("s3", settings)

        def from_s3(name: str) -> dict[str, Any] | None:
            from botocore.exceptions import ClientError

            try:
                body = s3.get_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/{name}".lstrip("/"))["Body"]
            except ClientError as e:
                code = e.response.get("Error", {}).get("Code", "")
                # S3 answers 403, not 404, for a missing key to a role that may not list the bucket: a
                # single-file model has no index
                if code in ("NoSuchKey", "404") or (code in ("AccessDenied", "403") and name != "config.json"):
                    return None
                raise
            return _json(body.read(MAX_BYTES + 1), f"{source.rstrip('/')}/{name}")

        return from_s3
    if source.startswith(("/", ".")):
        folder = Path(source)

        def from_folder(name: str) -> dict[str, Any] | None:
            path = folder / name
            return _json(path.read_bytes()[: MAX_BYTES + 1], str(path)) if path.is_file() else None

        return from_folder
    return None


def _json(data: bytes, where: str) -> dict[str, Any] | None:
    if len(data) > MAX_BYTES:
        log.warning("%s is over %d bytes: not read to size the model", where, MAX_BYTES)
        return None
    value = json.loads(data)
    return value if isinstance(value, dict) else None


def model_problem(consumer: Consumer, settings: Settings) -> str | None:
    """Why the consumer's model cannot run on the deployment's GPU worker (kuberay only), or None.

    A model that cannot be read (a hub id, a file missing, no permission) is not refused here: the job says
    what is wrong with it when it starts (``icebatch validate`` checks it ahead)."""
    source = consumer.model_source(settings)
    if settings.top.backend != "kuberay" or not source or (read := model_files(settings, source)) is None:
        return None
    try:
        size = model_size(read, settings.engine.dtype)
    except Exception as e:  # a permission, a malformed file: not sized, and said once
        log.warning("model %s not sized (%s: %s): the job will find out", source, type(e).__name__, str(e)[:200])
        return None
    problem = gpu_memory_problem(settings, size, source) if size else None
    return f"consumer {consumer.name!r}: {problem}" if problem else None
