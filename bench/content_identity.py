"""Content identity at scale: what a run over a range that deleted or rewrote rows pays to match by content.

A source of N rows (1M, 10M) whose N verdicts are in the results table; a range of 1,000 rewritten rows (an
overwrite or upsert: 990 unchanged copies, 10 changed). Timed in one process, interleaved, against floors:

- ``lookup`` (``identity.unchanged``: which of the range's rows already have a verdict for their content)
  against reading the results' ``source_id`` column once (any lookup of ids reads them);
- ``removals`` (``identity.removals``: verdicts of ids gone from the source, and superseded ones) against
  reading the source's id column and the results' ids once (what finding deleted rows must read);
- ``hash``: ``identity.content_hashes`` per row (every read row pays it, append-only ranges too), beside the
  same rows' Parquet read;
- ``repeats`` (``work.repeats``: whether an append-only range of 1,000 new rows repeats an id, as every run over
  ids that do not grow asks before it starts) against the same floor as ``lookup``.

Peak RSS is the process's. ``python -m bench.content_identity [--sizes 1000000,10000000] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.common import median, table, write

RANGE = 1_000
CHANGED = 10
FILE_ROWS = 1_000_000


def build(home: Path, rows: int) -> tuple[Any, Any]:
    """The source (``id``, ``text``) and its results (``source_id``, ``source_hash``, ``run_id``, ``task_version``)."""
    from icebatch.core.catalog import open_catalog
    from icebatch.core.settings import Settings
    from icebatch_job.plan.identity import content_hashes

    catalog = open_catalog(Settings(home=home))
    catalog.create_namespace_if_not_exists("bench")
    source = catalog.create_table("bench.items", pa.schema([("id", pa.int64()), ("text", pa.string())]))
    results = catalog.create_table(
        "bench.items_results",
        pa.schema(
            [
                ("source_id", pa.string()),
                ("source_hash", pa.int64()),
                ("run_id", pa.string()),
                ("task_version", pa.int32()),
            ]
        ),
    )
    for start in range(0, rows, FILE_ROWS):
        ids = np.arange(start, min(rows, start + FILE_ROWS), dtype=np.int64)
        data = pa.table({"id": ids, "text": pa.array([f"ticket text number {i}" for i in ids.tolist()])})
        source.append(data)
        verdicts = pa.table(
            {
                "source_id": pa.array(ids).cast(pa.string()),
                "source_hash": content_hashes(data),
                "run_id": pa.array(["bench-run-1"] * len(ids)),
                "task_version": pa.array([1] * len(ids), pa.int32()),
            }
        )
        results.append(verdicts)
    return source.refresh(), results.refresh()


def candidates(rows: int) -> pa.Table:
    """The range's rows as the job reads them: 1,000 copies of labelled rows, ten of them changed."""
    from icebatch_job.columns import SOURCE_FILE, SOURCE_HASH, SOURCE_POS
    from icebatch_job.plan.identity import content_hashes

    ids = np.linspace(0, rows - 1, RANGE, dtype=np.int64)
    text = [f"ticket text number {i}" + (" (edited)" if n < CHANGED else "") for n, i in enumerate(ids.tolist())]
    data = pa.table({"id": ids, "text": text})
    return (
        data.append_column(SOURCE_HASH, content_hashes(data))
        .append_column(SOURCE_FILE, pa.array(["rewritten.parquet"] * RANGE))
        .append_column(SOURCE_POS, pa.array(np.arange(RANGE, dtype=np.int64)))
    )


def timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def appended_range(source: Any, rows: int) -> Any:
    """A range of ``RANGE`` new rows appended past the labelled ones, planned as the job plans it."""
    from icebatch.core.ledger import RunPlan
    from icebatch_job.plan.source import plan_range

    before = source.metadata.current_snapshot()
    ids = np.arange(rows, rows + RANGE, dtype=np.int64)
    source.append(pa.table({"id": ids, "text": pa.array([f"ticket text number {i}" for i in ids.tolist()])}))
    source = source.refresh()
    plan = RunPlan(
        run_id="bench-run-3",
        consumer="bench",
        task="bench",
        task_version=1,
        source_table="bench.items",
        results_table="bench.items_results",
        from_snapshot_exclusive=before.snapshot_id,
        to_snapshot_inclusive=source.metadata.current_snapshot_id,
        expected_rows=RANGE,
        snapshots=1,
        scan_from_exclusive=before.snapshot_id,
        from_sequence_number=before.sequence_number,
    )
    return plan_range(source, plan, ("id", "text"))


