"""Two engine replicas against one, on a real two-node Ray cluster (a CPU-less head and a worker node).

The cluster is formed as KubeRay forms a RayJob's (``ray start`` per node, here as processes on
127.0.0.1: tests/support/ray_cluster.py); the job attaches through ``RAY_ADDRESS``. The same tickets are
processed by ``python -m icebatch_job run`` with ``ICEBATCH_CONCURRENCY=1`` and then ``=2`` (fresh homes,
one warm model cache). Reported: each run's process wall, its generation-phase throughput (output tokens
/ (last result - first token)) and the 2-vs-1 ratio of both. On a CPU-only machine both replicas share
the same cores, so the ratio shows what the plan and the protocol cost, not a GPU's scaling; on GPU
workers each replica has its own GPU.

    python -m bench.scale_out [--rows 1000]
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.common import table, write
from bench.pipeline_vs_bare import _home, run_job, warm_start
from tests.support.ray_cluster import RayCluster, engine_replicas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()

    model, root, cache, _ = warm_start("icebatch-bench-scale-")
    samples: dict[int, dict[str, Any]] = {}
    for replicas in (1, 2):
        cluster = RayCluster.start(root / f"ray-{replicas}", head_cpus=0, worker_cpus=(4,))
        try:
            settings = _home(root, f"replicas-{replicas}", args.rows, model).with_overrides(concurrency=replicas)
            print(f"{replicas} replica(s): {args.rows} rows on {cluster.address} ...", flush=True)
            samples[replicas] = run_job(settings, cache, {"RAY_ADDRESS": cluster.address})
            samples[replicas]["replicas_with_work"] = sum(
                1 for r in engine_replicas(cluster.session_logs).values() if r["batches"]
            )
        finally:
            cluster.stop()
        print(f"    {samples[replicas]['wall_s']:.1f} s", flush=True)
    one, two = samples[1], samples[2]
    result = {
        "rows": args.rows,
        "samples": {str(k): v for k, v in samples.items()},
        "wall_ratio_1_over_2": one["wall_s"] / two["wall_s"],
        "generation_ratio_2_over_1": two["generation_tok_per_s"] / one["generation_tok_per_s"],
    }
    path = write("scale_out", result)
    print(
        table(
            [
                ("measure", "1 replica", "2 replicas", "ratio"),
                (
                    "job process wall s",
                    f"{one['wall_s']:.1f}",
                    f"{two['wall_s']:.1f}",
                    f"{result['wall_ratio_1_over_2']:.2f} (1/2)",
                ),
                (
                    "generation output tok/s",
                    f"{one['generation_tok_per_s']:,.0f}",
                    f"{two['generation_tok_per_s']:,.0f}",
                    f"{result['generation_ratio_2_over_1']:.2f} (2/1)",
                ),
                ("replicas that got work", str(one["replicas_with_work"]), str(two["replicas_with_work"]), ""),
            ]
        )
    )
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
