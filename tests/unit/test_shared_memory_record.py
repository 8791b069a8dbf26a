"""The job's record of the shared memory its processes create (process/shared_memory.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from icebatch_job.process.shared_memory import SHM, unlink_recorded_shared_memory

pytestmark = pytest.mark.unit


def test_only_recorded_names_still_in_dev_shm_are_unlinked_never_a_path(tmp_path: Path) -> None:
    # given a record naming one segment still there, one already gone, and lines that are paths, not names
    mine = f"psm_test_{uuid.uuid4().hex[:8]}"
    (SHM / mine).write_bytes(b"x")
    outside = tmp_path / "keep"
    outside.write_text("keep")
    record = tmp_path / "record.names"
    record.write_text(f"{mine}\npsm_gone_{uuid.uuid4().hex[:8]}\n..\n.\n../{outside}\n{outside}\n/etc/passwd\n")
    # when the job unlinks what its processes left, then only that segment goes, and the record with it
    assert unlink_recorded_shared_memory(record) == [mine]
    assert not (SHM / mine).exists() and outside.read_text() == "keep" and SHM.is_dir()
    assert not record.exists()
    # and a record that is gone is nothing to do
    assert unlink_recorded_shared_memory(record) == []
