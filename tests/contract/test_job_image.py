"""jobimage/Dockerfile, read as Docker would build it (there is no Docker engine here to build it)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from icebatch.control.rayjob import RAY_VERSION

pytestmark = pytest.mark.contract
ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "jobimage" / "Dockerfile").read_text()
REQUIREMENTS = ROOT / "jobimage" / "requirements.txt"


def _run_lines() -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line.strip() for line in joined.splitlines() if line.strip().startswith("RUN ")]


def test_the_base_image_is_a_published_ray_llm_tag_of_the_pinned_ray() -> None:
    # ray-llm images exist for Python 3.12 only ("<ray>-py312-cu<cuda>"): a py311 tag does not pull
    image = re.search(r"^ARG RAY_IMAGE=(\S+)$", DOCKERFILE, flags=re.M)
    assert image is not None
    m = re.fullmatch(r"rayproject/ray-llm:(?P<ray>[0-9.]+)-py(?P<py>3\d+)-cu(?P<cuda>\d+)", image.group(1))
    assert m is not None, image.group(1)
    assert (m["ray"], m["py"]) == (RAY_VERSION, "312")
    pinned = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert f"ray[data,llm]=={RAY_VERSION}" in pinned


def test_installs_are_constrained_by_the_base_images_own_freeze() -> None:
    runs = " ".join(_run_lines())
    freeze = re.search(r"pip freeze[^>]*> (\S+)", runs)
    assert freeze is not None, "the base image's packages must be frozen first"
    installs = re.findall(r"pip install ([^&]+)", runs)
    assert installs, runs
    for args in installs:
        assert f"-c {freeze.group(1)}" in args or "--no-deps" in args, f"unconstrained: pip install {args}"
    assert (
        "-r requirements.txt" in runs
        and "COPY --chown=ray:users jobimage/requirements.txt ./requirements.txt" in DOCKERFILE
    )


def test_the_image_carries_the_core_and_the_data_plane_only() -> None:
    copied = re.findall(r"^COPY --chown=\S+ (.+) \S+$", DOCKERFILE, flags=re.M)
    sources = [src for line in copied for src in line.split()]
    assert "functions/icebatch/core" in sources and "jobimage/icebatch_job" in sources
    assert not any(
        src.startswith(("functions/icebatch/control", "functions/icebatch/tools", "functions/icebatch/consumers"))
        for src in sources
    )
    assert "functions/icebatch" not in sources  # not the whole package


def test_the_job_images_requirements_match_the_project() -> None:
    lines = [line.split("#")[0].strip() for line in REQUIREMENTS.read_text().splitlines()]
    requirements = [line for line in lines if line]
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pyiceberg = next(d for d in deps["optional-dependencies"]["job"] if d.startswith("pyiceberg["))
    assert pyiceberg.split("==")[1] == next(r for r in requirements if r.startswith("pyiceberg[")).split("==")[1]
    # ICEBATCH_MODEL_LOAD_FORMAT=runai_streamer needs the streamer with S3 support
    assert any(r.startswith("runai-model-streamer[s3]") for r in requirements)


def test_the_image_requires_a_pyarrow_that_reaches_the_pod_identity_agent() -> None:
    from packaging.requirements import Requirement
    from packaging.version import Version

    # given the image's requirements (installed constrained by the base image: an older pyarrow fails the build)
    lines = [line.split("#")[0].strip() for line in REQUIREMENTS.read_text().splitlines()]
    pyarrow = next(Requirement(r) for r in lines if r.startswith("pyarrow"))
    # then no pyarrow before 21 (AWS SDK for C++ 1.10: no EKS Pod Identity) is accepted, and the one the tests run
    # with (the lock's, tests/functional/test_pod_identity.py) is
    assert not pyarrow.specifier.contains(Version("20.0.0")) and pyarrow.specifier.contains(Version("21.0.0"))
    locked = re.search(r"^pyarrow==(\S+)$", (ROOT / "requirements" / "dev.lock").read_text(), flags=re.M)
    assert locked is not None and pyarrow.specifier.contains(Version(locked.group(1)))


@pytest.mark.skipif(
    shutil.which("uv") is None and not list(Path.home().glob(".cache/icebatch/uv-*/bin/uv")), reason="no uv"
)
def test_the_requirements_install_into_a_ray_llm_environment_without_moving_anything(tmp_path: Path) -> None:
    # given an environment with Ray 2.60 and vLLM 0.29 (this venv: the CPU build) frozen as the base image is
    uv = shutil.which("uv") or str(next(iter(Path.home().glob(".cache/icebatch/uv-*/bin/uv"))))
    freeze = subprocess.run([uv, "pip", "freeze", "-p", sys.executable], capture_output=True, text=True, check=True)
    base = tmp_path / "base-image.txt"
    base.write_text(
        "\n".join(line for line in freeze.stdout.splitlines() if " @ " not in line and not line.startswith("-e"))
    )
    # when the image's install runs against it (dry run)
    done = subprocess.run(
        [
            uv,
            "pip",
            "install",
            "--dry-run",
            "--offline",
            "-p",
            sys.executable,
            "-c",
            str(base),
            "-r",
            str(REQUIREMENTS),
        ],
        capture_output=True,
        text=True,
    )
    # then it resolves, and replaces nothing that is installed
    assert done.returncode == 0, done.stderr
    assert not re.search(r"^ - ", done.stderr + done.stdout, flags=re.M), done.stderr