def measure(source: Any, results: Any, rows: int, repeats: int) -> dict[str, Any]:
    from icebatch_job.commit.done import DoneRows
    from icebatch_job.plan.identity import removals, unchanged
    from icebatch_job.plan.work import repeats as repeated

    batch = candidates(rows)
    end = source.metadata.current_snapshot_id
    appended = appended_range(source, rows)
    floors, lookups, floors2, removes, checks = [], [], [], [], []
    labelled = [str(i) for i in batch.column("id").to_pylist()[:CHANGED]]
    for _ in range(repeats):  # interleaved, so that machine noise hits all alike
        floors.append(timed(lambda: results.scan(selected_fields=("source_id",)).to_arrow())[0])
        seconds, found = timed(lambda: unchanged([batch], "id", DoneRows(), results, 1, run_id="bench"))
        lookups.append(seconds)
        assert found.count == RANGE - CHANGED, found.count
        floors2.append(
            timed(
                lambda: (
                    source.scan(selected_fields=("id",)).to_arrow(),
                    results.scan(selected_fields=("source_id",)).to_arrow(),
                )
            )[0]
        )
        seconds, removed = timed(lambda: removals(source, end, "id", results, "bench-run-2", 1, labelled))
        removes.append(seconds)
        assert (len(removed.gone), len(removed.superseded)) == (0, CHANGED), removed
        seconds, again = timed(lambda: repeated(appended, results, 1, None))  # a run's first attempt
        checks.append(seconds)
        assert again is False
    return {
        "rows": rows,
        "floor_lookup_s": median(floors),
        "lookup_s": median(lookups),
        "lookup_over_floor": median(lookups) / median(floors),
        "floor_removals_s": median(floors2),
        "removals_s": median(removes),
        "removals_over_floor": median(removes) / median(floors2),
        "repeats_s": median(checks),
        "repeats_over_floor": median(checks) / median(floors),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def hash_cost(source: Any, repeats: int) -> dict[str, float]:
    """Per row: hashing the id and a text column, beside reading them from Parquet."""
    from icebatch_job.plan.identity import content_hashes

    task = next(iter(source.scan(selected_fields=("id", "text")).plan_files()))
    reads, hashes = [], []
    for _ in range(repeats):
        seconds, data = timed(lambda: source.scan(selected_fields=("id", "text")).to_arrow())
        reads.append(seconds / data.num_rows)
        sample = data.slice(0, 200_000)
        hashes.append(timed(lambda sample=sample: content_hashes(sample))[0] / sample.num_rows)
    return {
        "read_us_per_row": median(reads) * 1e6,
        "hash_us_per_row": median(hashes) * 1e6,
        "file_rows": task.file.record_count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes, hashing = [], {}
    for rows in [int(s) for s in args.sizes.split(",")]:
        t = time.perf_counter()
        source, results = build(Path(tempfile.mkdtemp(prefix=f"icebatch-identity-{rows}-")), rows)
        print(f"{rows:,} rows and verdicts written in {time.perf_counter() - t:.1f} s", flush=True)
        sizes.append(measure(source, results, rows, args.repeats))
        hashing = hash_cost(source, args.repeats)
    out: list[tuple[str, ...]] = [
        (
            "verdicts",
            "read ids",
            "lookup",
            "lookup / floor",
            "read both ids",
            "removals",
            "removals / floor",
            "repeats",
            "repeats / floor",
            "peak RSS",
        )
    ]
    for r in sizes:
        out.append(
            (
                f"{r['rows']:,}",
                f"{r['floor_lookup_s']:.2f} s",
                f"{r['lookup_s']:.2f} s",
                f"{r['lookup_over_floor']:.2f}",
                f"{r['floor_removals_s']:.2f} s",
                f"{r['removals_s']:.2f} s",
                f"{r['removals_over_floor']:.2f}",
                f"{r['repeats_s']:.2f} s",
                f"{r['repeats_over_floor']:.2f}",
                f"{r['peak_rss_mb']:.0f} MB",
            )
        )
    path = write(
        "content_identity",
        {"repeats": args.repeats, "range_rows": RANGE, "changed": CHANGED, "sizes": sizes, "hashing": hashing},
    )
    print(table(out))
    print(
        f"hash {hashing['hash_us_per_row']:.2f} us/row beside a Parquet read of {hashing['read_us_per_row']:.2f} us/row"
    )
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
