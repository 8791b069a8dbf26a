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
    "import icebatch.handlers.launcher, icebatch.launcher, icebatch.triggers, icebatch.ledger, "
    "icebatch.metadata_io, icebatch.backends.kuberay, icebatch.backends.eks_auth, kubernetes.client, "
    "pyiceberg.catalog.glue"
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


def build_bundle(work: Path) -> tuple[Path, Path, int]:
    """(pruned bundle with icebatch, runtime-provided packages, closure bytes), as `sam build` would."""
    sys.path.insert(0, str(ROOT / "functions"))
    from prune_bundle import prune, size  # type: ignore[import-not-found]

    bundle, runtime = work / "bundle", work / "runtime"
    subprocess.run(
        [
            uv(),
            "pip",
            "install",
            "-q",
            "--compile-bytecode",
            "--link-mode=copy",
            "--target",
            str(bundle),
            "-r",
            str(ROOT / "functions/requirements.txt"),
            "--python-version",
            "3.11",
            "--python-platform",
            "x86_64-manylinux_2_28",
        ],
        check=True,
    )
    full = size(bundle)
    # what the Lambda runtime provides, kept aside so that imports still find it
    runtime.mkdir()
    for entry in bundle.iterdir():
        if entry.name.split("-")[0] in (
            "boto3",
            "botocore",
            "s3transfer",
            "jmespath",
            "dateutil",
            "six.py",
            "python_dateutil",
            "urllib3",
        ):
            shutil.copytree(entry, runtime / entry.name) if entry.is_dir() else shutil.copy2(entry, runtime)
    prune(bundle)
    shutil.copytree(ROOT / "functions" / "icebatch", bundle / "icebatch", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(bundle / "icebatch")], check=True)
    return bundle, runtime, full


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
    print(table([
        ("measure", "value", "target"),
        ("dependency closure (pip -t)", f"{full / 1e6:.1f} MB", ""),
        ("deployable bundle (pruned)", f"{deployable / 1e6:.1f} MB", "< 100 MB"),
        ("cold import, launcher path", f"{median(launcher):.2f} s (median of {args.runs})", "< 1 s"),
        ("cold import, boto3 alone", f"{median(boto):.2f} s", ""),
        ("ratio launcher / boto3", f"{ratio:.1f}x", ""),
    ]))  # fmt: skip
    print(f"\nwritten: {path}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
