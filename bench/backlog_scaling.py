"""Backlog check scaling: icebatch's metadata path vs the seed's scan-based count, as tables grow.

For tables of 10, 100 and 1,000 append snapshots (1,000 rows each by default, so up to 1,000,000 rows),
with the consumer's watermark half way, the same run times:

- ``floor``: loading the source table and reading its snapshot summaries, nothing else (goal: the
  launcher's check within 1.2x of it);
- ``metadata``: what the launcher does (``ResultsLedger.backlog``: snapshot summaries, no data file),
- ``scan``: the seed's method, reading the table and counting rows with ``ingested_ms`` past a watermark.

Both must give the same count; the metadata path should not grow with the rows (only, slowly, with the
size of the table's metadata file, which lists every snapshot) while the scan grows with the data.

    python -m bench.backlog_scaling [--sizes 10,100,1000] [--rows 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import median, table, write


def build(home: Path, snapshots: int, rows: int) -> tuple[object, int]:
    """A source table of ``snapshots`` appends and a ledger whose watermark sits half way."""
    from icebatch.core.catalog import open_catalog
    from icebatch.core.consumers import consumer_named, load_consumers
    from icebatch.core.ledger import open_ledger
    from icebatch.core.settings import Settings
    from icebatch_job.example.tickets import ensure_source_table

    from tests.support.many_snapshots import append_many
    from tests.support.runs import run_once

    settings = Settings(home=home)
    source = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    ids = append_many(
        source,
        snapshots,
        lambda _rng: rows,
        seed=snapshots,
        progress=lambda n: print(f"    {n}/{snapshots} snapshots", flush=True),
    )
    ledger = open_ledger(settings, consumer_named(load_consumers(settings), "triage"))
    half = ledger.plan(to_snapshot_inclusive=ids[snapshots // 2 - 1] if snapshots > 1 else ids[0])
    run_once(ledger, plan=half)
    watermark_ms = max(  # the seed's watermark: the largest ingested_ms processed so far
        b.column("ingested_ms").to_pylist()[-1]
        for b in ledger.source()
        .scan(snapshot_id=ids[snapshots // 2 - 1], selected_fields=("ingested_ms",))
        .to_arrow()
        .to_batches()
    )
    return settings, watermark_ms


def metadata_count(settings: object) -> int:
    from icebatch.core.consumers import consumer_named, load_consumers
    from icebatch.core.ledger import open_ledger

    consumer = consumer_named(load_consumers(settings), "triage")  # type: ignore[arg-type]
    return open_ledger(settings, consumer, control_plane=True).backlog().rows  # type: ignore[arg-type]


def floor_count(settings: object) -> int:
    """The floor: open the catalog, load the source table, read every snapshot's summary. Nothing else."""
    from icebatch.core.catalog import open_catalog

    table = open_catalog(settings).load_table(settings.catalog.source_table)  # type: ignore[attr-defined]
    return sum(int((s.summary or {}).get("added-records") or 0) for s in table.metadata.snapshots)


def scan_count(settings: object, watermark_ms: int) -> int:
    from icebatch.core.catalog import open_catalog
    from pyiceberg.expressions import GreaterThan

    table = open_catalog(settings).load_table(settings.catalog.source_table)  # type: ignore[attr-defined]
    return (
        table.scan(row_filter=GreaterThan("ingested_ms", watermark_ms), selected_fields=("ingested_ms",))
        .to_arrow()
        .num_rows
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--rows", type=int, default=1000, help="rows per snapshot")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = []
    for snapshots in [int(s) for s in args.sizes.split(",")]:
        home = Path(tempfile.mkdtemp(prefix=f"icebatch-backlog-{snapshots}-"))
        print(f"building {snapshots} snapshots x {args.rows} rows ...", flush=True)
        settings, watermark_ms = build(home, snapshots, args.rows)
        meta, scan, floor = [], [], []
        for _ in range(args.repeats):  # interleaved, so that machine noise hits all alike
            t = time.perf_counter()
            floor_count(settings)
            floor.append(time.perf_counter() - t)
            t = time.perf_counter()
            m = metadata_count(settings)
            meta.append(time.perf_counter() - t)
            t = time.perf_counter()
            s = scan_count(settings, watermark_ms)
            scan.append(time.perf_counter() - t)
        expected = args.rows * (snapshots - snapshots // 2)
        results.append(
            {
                "snapshots": snapshots,
                "rows": snapshots * args.rows,
                "backlog_rows": m,
                "scan_rows": s,
                "expected_backlog": expected,
                "metadata_seconds": meta,
                "scan_seconds": scan,
                "median_metadata_s": median(meta),
                "median_scan_s": median(scan),
                "scan_over_metadata": median(scan) / median(meta),
                "floor_seconds": floor,
                "median_floor_s": median(floor),
                "metadata_over_floor": median(meta) / median(floor),
            }
        )
        assert m == expected, (m, expected)
    rows = [
        (
            "snapshots",
            "rows",
            "backlog",
            "floor (median)",
            "metadata (median)",
            "metadata / floor",
            "scan (median)",
            "scan / metadata",
        )
    ]
    for r in results:
        rows.append(
            (
                str(r["snapshots"]),
                f"{r['rows']:,}",
                f"{r['backlog_rows']:,}",
                f"{r['median_floor_s'] * 1000:.1f} ms",
                f"{r['median_metadata_s'] * 1000:.1f} ms",
                f"{r['metadata_over_floor']:.2f}",
                f"{r['median_scan_s'] * 1000:.1f} ms",
                f"{r['scan_over_metadata']:.1f}x",
            )
        )
    path = write("backlog_scaling", {"rows_per_snapshot": args.rows, "repeats": args.repeats, "sizes": results})
    print(table(rows))
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
