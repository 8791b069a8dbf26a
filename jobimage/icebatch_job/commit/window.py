"""The rows a run has at risk: released to the engine and not yet committed, never more than one chunk.

A streaming pipeline runs ahead of its consumer: left alone, Ray Data would read, prompt and infer the
whole range while the job commits the first chunks, and a kill would throw all of that away. So the
pipeline's first stage after the read (the prompt stage, or the endpoint stage) takes a permit per row
from a ``RowWindow`` (a Ray actor) before it works on a batch, and the job gives permits back as it
commits (``ChunkCommitter``): at most ``ICEBATCH_CHUNK_ROWS`` rows are ever between that stage and the
ledger, so a kill redoes at most one chunk. That stage sees blocks of one engine batch each
(``blocks_of``): a Ray Data task hands on its output only when it ends, so a call holding several
batches' worth of rows would wait for permits that only its own rows, once handed on, can bring back.
(The permits are taken inside that stage rather than in a stage of their own: on a small machine each
actor is a process that boots Ray and takes CPU from the engine, and each stage boundary moves every
batch through the object store once more.)

The job commits every ``chunk - in_flight`` rows (``commit_every``; ``chunk_size`` grows the chunk when
more replicas keep more rows in flight), where ``in_flight`` is what the
pipeline needs in hand to keep the engine busy while a commit runs and to fill its batches
(``icebatch_job.stages.pipeline.in_flight_rows``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
import ray.data
from icebatch.core.errors import ConfigError


@ray.remote(num_cpus=0)
class _Permits:
    def __init__(self, rows: int) -> None:
        self.capacity = rows
        self.free = rows
        self.closed = False  # its run failed: no more of its rows go to the engine
        self.changed = asyncio.Condition()

    async def acquire(self, n: int) -> bool:
        async with self.changed:
            # a piece bigger than the window waits for the whole window
            await self.changed.wait_for(lambda: self.closed or self.free >= min(n, self.capacity))
            if self.closed:
                return False
            self.free -= n
            return True

    async def close(self) -> None:
        async with self.changed:
            self.closed = True
            self.changed.notify_all()

    async def release(self, n: int) -> None:
        async with self.changed:
            self.free += n
            self.changed.notify_all()

    async def available(self) -> int:
        return self.free


class RowWindow:
    """Permits for ``rows`` rows in flight (read tasks acquire, the job releases as it commits)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.actor: Any = _Permits.remote(rows)  # type: ignore[attr-defined]

    def acquire(self, n: int) -> bool:
        """Permits for ``n`` rows (waits for them); False once the window is closed: the rows are not to go on."""
        return bool(ray.get(self.actor.acquire.remote(n)))

    def close(self) -> None:
        """No more rows: the run failed while others go on through the same engine (``icebatch_job.shared``)."""
        self.actor.close.remote()

    def release(self, n: int) -> None:
        if n > 0:
            self.actor.release.remote(n)

    def available(self) -> int:
        return int(ray.get(self.actor.available.remote()))


def blocks_of(dataset: ray.data.Dataset, rows: int) -> ray.data.Dataset:
    """The dataset in blocks of at most ``rows`` rows: what the pipeline's first stage takes permits for.

    An explicit repartition: a read task's own small blocks would be coalesced again by Ray Data's output
    block shaping, and a call holding a whole read's rows could wait forever for permits (tested).
    """
    return dataset.repartition(target_num_rows_per_block=rows)


def chunk_size(chunk_rows: int, in_flight: int) -> int:
    """The chunk a run uses: ``ICEBATCH_CHUNK_ROWS``, or twice the rows in flight when that is more.

    More engine replicas keep more rows in flight (a RayJob for a large backlog gets up to the consumer's
    ``max_gpus``): with four replicas at the defaults that is 1,728 rows, and a 1,200-row chunk could not
    hold them. The chunk grows with the replicas rather than failing the run.
    """
    return max(chunk_rows, 2 * in_flight)


def commit_every(chunk_rows: int, in_flight: int) -> int:
    """How many finished rows make a commit, so that finished + in flight never exceed one chunk."""
    if chunk_rows < 2 * in_flight:
        raise ConfigError(
            f"ICEBATCH_CHUNK_ROWS={chunk_rows} is too small for this pipeline: it keeps up to {in_flight} rows in "
            f"flight (batches being filled and inferred), and a chunk must hold at least twice that. Set "
            f"ICEBATCH_CHUNK_ROWS to {2 * in_flight} or more, or lower ICEBATCH_BATCH_SIZE"
        )
    return chunk_rows - in_flight
