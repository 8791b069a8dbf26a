"""Ray's temp dir under the home, reached through a short link in /tmp when the home is deep: the links of homes
that are gone do not pile up there."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from icebatch.core.settings import Settings
from icebatch_job.local.ray_instance import ray_temp_dir

pytestmark = pytest.mark.unit


def test_a_deep_home_gets_a_short_link_and_the_links_of_removed_homes_are_cleaned(tmp_path: Path) -> None:
    # given a link left in /tmp by a home that was removed since, and one of a home that still exists
    gone, alive = tmp_path / "gone", tmp_path / "alive"
    alive.mkdir()
    dangling = Path("/tmp") / f"icebatch-ray-test{uuid.uuid4().hex[:8]}"
    live = Path("/tmp") / f"icebatch-ray-test{uuid.uuid4().hex[:8]}"
    dangling.symlink_to(gone, target_is_directory=True)
    live.symlink_to(alive, target_is_directory=True)
    try:
        # when a job with a deep home asks for Ray's temp dir
        home = tmp_path / ("deep-" * 10) / "home"
        temp = Path(ray_temp_dir(Settings(home=home)))
        # then it is a short link to the home's own folder, and only the dangling link is gone
        assert len(str(temp)) < 40 and temp.resolve() == (home / "ray").resolve()
        assert not dangling.is_symlink() and live.is_symlink()
    finally:
        for link in (dangling, live):
            link.unlink(missing_ok=True)
