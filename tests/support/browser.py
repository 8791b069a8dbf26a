"""A real browser for the pages icebatch writes: Debian's Chromium, headless (``make test`` installs it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("no chromium on PATH: `make browser` installs Debian's chromium (make test does it first)")
    return found


def screenshot(page: Path, png: Path, *, width: int = 960, height: int = 1400) -> Path:
    """Render ``page`` (a local file) and save what a reader would see; offline, a fresh profile."""
    profile = png.parent / f"{png.stem}-profile"
    done = subprocess.run(
        [
            chromium(),
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--screenshot={png}",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and png.is_file(), f"chromium could not render {page}: {done.stderr[-2000:]}"
    return png
