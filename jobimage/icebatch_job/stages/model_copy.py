"""An ``s3://`` model copied to the engine's node, streamed from there (``ICEBATCH_MODEL_LOAD_FORMAT=nvme_streamer``).

Ray Data LLM downloads a model before its engine starts unless the load format streams (then the engine streams
from S3, every start). Here the copy is the job's: on EKS each GPU worker's init container copies the model to the
worker's NVMe-backed model cache before Ray starts on the node (``python -m icebatch_job copy-model``, overlapping
the head's start and the job's planning); the job then makes sure each GPU node has it (a task pinned to the node:
nothing to do where the init container did it) and hands the engine the local folder, which vLLM's run:ai streamer
loader reads at each engine start (a lingering job's later ranges read the node's disk, not S3). With the engine on
this machine (no GPU node), the job copies it here.

A copy is whole or absent: its files land in a temporary folder renamed into place at the end, beside a record of
the objects it was made from (key, size, ETag); a copy whose record no longer matches the prefix is made anew.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from icebatch.core.errors import ConfigError, ModelUnavailableError, TransientError
from icebatch.core.settings import Settings

from icebatch_job.stages.model import prefix_files, split_s3

log = logging.getLogger(__name__)

RECORD = "objects.json"  # beside the model's folder: what the copy was made from
COPY_TIMEOUT_SECONDS = 3600.0  # the GPU nodes' copies, when no init container made them (~100 GB at 30 MB/s)
FIX = "check the prefix and that the job's role may s3:GetObject and s3:ListBucket it (template.yaml: JobRole)"


def copy_folder(home: Path, source: str) -> Path:
    """Where ``source``'s copy lives under ``home``: ``cache/models/<hash>/<name>`` (the name kept: the engine
    reports it as the model's)."""
    name = source.rstrip("/").rsplit("/", 1)[-1]
    if name in ("", ".", "..") or not name.isprintable():  # no folder name of its own: a plain one
        name = "model"
    return home / "cache" / "models" / hashlib.sha256(source.encode()).hexdigest()[:16] / name


def copy_model(source: str, home: str | Path) -> str:
    """``source``'s files (weights included) in a folder under ``home`` on this node, copied unless the copy there
    was made from the objects the prefix holds now: the folder's path."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    folder = copy_folder(Path(home), source)
    s3 = boto3.client("s3")  # configured from the job's environment (region, AWS_ENDPOINT_URL_S3)
    bucket, prefix = split_s3(source)
    try:
        objects = prefix_files(s3, bucket, prefix)
        if not any(name.endswith(".safetensors") for name in objects):
            raise ModelUnavailableError(
                f"no *.safetensors under {source}: ICEBATCH_MODEL_LOAD_FORMAT=nvme_streamer streams safetensors; "
                f"{FIX}, or set ICEBATCH_MODEL_LOAD_FORMAT=download"
            )
        if _copied_from(folder) == objects:
            return str(folder)
        _copy(s3, bucket, prefix, objects, folder)
    except ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        if code in {"403", "404", "AccessDenied", "Forbidden", "NoSuchBucket", "NoSuchKey", "NotFound"}:
            raise ModelUnavailableError(f"could not copy the model {source} ({e}): {FIX}") from e
        raise TransientError(f"S3 did not give the model {source} ({e}): the next attempt copies it again") from e
    except BotoCoreError as e:
        raise TransientError(f"could not reach S3 to copy the model {source}: {e}") from e
    return str(folder)


def _copied_from(folder: Path) -> Any:
    """What the copy in ``folder`` was made from (``prefix_files``), or None: no copy, or no readable record."""
    try:
        return json.loads((folder.parent / RECORD).read_text()) if folder.is_dir() else None
    except (OSError, ValueError):
        return None


def _copy(s3: Any, bucket: str, prefix: str, objects: dict[str, list[Any]], folder: Path) -> None:
    from boto3.s3.transfer import TransferConfig

    # parts fetched side by side: one stream from S3 is far slower than the node's network or its NVMe
    transfer = TransferConfig(max_concurrency=16, multipart_chunksize=32 * 2**20)
    top = folder.parent
    top.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{top.name}-", dir=top.parent))
    started, size = time.monotonic(), sum(entry[0] for entry in objects.values())
    log.info("copying %d files (%.2f GB) of s3://%s/%s to %s", len(objects), size / 1e9, bucket, prefix, folder)
    try:
        (partial / folder.name).mkdir()
        done = 0
        for index, name in enumerate(sorted(objects), 1):
            s3.download_file(bucket, prefix + name, str(partial / folder.name / name), Config=transfer)
            done += objects[name][0]
            log.info("copied %s (%d of %d files, %.2f of %.2f GB)", name, index, len(objects), done / 1e9, size / 1e9)
        (partial / RECORD).write_text(json.dumps(objects, sort_keys=True))
        shutil.rmtree(top, ignore_errors=True)  # a copy of objects the prefix no longer holds
        partial.rename(top)  # whole or not at all
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    seconds = time.monotonic() - started
    log.info("copied the model in %.1f s (%.2f GB/s)", seconds, size / 1e9 / max(seconds, 1e-3))


def engine_model(settings: Settings, model: str, device: str) -> str:
    """The model as the engine is to load it: ``model`` itself, or with ``nvme_streamer`` and an ``s3://`` model, its
    copy on the engine's nodes (made where missing: on each GPU node, else on this machine, where the engine runs)."""
    if settings.engine.model_load_format != "nvme_streamer" or not model.startswith("s3://"):
        return model
    from icebatch_job.process.node_clock import on_gpu_nodes

    answers = on_gpu_nodes(_copy_on_node, model, str(settings.home), timeout=COPY_TIMEOUT_SECONDS)
    if answers is None:
        if device == "gpu":
            raise ConfigError(
                "ICEBATCH_MODEL_LOAD_FORMAT=nvme_streamer copies the model to the GPU nodes the job starts with, and "
                "this Ray cluster has none yet (an autoscaler starts them for the engine): set "
                "ICEBATCH_MODEL_LOAD_FORMAT=download or runai_streamer"
            )
        return copy_model(model, settings.home)
    for answer in answers:
        if "unavailable" in answer:
            raise ModelUnavailableError(f"on a GPU node: {answer['unavailable']}")
        if "transient" in answer:
            raise TransientError(f"on a GPU node: {answer['transient']}")
    copies = {answer["path"] for answer in answers}
    if len(copies) != 1:  # none: the nodes did not answer in time
        raise TransientError(
            f"the GPU nodes did not copy the model {model} within {COPY_TIMEOUT_SECONDS:.0f} s; the next attempt "
            "copies what is missing"
        )
    return copies.pop()


def _copy_on_node(source: str, home: str) -> dict[str, str]:
    """``copy_model`` in a task on a GPU node: ``{"path": ...}``, or what went wrong, said as the job's error (the
    model unavailable, or S3 unreachable) rather than a task's traceback."""
    try:
        return {"path": copy_model(source, home)}
    except ModelUnavailableError as e:
        return {"unavailable": str(e)}
    except TransientError as e:
        return {"transient": str(e)}
