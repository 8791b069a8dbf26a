"""The job on a real multi-node Ray cluster, with two engine replicas.

A Ray head with no CPUs (as the RayJob's head) and a worker node, each its own ``ray start`` process on
127.0.0.1 (tests/support/ray_cluster.py); the job attaches through ``RAY_ADDRESS`` as a RayJob's
entrypoint does, with ``ICEBATCH_CONCURRENCY=2``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.consumers import consumer_named, load_consumers
from icebatch.core.settings import Settings
from icebatch_job.example.tickets import ensure_source_table, generate

from tests.engine.conftest import ledger
from tests.support.consumers import consumers_file
from tests.support.job_process import start_job
from tests.support.ray_cluster import RayCluster, engine_replicas

pytestmark = [pytest.mark.engine]
ROWS = 400


def test_two_replicas_on_a_two_node_cluster_share_the_rows_each_once_in_one_commit(
    tmp_path: Path, tiny_model: Path
) -> None:
    # given 400 new tickets, two engine replicas of 64 rows in flight each (16-row batches), and a cluster
    # of a CPU-less head and one worker node
    home = tmp_path / "home"
    settings = Settings(
        home=home,
        model_source=str(tiny_model),
        batch_size=16,
        max_num_seqs=32,
        concurrency=2,
        consumers_file=consumers_file(home / "consumers", {"name": "triage", "backlog_threshold": 1}),
    )
    generate(
        ensure_source_table(open_catalog(settings), settings.catalog.source_table), tickets=ROWS, batches=3, seed=41
    )
    consumer = consumer_named(load_consumers(settings), "triage")
    cluster = RayCluster.start(tmp_path / "ray", head_cpus=0, worker_cpus=(4,))
    code = -1
    try:
        # when the job runs as a RayJob's entrypoint: attached to the cluster, not starting its own Ray
        job = start_job(settings, consumer, extra_env={"RAY_ADDRESS": cluster.address})
        try:
            code = job.wait(timeout=900)
        except subprocess.TimeoutExpired:
            job.kill_tree()
            raise
        nodes = cluster.node_ids()
        replicas = engine_replicas(cluster.session_logs)
    finally:
        cluster.stop(keep_logs=code != 0)  # keep Ray's logs of a failed run
    assert code == 0, (cluster.session_logs, job.output()[-3000:])
    result = job.result()
    # then both replicas were started and got work, on the worker node (the head has no CPUs)
    assert len(replicas) == 2, replicas
    assert all(r["batches"] >= 1 for r in replicas.values()), replicas
    assert {r["node"] for r in replicas.values()} <= set(nodes["workers"]), (replicas, nodes)
    # and every row has exactly one result, committed with the watermark in one commit
    assert result["status"] == "completed" and result["rows"] == ROWS and result["chunks"] == 1
    results = ledger(settings).results()
    names = results.scan(selected_fields=("source_id", "source_file", "source_pos")).to_arrow().to_pylist()
    assert len(names) == ROWS and len({(r["source_file"], r["source_pos"]) for r in names}) == ROWS
    assert len({r["source_id"] for r in names}) == ROWS
    assert len(results.metadata.snapshots) == 1
    assert (
        result["new_watermark"]
        == open_catalog(settings).load_table(settings.catalog.source_table).metadata.current_snapshot_id
    )
