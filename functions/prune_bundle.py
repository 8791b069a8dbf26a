"""Shrink the Lambda bundle after `pip install -t DIR -r requirements.txt` (called by functions/Makefile).

- boto3, botocore, s3transfer: the Lambda Python runtime provides them (icebatch's control plane has no
  library that pins botocore, see icebatch.core.metadata_io).
- kubernetes/aio: the asyncio client, a 41 MB copy of the API that icebatch does not use.
- hive_metastore (pyiceberg's vendored Hive client) and pygments (rich's highlighter, used by pyiceberg's
  CLI only): never imported on the Lambda path (tests/functional/test_bundle.py runs a decision from a
  pruned bundle).
- kubernetes' generated API and model modules (about 3,000, all imported by ``kubernetes.client``) are
  shipped as sourceless bytecode without docstrings (``compileall -b -o 2``): 57 MB -> 14 MB.
- debug symbols of native extensions (`strip --strip-unneeded`, when available).

Compiled bytecode (__pycache__) stays: /var/task is read-only, so without it every cold start would
compile the sources again.

    python prune_bundle.py DIR
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

RUNTIME_PROVIDED = ("boto3", "botocore", "s3transfer")
UNUSED = ("kubernetes/aio", "hive_metastore", "pygments")
SOURCELESS = ("kubernetes/client/api", "kubernetes/client/models")


def prune(root: Path) -> int:
    """Prune ``root`` in place; returns the bytes saved."""
    before = size(root)
    for name in RUNTIME_PROVIDED:
        shutil.rmtree(root / name, ignore_errors=True)
        for info in root.glob(f"{name}-*.dist-info"):
            shutil.rmtree(info, ignore_errors=True)
    for rel in UNUSED:
        shutil.rmtree(root / rel, ignore_errors=True)
        for info in root.glob(f"{rel}-*.dist-info"):
            shutil.rmtree(info, ignore_errors=True)
    if sys.version_info[:2] == (3, 11):  # bytecode must match the Lambda runtime (python3.11)
        for rel in SOURCELESS:
            sourceless(root / rel)
    else:
        print(f"keeping {SOURCELESS} as sources: building with Python {sys.version_info[:2]}, not 3.11")
    strip = shutil.which("strip")
    if strip:
        for lib in root.rglob("*.so*"):
            if lib.is_file() and not lib.is_symlink():
                strip_copy(strip, lib)
    return before - size(root)


def strip_copy(strip: str, lib: Path) -> None:
    """Strip a private copy, then replace the file atomically.

    Installers hard-link files from their cache (uv does by default): stripping in place would rewrite
    the shared inode under every environment, and under every process that has the library mapped.
    """
    tmp = lib.with_name(lib.name + ".stripping")
    shutil.copy2(lib, tmp)
    done = subprocess.run([strip, "--strip-unneeded", str(tmp)], check=False, capture_output=True)
    if done.returncode == 0:
        tmp.replace(lib)
    else:
        tmp.unlink(missing_ok=True)


def sourceless(folder: Path) -> None:
    import compileall

    if not folder.is_dir():
        return
    if not compileall.compile_dir(str(folder), legacy=True, optimize=2, quiet=1):
        raise SystemExit(f"could not compile {folder}")
    for source in folder.rglob("*.py"):
        source.unlink()
    for cache in list(folder.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)


def size(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())


if __name__ == "__main__":
    target = Path(sys.argv[1])
    saved = prune(target)
    print(f"pruned {saved / 1e6:.1f} MB; bundle is {size(target) / 1e6:.1f} MB unzipped")
