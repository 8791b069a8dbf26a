"""The launcher's whole cold invocation on the AWS-parity stand-ins: a Glue catalog and an S3 warehouse (moto).

A source table of ``--snapshots`` appends lives in a Glue catalog over an ``s3://`` warehouse, both served
by moto over real HTTP, with the consumer's watermark half way. Each sample is a fresh Python process,
as a cold Lambda is, that times its phases: importing the launcher's handler (its whole decision path),
building the settings from the environment, opening the catalog and loading the source table, then the
decision's metadata work (the ledger's progress and the backlog past the watermark). Listing the
cluster's jobs is left out: it happens only when there is a backlog and talks to Kubernetes, not AWS.

The baseline, in the same run: a fresh process doing only the AWS calls any reader of the table makes
(``import boto3``, Glue ``GetTable``, S3 ``GetObject`` of the metadata file).

    python -m bench.launcher_cold [--snapshots 100] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import median, table, write

BUCKET = "icebatch-bench"

LAUNCHER = """
import json, time
t0 = time.perf_counter()
import icebatch.control.handlers.launcher  # noqa: F401  (the handler's module: its whole decision path)
from icebatch.core.consumers import consumer_named, load_consumers
from icebatch.core.ledger import open_ledger
from icebatch.core.settings import Settings
t1 = time.perf_counter()
settings = Settings.from_env()
consumer = consumer_named(load_consumers(settings), "triage")
t2 = time.perf_counter()
ledger = open_ledger(settings, consumer, control_plane=True)
source = ledger.source()
t3 = time.perf_counter()
progress = ledger.progress()
backlog = ledger.backlog(source=source, watermark=progress.watermark)
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "settings_s": t2 - t1, "catalog_s": t3 - t2, "decision_s": t4 - t3,
                  "total_s": t4 - t0, "backlog_rows": backlog.rows}))
"""

FLOOR = """
import json, os, time
t0 = time.perf_counter()
import boto3
kw = dict(endpoint_url=os.environ["ICEBATCH_AWS_ENDPOINT_URL"], region_name=os.environ["AWS_DEFAULT_REGION"])
glue = boto3.client("glue", **kw)
location = glue.get_table(DatabaseName="support", Name="tickets")["Table"]["Parameters"]["metadata_location"]
bucket, key = location.removeprefix("s3://").split("/", 1)
boto3.client("s3", **kw).get_object(Bucket=bucket, Key=key)["Body"].read()
print(json.dumps({"total_s": time.perf_counter() - t0}))
"""


def build(endpoint: str, home: Path, snapshots: int, rows: int) -> dict[str, str]:
    """The table in Glue + S3 (moto), the watermark half way; returns the launcher's environment."""
    from icebatch.core.catalog import open_catalog
    from icebatch.core.consumers import consumer_named, load_consumers
    from icebatch.core.ledger import open_ledger
    from icebatch.core.settings import Settings
    from icebatch_job.example.tickets import ensure_source_table

    from tests.support.aws import CREDS, client
    from tests.support.many_snapshots import append_many
    from tests.support.runs import run_once

    client("s3", endpoint).create_bucket(Bucket=BUCKET)
    env = {
        **CREDS,
        "ICEBATCH_HOME": str(home),
        "ICEBATCH_CATALOG_TYPE": "glue",
        "ICEBATCH_WAREHOUSE": f"s3://{BUCKET}/warehouse",
        "ICEBATCH_AWS_ENDPOINT_URL": endpoint,
        "ICEBATCH_AWS_REGION": CREDS["AWS_DEFAULT_REGION"],
    }
    settings = Settings.from_env(env)
    source = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    ids = append_many(
        source,
        snapshots,
        lambda _rng: rows,
        seed=snapshots,
        progress=lambda n: print(f"    {n}/{snapshots} snapshots", flush=True),
    )
    ledger = open_ledger(settings, consumer_named(load_consumers(settings), "triage"))
    run_once(ledger, plan=ledger.plan(to_snapshot_inclusive=ids[snapshots // 2 - 1]))
    return env


def sample(code: str, env: dict[str, str]) -> dict[str, Any]:
    base = {k: os.environ[k] for k in ("PATH", "PYTHONPATH", "HOME") if k in os.environ}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**base, **env})
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snapshots", type=int, default=100)
    parser.add_argument("--rows", type=int, default=100, help="rows per snapshot")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from tests.support.aws import moto_server

    with moto_server() as endpoint:
        print(f"building {args.snapshots} snapshots in Glue + S3 (moto) ...", flush=True)
        env = build(endpoint, Path(tempfile.mkdtemp(prefix="icebatch-launcher-cold-")), args.snapshots, args.rows)
        launcher, floor = [], []
        for _ in range(args.runs):  # interleaved: machine noise hits both alike
            floor.append(sample(FLOOR, env))
            launcher.append(sample(LAUNCHER, env))
    expected = args.rows * (args.snapshots - args.snapshots // 2)
    assert all(s["backlog_rows"] == expected for s in launcher), (launcher, expected)
    phases = {
        k: median([s[k] for s in launcher]) for k in ("import_s", "settings_s", "catalog_s", "decision_s", "total_s")
    }
    result = {
        "snapshots": args.snapshots,
        "rows": args.snapshots * args.rows,
        "backlog_rows": expected,
        "launcher": launcher,
        "floor": floor,
        "median_launcher_s": phases,
        "median_floor_s": median([s["total_s"] for s in floor]),
        "launcher_over_floor": phases["total_s"] / median([s["total_s"] for s in floor]),
    }
    path = write("launcher_cold", result)
    print(
        table(
            [
                ("phase (median of fresh processes)", "seconds"),
                ("import the handler (decision path)", f"{phases['import_s']:.3f}"),
                ("settings from the environment", f"{phases['settings_s']:.3f}"),
                ("Glue catalog + source table load", f"{phases['catalog_s']:.3f}"),
                ("decision: progress + backlog", f"{phases['decision_s']:.3f}"),
                ("whole cold invocation", f"{phases['total_s']:.3f}"),
                ("baseline: boto3 + GetTable + GetObject", f"{result['median_floor_s']:.3f}"),
                ("ratio (launcher / baseline)", f"{result['launcher_over_floor']:.2f}"),
            ]
        )
    )
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
