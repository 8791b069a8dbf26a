"""What the job's processes leave in /dev/shm is unlinked once nothing uses it (local/shared_memory.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from icebatch_job.local.shared_memory import SHM, unlink_left_segments

pytestmark = pytest.mark.unit

WRITER = """
import mmap, os, sys
# what multiprocessing's SharedMemory does (shm_open, ftruncate, mmap), without its resource tracker
fd = os.open("/dev/shm/" + sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.ftruncate(fd, 4096)
segment = mmap.mmap(fd, 4096)
print("mapped", flush=True)
sys.stdin.read()  # holds it mapped until its stdin closes
"""


def _segment() -> str:
    return f"psm_test_{uuid.uuid4().hex[:8]}"


def test_a_segment_is_unlinked_once_no_process_maps_it_and_never_before(tmp_path: Path) -> None:
    # given a job that started, then a process (vLLM's queue writer, say) that created a segment and maps it
    since = time.time() - 0.01
    name = _segment()
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "mapped"
        # when the job ends while the segment is in use (another job's live queue): then it stays
        assert name not in unlink_left_segments(since)
        assert (SHM / name).exists()
    finally:
        # when its process is killed without notice (it never unlinks its name)
        writer.kill()
        writer.wait(30)
    # then the job's end unlinks it
    assert name in unlink_left_segments(since)
    assert not (SHM / name).exists()


def test_a_segment_from_before_the_job_or_not_shared_memory_is_left_alone(tmp_path: Path) -> None:
    # given an unmapped segment that was there before the job started, and a file without the segments' prefix
    before = _segment()
    (SHM / before).write_bytes(b"x")
    other = SHM / f"not-psm-{uuid.uuid4().hex[:8]}"
    other.write_bytes(b"x")
    try:
        since = time.time() + 1
        # when the job ends, then neither is touched
        assert unlink_left_segments(since) == []
        assert (SHM / before).exists() and other.exists()
    finally:
        (SHM / before).unlink()
        other.unlink()


LOCKER = """
import multiprocessing, sys
lock = multiprocessing.get_context("spawn").Lock()  # a named semaphore, unlinked by the resource tracker at exit
print(lock._semlock.name, flush=True)
sys.stdin.read()
"""


def test_a_named_semaphore_of_a_tree_killed_with_its_resource_tracker_is_unlinked() -> None:
    # given a job that started, then a process that holds a spawn-context lock (as vLLM's processes do)
    since = time.time() - 0.01
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert locker.stdout is not None
        name = "sem." + locker.stdout.readline().strip().lstrip("/")
        assert (SHM / name).exists()
    finally:
        # when its whole group is killed without notice, multiprocessing's resource tracker included
        os.killpg(locker.pid, signal.SIGKILL)
        locker.wait(30)
    time.sleep(0.5)  # the tracker, killed too, unlinks nothing
    assert (SHM / name).exists()
    # then the job's end unlinks it
    assert name in unlink_left_segments(since)
    assert not (SHM / name).exists()
