"""A streaming-fed source: backlog and planning as the history grows to 1,000, 10,000 and 100,000 snapshots.

A table fed by Flink or Kafka Connect commits every checkpoint: 1,440 snapshots a day at one a minute. The
history here is crafted (``tests/support/crafted_history.py``): an append, N-2 checkpoints that add no rows,
each with a manifest list of its own as a real writer leaves them, and an append; the consumer has processed
nothing, so its range spans the whole history. Timed in one process, interleaved, against a floor:

- ``floor``: loading the table and reading every snapshot's summary (what any reader of the table pays);
- ``backlog``: the launcher's check (``ResultsLedger.backlog``, metadata only);
- ``plan``: the job's planning of the range (the source loaded once, ``ResultsLedger.plan`` +
  ``icebatch_job.plan.source.plan_range``: an append-only range reads its end's manifest list alone);
- the job's read tasks' largest pickled size, and the planning process's peak memory (a fresh process per size).

    python -m bench.streaming_history [--sizes 1000,10000,100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import median, table, write

PLAN_IN_A_FRESH_PROCESS = """
import json, resource, sys, time
from pathlib import Path
from icebatch.core.consumers import consumer_named, load_consumers
from icebatch.core.ledger import open_ledger
from icebatch.core.settings import Settings
from icebatch_job.commit.done import DoneRows
from icebatch_job.plan.source import IncrementalIcebergDatasource, plan_range
from ray import cloudpickle
settings = Settings(home=Path(sys.argv[1]))
ledger = open_ledger(settings, consumer_named(load_consumers(settings), "triage"))
t = time.perf_counter()
source = ledger.source()  # once, as the job loads it (icebatch_job.job.plan)
plan = ledger.plan(source=source)
planned = plan_range(source, plan)
seconds = time.perf_counter() - t
tasks = IncrementalIcebergDatasource(planned, DoneRows()).get_read_tasks(2)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"rows": planned.rows, "seconds": seconds, "peak_rss_mb": peak,
                  "read_task_bytes": max(len(cloudpickle.dumps(t)) for t in tasks)}))
"""


def build(home: Path, snapshots: int) -> object:
    import random

    from icebatch.core.catalog import open_catalog
    from icebatch.core.settings import Settings
    from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets

    from tests.support.crafted_history import add_empty_appends
    from tests.support.many_snapshots import fast_metadata_updates

    settings = Settings(home=home)
    source = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    append_tickets(source, generate_tickets(5, random.Random(1)))
    add_empty_appends(source.refresh(), snapshots - 2, distinct_lists=True)
    with fast_metadata_updates():
        append_tickets(source.refresh(), generate_tickets(7, random.Random(2)))
    return settings


def floor(settings: object) -> int:
    from icebatch.core.catalog import open_catalog

    loaded = open_catalog(settings).load_table(settings.catalog.source_table)  # type: ignore[attr-defined]
    return sum(int((s.summary or {}).get("added-records") or 0) for s in loaded.metadata.snapshots)


def backlog(settings: object) -> int:
    from icebatch.core.consumers import consumer_named, load_consumers
    from icebatch.core.ledger import open_ledger

    consumer = consumer_named(load_consumers(settings), "triage")  # type: ignore[arg-type]
    return open_ledger(settings, consumer, control_plane=True).backlog().rows  # type: ignore[arg-type]


def plan(home: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PLAN_IN_A_FRESH_PROCESS, str(home)], capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = []
    for snapshots in [int(s) for s in args.sizes.split(",")]:
        home = Path(tempfile.mkdtemp(prefix=f"icebatch-streaming-{snapshots}-"))
        t = time.perf_counter()
        settings = build(home, snapshots)
        print(f"{snapshots:,} snapshots crafted in {time.perf_counter() - t:.1f} s", flush=True)
        floors, backlogs, plans = [], [], []
        for _ in range(args.repeats):  # interleaved, so that machine noise hits all alike
            t = time.perf_counter()
            floor(settings)
            floors.append(time.perf_counter() - t)
            t = time.perf_counter()
            rows = backlog(settings)
            backlogs.append(time.perf_counter() - t)
            plans.append(plan(home))
        assert rows == 12 and all(p["rows"] == 12 for p in plans), (rows, plans)
        results.append(
            {
                "snapshots": snapshots,
                "floor_seconds": floors,
                "backlog_seconds": backlogs,
                "plan_seconds": [p["seconds"] for p in plans],
                "median_floor_s": median(floors),
                "median_backlog_s": median(backlogs),
                "median_plan_s": median([p["seconds"] for p in plans]),
                "backlog_over_floor": median(backlogs) / median(floors),
                "plan_over_floor": median([p["seconds"] for p in plans]) / median(floors),
                "peak_rss_mb": max(p["peak_rss_mb"] for p in plans),
                "read_task_bytes": max(p["read_task_bytes"] for p in plans),
            }
        )
    rows_out = [("snapshots", "floor", "backlog", "backlog / floor", "plan", "plan / floor", "peak RSS", "read task")]
    for r in results:
        rows_out.append(
            (
                f"{r['snapshots']:,}",
                f"{r['median_floor_s']:.2f} s",
                f"{r['median_backlog_s']:.2f} s",
                f"{r['backlog_over_floor']:.2f}",
                f"{r['median_plan_s']:.2f} s",
                f"{r['plan_over_floor']:.2f}",
                f"{r['peak_rss_mb']:.0f} MB",
                f"{r['read_task_bytes'] / 1024:.1f} KB",
            )
        )
    path = write("streaming_history", {"repeats": args.repeats, "sizes": results})
    print(table(rows_out))
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
