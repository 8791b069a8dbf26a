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


_RECORDER = """
import sys
from icebatch_job.process.shared_memory import record_shared_memory
record = record_shared_memory()
with open(record, "a") as f:
    f.write(sys.argv[1] + "\\n")
print(record, flush=True)
sys.stdin.read()  # lives until its stdin closes
"""


def test_a_record_is_swept_once_no_process_holds_it_and_never_before(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from icebatch_job.process.shared_memory import sweep_abandoned_records

    # given a job's process that recorded a segment it created, and lives
    name = f"psm_test_{uuid.uuid4().hex[:8]}"
    (SHM / name).write_bytes(b"x")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    job = subprocess.Popen(
        [sys.executable, "-c", _RECORDER, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert job.stdout is not None
        record = Path(job.stdout.readline().strip())
        assert record.parent == tmp_path and record.exists()
        # when another job sweeps, then a record its job still holds is left alone
        assert sweep_abandoned_records(tmp_path) == []
        assert (SHM / name).exists() and record.exists()
    finally:
        # when the job is killed without notice (nothing of it unlinks anything)
        job.kill()
        job.wait(30)
    # then the next sweep unlinks what it recorded, and the record
    assert sweep_abandoned_records(tmp_path) == [name]
    assert not (SHM / name).exists() and not record.exists()
