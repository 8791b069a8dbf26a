"""icebatch as a package: the wheel, installed into a fresh virtualenv outside the repository, runs.

The repository's own runs import its folders (PYTHONPATH, the editable install); a user's `pip install`
has only the wheel. Built here as a user's build would (PEP 517, isolated), installed with its declared
dependencies (from the local package cache: no network), and run from a folder outside the clone with no
PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from icebatch import __version__

pytestmark = pytest.mark.functional
ROOT = Path(__file__).resolve().parents[2]

LOADS = """
import icebatch, icebatch.control.gate, icebatch.core.ledger, icebatch.tools.cli
from icebatch.core.consumers import load_consumers
from icebatch.core.settings import Settings
consumers = load_consumers(Settings())
print(icebatch.__file__)
print(",".join(f"{c.name}:{c.task.name}" for c in consumers))
"""


def test_the_wheel_installs_and_runs_outside_the_repository(tmp_path: Path) -> None:
    from bench.launcher_weight import uv

    # given the wheel a user's build makes
    built = subprocess.run(
        [uv(), "build", "--wheel", "-o", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = (tmp_path / "dist").glob("icebatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # then it holds every package of both source folders, the default consumers and their tasks, the license
    packages = {
        str(p.parent.relative_to(src))
        for src in (ROOT / "functions", ROOT / "jobimage")
        for p in src.rglob("__init__.py")
        if p.parent.name != "__pycache__"
    }
    assert packages and all(f"{p}/__init__.py" in names for p in packages), sorted(packages)
    assert {
        "icebatch/consumers/consumers.yaml",
        "icebatch/consumers/tasks/triage.json",
        "icebatch/consumers/schemas/task.schema.json",
        "icebatch/consumers/schemas/consumers.schema.json",
        "icebatch/__main__.py",
    } <= set(names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # when it is installed into a fresh virtualenv outside the repository, with its dependencies
    venv = tmp_path / "user-venv"
    subprocess.run([uv(), "venv", "-q", "-p", "3.11", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        # the locked versions: their wheels are in the package cache since `make env`; the resolver may still ask
        # PyPI for metadata the cache lacks (a fresh machine's cache holds the wheels of `uv pip sync` only)
        [
            uv(),
            "pip",
            "install",
            "-q",
            "-p",
            str(venv / "bin" / "python"),
            str(wheel),
            "-c",
            str(ROOT / "requirements" / "dev.lock"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("ICEBATCH_")}
    env["ICEBATCH_HOME"] = str(tmp_path / "home")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(*argv: str) -> str:
        done = subprocess.run(list(argv), cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        return done.stdout.strip()

    # then the command and `python -m icebatch` answer with the version, and the installed package (not this
    # clone) loads its default consumers and their tasks
    assert run(str(venv / "bin" / "icebatch"), "--version") == f"icebatch {__version__}"
    assert run(str(venv / "bin" / "python"), "-m", "icebatch", "--version") == f"icebatch {__version__}"
    location, consumers = run(str(venv / "bin" / "python"), "-c", LOADS).splitlines()
    assert location.startswith(str(venv)), location
    assert consumers == "triage:ticket-triage,privacy:ticket-privacy"
    assert "usage: icebatch" in run(str(venv / "bin" / "icebatch"), "--help")
    # and a command that needs an extra the base install lacks says which, in one line, exit 2, and leaves nothing
    # behind (no home, no project folder: a left .icebatch/ would make every folder below it a project)
    project = tmp_path / "project"
    project.mkdir()
    for argv in (["init", "shop.reviews"], ["launch", "--dry-run"]):
        done = subprocess.run(
            [str(venv / "bin" / "icebatch"), *argv], cwd=project, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (argv, done.stderr[-2000:])
        assert "pip install 'icebatch[" in done.stderr, done.stderr
        assert list(project.iterdir()) == [] and not Path(env["ICEBATCH_HOME"]).exists(), argv


def test_the_package_version_is_the_projects() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License") and project["license"] == "Apache-2.0"
