"""With ``nvme_streamer``, the job makes sure the engine's nodes hold the model's copy before the engine starts
(``model_copy.engine_model``): in a task pinned to each GPU node, or on this machine when the engine runs here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from icebatch_job.stages.model_copy import copy_folder

from tests.support.aws import CREDS, REGION, client

pytestmark = [pytest.mark.engine]

# a Ray instance as the local backend starts one, its node advertising GPUs or not, and the job's asks of it
ASK = """
import json, sys
import ray
from icebatch.core.errors import IcebatchError
from icebatch.core.settings import Settings
from icebatch_job.local.ray_instance import start_local_ray
from icebatch_job.stages.model_copy import engine_model

settings = Settings.from_env()
start_local_ray(settings, num_cpus=2, num_gpus=int(sys.argv[1]))
answers = []
for model in sys.argv[3:]:
    try:
        answers.append(engine_model(settings, model, sys.argv[2]))
    except IcebatchError as e:
        answers.append(f"{type(e).__name__}: {e}")
ray.shutdown()
print(json.dumps(answers))
"""


@pytest.fixture
def model(aws_endpoint: str) -> str:
    bucket = f"models-{uuid.uuid4().hex[:10]}"
    s3 = client("s3", aws_endpoint)
    s3.create_bucket(Bucket=bucket)
    for name, body in {"config.json": b"{}", "tokenizer.json": b"{}", "model.safetensors": b"w" * 1000}.items():
        s3.put_object(Bucket=bucket, Key=f"llama/{name}", Body=body)
    return f"s3://{bucket}/llama/"


def ask(tmp_path: Path, aws_endpoint: str, gpus: int, device: str, *models: str) -> list[str]:
    env = {
        "ICEBATCH_HOME": str(tmp_path / "home"),
        "ICEBATCH_MODEL_LOAD_FORMAT": "nvme_streamer",
        "AWS_ENDPOINT_URL_S3": aws_endpoint,
        "AWS_DEFAULT_REGION": REGION,
        **CREDS,
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ["PYTHONPATH"],
        "HF_HUB_OFFLINE": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", ASK, str(gpus), device, *models],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return answers


def test_each_gpu_node_copies_the_model_and_says_what_stops_it(tmp_path: Path, aws_endpoint: str, model: str) -> None:
    # given a Ray cluster whose node has a GPU (this machine, advertising one), and a prefix holding no model
    missing = model.replace("/llama/", "/nothing/")
    # when the job asks for the engine's model, each
    copied, refused = ask(tmp_path, aws_endpoint, 1, "gpu", model, missing)
    # then the GPU node copied it to its cache (its home: the job's), and the engine gets that folder
    assert Path(copied) == copy_folder(tmp_path / "home", model) and (Path(copied) / "model.safetensors").is_file()
    # and a model the node cannot copy is the job's error, said as the node said it (not a task's traceback)
    assert refused.startswith("ModelUnavailableError: on a GPU node: no *.safetensors under"), refused


def test_without_gpu_nodes_the_copy_is_this_machines_or_a_clear_refusal(
    tmp_path: Path, aws_endpoint: str, model: str
) -> None:
    # given a cluster of CPU nodes: the engine runs on this machine's CPU, and the copy is made here
    [here] = ask(tmp_path, aws_endpoint, 0, "cpu", model)
    assert Path(here) == copy_folder(tmp_path / "home", model)
    # and for a GPU engine whose nodes are not there (an autoscaler would start them), the setting to change
    [refused] = ask(tmp_path, aws_endpoint, 0, "gpu", model)
    assert refused.startswith("ConfigError:") and "ICEBATCH_MODEL_LOAD_FORMAT=download or runai_streamer" in refused
