"""Launcher weight: unzipped size of the Lambda bundle and the launcher's cold import time.

Installs functions/requirements.txt into a scratch folder (as `sam build` does), prunes it with
functions/prune_bundle.py, then imports the launcher's whole decision path (handler, ledger, Glue
catalog, metadata FileIO, kubernetes client, EKS auth) in fresh interpreters, against importing boto3
alone, in the same run. Targets: bundle < 100 MB, import < 1 s here.

    python -m bench.launcher_weight [--runs 7]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import median, table, write

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER_IMPORTS = (
    "import icebatch.control.handlers.launcher, icebatch.control.launcher, icebatch.control.triggers, "
    "icebatch.core.ledger, icebatch.core.metadata_io, icebatch.control.backends.kuberay, "
    "icebatch.control.backends.eks_auth, kubernetes.client, pyiceberg.catalog.glue"
)


def uv() -> str:
    found = shutil.which("uv") or next(iter(sorted(Path.home().glob(".cache/icebatch/uv-*/bin/uv"))), None)
    if not found:
        raise SystemExit("uv not found: run `make env` first")
    return str(found)


def timed_import(statement: str, paths: list[Path], runs: int) -> list[float]:
    code = (
        "import sys, time; sys.path[:0] = sys.argv[1:]; t = time.perf_counter(); "
        f"{statement}; print(time.perf_counter() - t)"
    )
    samples = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-I", "-c", code, *map(str, paths)],
            capture_output=True,
            text=True,
            env={"POWERTOOLS_TRACE_DISABLED": "false", "AWS_DEFAULT_REGION": "us-east-1"},
        )
        if out.returncode != 0:
            raise SystemExit(out.stderr[-2000:])
        samples.append(float(out.stdout.strip().splitlines()[-1]))
    return samples


def _install(target: Path, *requirements: str) -> None:
    subprocess.run(
        [
            uv(),
            "pip",
            "install",
            "-q",
            "--compile-bytecode",
            "--link-mode=copy",
            "--target",
            str(target),
            "--python-version",
            "3.11",
            "--python-platform",
            "x86_64-manylinux_2_28",
            *requirements,
        ],
        check=True,
    )


def build_bundle(work: Path) -> tuple[Path, Path, int]:
    """(the bundle `sam build` makes, runtime-provided packages, closure bytes), with the real recipe.

    The bundle is built by functions/Makefile's own target (what `sam build` runs); boto3 and its
    dependencies, which the Lambda runtime provides and the recipe prunes, are installed beside it so
    that imports find them; the closure is the requirements installed unpruned, for comparison.
    """
    sys.path.insert(0, str(ROOT / "functions"))
    from prune_bundle import size  # type: ignore[import-not-found]

    bundle, runtime, closure = work / "bundle", work / "runtime", work / "closure"
    python = shutil.which("python3.11") or sys.executable
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(ROOT / "functions"),
            "build-LauncherFunction",
            f"ARTIFACTS_DIR={bundle}",
            f"PYTHON={python}",
            f"UV={uv()}",
        ],
        check=True,
        capture_output=True,
    )
    _install(runtime, "boto3")
    _install(closure, "-r", str(ROOT / "functions/requirements.txt"))
    return bundle, runtime, size(closure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icebatch-bundle-"))
    bundle, runtime, full = build_bundle(work)
    from prune_bundle import size  # type: ignore[import-not-found]

    deployable = size(bundle)
    launcher = timed_import(LAUNCHER_IMPORTS, [bundle, runtime], args.runs)
    boto = timed_import("import boto3", [runtime, bundle], args.runs)
    ratio = median(launcher) / median(boto)
    result = {
        "closure_bytes": full,
        "bundle_bytes": deployable,
        "import_seconds": {"launcher": launcher, "boto3": boto},
        "median_import_seconds": {"launcher": median(launcher), "boto3": median(boto)},
        "import_ratio_launcher_over_boto3": ratio,
        "targets": {"bundle_mb": 100, "import_s": 1.0},
    }
    path = write("launcher_weight", result)
    print(
        table(
            [
                ("measure", "value", "target"),
                ("dependency closure (pip -t)", f"{full / 1e6:.1f} MB", ""),
                ("deployable bundle (pruned)", f"{deployable / 1e6:.1f} MB", "< 100 MB"),
                ("cold import, launcher path", f"{median(launcher):.2f} s (median of {args.runs})", "< 1 s"),
                ("cold import, boto3 alone", f"{median(boto):.2f} s", ""),
                ("ratio launcher / boto3", f"{ratio:.1f}x", ""),
            ]
        )
    )
    print(f"\nwritten: {path}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
