"""The documentation's Performance page (docs/performance.md), its figures rendered from the latest results in
bench/results/.

`make bench` runs the benchmarks and then this, which rewrites the section between the markers
``<!-- bench:start -->`` and ``<!-- bench:end -->``; tests/contract/test_docs.py checks that the
page and the latest results agree.

    python -m bench.report [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.common import RESULTS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def _latest(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}-latest.json"
    return json.loads(path.read_text()) if path.exists() else None


GOAL = 0.95  # bare wall / job wall


def ratio_text(ratio: float, goal: float = GOAL) -> str:
    """A ratio to two places, or three where two would round it across the goal (0.946 is not 0.95)."""
    shown = f"{ratio:.2f}"
    return f"{ratio:.3f}" if (float(shown) >= goal) != (ratio >= goal) else shown


def _missed_text(p: dict[str, Any]) -> str:
    return f"{p['end_to_end_ratio']:.3f} with the {p['model']} model"


def _cpu_of(p: dict[str, Any]) -> tuple[Any, ...]:
    cpu = p["machine"].get("cpu", {})
    return cpu.get("model"), tuple(cpu.get("flags", [])), p.get("engine_dtype")


def _job_vs_bare(p: dict[str, Any], title: str) -> list[str]:
    b, j = p["median"]["bare"], p["median"]["job"]
    lo, hi = p["end_to_end_ratio_spread"]
    return [
        f"| {title} ({p['rows']:,} rows, {len(p['runs'])} runs) | {b['wall_s']:.1f} s | {j['wall_s']:.1f} s | "
        f"**{ratio_text(p['end_to_end_ratio'])}** (runs {lo:.2f}-{hi:.2f}) | >= {GOAL} |",
        f"| ... start-up, process start to first token | {b['first_token_s']:.1f} s | {j['first_token_s']:.1f} s "
        f"| {b['first_token_s'] / j['first_token_s']:.2f} | |",
        f"| ... generation, output tok/s (first token to last result) | {b['generation_tok_per_s']:,.0f} | "
        f"{j['generation_tok_per_s']:,.0f} | {p['generation_ratio']:.2f} | |",
        *_before(p),
    ]


def _before(p: dict[str, Any]) -> list[str]:
    """The job as it was at an earlier commit, run in the same rounds (``--before``), when it was."""
    before = p.get("before")
    if not before:
        return []
    was, j = p["median"]["before"], p["median"]["job"]
    return [
        f"| ... the job as it was at `{before['commit'][:7]}` ({before['revision']}), same rounds: whole process, "
        f"first token | {was['wall_s']:.1f} s, {was['first_token_s']:.1f} s | {j['wall_s']:.1f} s, "
        f"{j['first_token_s']:.1f} s | {before['end_to_end_ratio']:.2f} then (bare/job); now "
        f"{before['wall_change_s']:+.1f} s whole, {before['first_token_change_s']:+.1f} s to the first token | |"
    ]


def _start_up_dominated(p: dict[str, Any]) -> list[str]:
    """The tiny model's run: start-up is most of it, so its start-up difference is the figure, in seconds."""
    b, j = p["median"]["bare"], p["median"]["job"]
    lo, hi = p["end_to_end_ratio_spread"]
    return [
        f"| the same, the tiny model (1.4 M parameters: start-up is most of the run) ({p['rows']:,} rows, "
        f"{len(p['runs'])} runs) | {b['wall_s']:.1f} s | {j['wall_s']:.1f} s | {p['end_to_end_ratio']:.2f} (runs "
        f"{lo:.2f}-{hi:.2f}) | recorded |",
        f"| ... start-up, process start to first token | {b['first_token_s']:.1f} s | {j['first_token_s']:.1f} s "
        f"| {j['first_token_s'] - b['first_token_s']:+.1f} s | |",
        f"| ... generation, output tok/s (first token to last result) | {b['generation_tok_per_s']:,.0f} | "
        f"{j['generation_tok_per_s']:,.0f} | {p['generation_ratio']:.2f} | |",
        *_before(p),
    ]


def _dtype_note(p: dict[str, Any]) -> str:
    """Which dtype the engines ran in (results from before it was recorded say nothing)."""
    dtype = p.get("engine_dtype")
    if dtype is None:
        return ""
    if dtype == "float32" and not p["machine"].get("cpu", {}).get("native_bf16", True):
        return ", engines in float32 (no native bfloat16 on this CPU: `ICEBATCH_DTYPE=auto`)"
    return f", engines in {'the model dtype (bfloat16)' if dtype == 'auto' else dtype}"


def render() -> str:
    lines = [
        "Measured by `make bench` on this machine kind (2 cores, CPU only, the tiny model unless said). Every",
        "comparison is a ratio against a baseline measured in the same run; raw samples and machine details are",
        "in `bench/results/`, one file per run. Whole-process ratios vary between runs here: the job-vs-bare",
        "rows give their spread over the recorded runs.",
        "",
        "| benchmark | baseline (same run) | icebatch | ratio | goal |",
        "| --- | --- | --- | --- | --- |",
    ]
    tiny, small = _latest("pipeline_vs_bare"), _latest("pipeline_vs_bare_small")
    if small:  # the headline: generation-dominated, equal work on both sides
        if tiny and _cpu_of(tiny) == _cpu_of(small):
            ratio = small["median"]["bare"]["generation_tok_per_s"] / tiny["median"]["bare"]["generation_tok_per_s"]
            pace = f", {ratio:.2f}x the tiny model's bare tok/s"
        else:  # a pace between two machines would say nothing about the model
            cpu = small["machine"].get("cpu", {})
            pace = (
                f"; measured on another machine: {cpu.get('model', 'an unrecorded CPU')} "
                f"({', '.join(cpu.get('flags', [])) or 'no flags recorded'}){_dtype_note(small)}"
            )
        fixed = small.get("output_tokens_per_row")
        equal = f", every answer {fixed} tokens on both sides" if fixed else ""
        lines += _job_vs_bare(
            small,
            "**whole job process vs a bare `vllm.LLM` script**, generation-dominated: a ~20 M-parameter random Llama "
            f"(`--model small`{equal}{pace})",
        )
    if tiny:
        lines += _start_up_dominated(tiny)
    so = _latest("scale_out")
    if so:
        one, two = so["samples"]["1"], so["samples"]["2"]
        lines.append(
            f"| two engine replicas vs one, two-node Ray cluster ({so['rows']:,} rows, CPU: the replicas share 2 "
            f"cores) | 1 replica: {one['generation_tok_per_s']:,.0f} tok/s, {one['wall_s']:.1f} s | 2 replicas "
            f"({two['replicas_with_work']} with work): {two['generation_tok_per_s']:,.0f} tok/s, {two['wall_s']:.1f} s "
            f"| {so['generation_ratio_2_over_1']:.2f} | recorded |"
        )
    g = _latest("gpu")
    if g:
        gb, gj = g["bare"], g["job"]
        lines.append(
            f"| `make bench-gpu` on {g['gpus'][0]} (Llama-3.1-8B shape, random weights, {g['output_tokens_per_row']} "
            f"tokens/row) | {gb['tok_per_s_per_gpu']:,.0f} tok/s/GPU, {gb['wall_s']:.0f} s | "
            f"{gj['tok_per_s_per_gpu']:,.0f} tok/s/GPU, {gj['wall_s']:.0f} s | {g['end_to_end_ratio']:.2f} | >= 0.95 |"
        )
    c = _latest("chunk_cost")
    if c:
        wall = c["median_wall_s"]
        lines.append(
            f"| chunked commits, whole job process ({c['rows']:,} rows, chunks of {c['chunk_rows']:,}) | one commit "
            f"at the end: {wall['unchunked']:.1f} s | {wall['chunked']:.1f} s ({c['commits']['chunked']} commits; a "
            f"kill redoes <= {c['chunk_rows']:,} rows, not {c['rows']:,}) | {c['throughput_ratio']:.3f} | >= 0.97 |"
        )
        lines.append(
            f"| ... of which writing and committing chunks (measured in the job) | | "
            f"{c['chunk_commit_share']:.1%} of the job's wall time | | <= 3 % |"
        )
    w = _latest("launcher_weight")
    if w:
        m = w["median_import_seconds"]
        lines.append(
            f"| launcher cold import (decision path) | `import boto3`: {m['boto3']:.2f} s | {m['launcher']:.2f} s | "
            f"{w['import_ratio_launcher_over_boto3']:.1f} | < 1 s |"
        )
        lines.append(
            f"| Lambda bundle, unzipped | dependency closure: {w['closure_bytes'] / 1e6:.0f} MB | "
            f"{w['bundle_bytes'] / 1e6:.1f} MB | {w['bundle_bytes'] / w['closure_bytes']:.2f} | < 100 MB |"
        )
    lc = _latest("launcher_cold")
    if lc:
        m = lc["median_launcher_s"]
        lines.append(
            f"| launcher whole cold invocation, Glue + S3 on moto ({lc['snapshots']} snapshots): import "
            f"{m['import_s']:.2f} s, settings {m['settings_s']:.2f} s, catalog + table {m['catalog_s']:.2f} s, "
            f"decision {m['decision_s']:.2f} s "
            f"| boto3 + GetTable + GetObject: {lc['median_floor_s']:.2f} s | {m['total_s']:.2f} s | "
            f"{lc['launcher_over_floor']:.1f} | < 1 s |"
        )
    s = _latest("backlog_scaling")
    if s:
        for size in s["sizes"]:
            lines.append(
                f"| backlog check, {size['snapshots']:,} snapshots / {size['rows']:,} rows | seed's scan-and-count: "
                f"{size['median_scan_s'] * 1000:.0f} ms | metadata: {size['median_metadata_s'] * 1000:.1f} ms | "
                f"{size['scan_over_metadata']:.0f}x faster | flat in rows |"
            )
            if "median_floor_s" in size:
                lines.append(
                    f"| ... against the floor at {size['snapshots']:,} snapshots | load the table, read its "
                    f"summaries: {size['median_floor_s'] * 1000:.1f} ms | {size['median_metadata_s'] * 1000:.1f} ms "
                    f"| {size['metadata_over_floor']:.2f} | {'<= 1.2' if size['snapshots'] >= 1000 else ''} |"
                )
    h = _latest("streaming_history")
    if h:
        for size in h["sizes"]:
            lines.append(
                f"| a streaming history of {size['snapshots']:,} snapshots (crafted, a manifest list each) | load the "
                f"table, read its summaries: {size['median_floor_s']:.2f} s | backlog {size['median_backlog_s']:.2f} s,"
                f" job's plan {size['median_plan_s']:.2f} s (peak RSS {size['peak_rss_mb']:.0f} MB, read task "
                f"{size['read_task_bytes'] / 1024:.1f} KB) | {size['backlog_over_floor']:.2f}, "
                f"{size['plan_over_floor']:.2f} | <= 1.5 |"
            )
    ident = _latest("content_identity")
    if ident:
        for size in ident["sizes"]:
            lines.append(
                f"| matching a rewritten range of {ident['range_rows']:,} rows by content, {size['rows']:,} verdicts "
                f"| read the verdicts' ids: {size['floor_lookup_s']:.2f} s; the source's and the verdicts' ids: "
                f"{size['floor_removals_s']:.2f} s | lookup {size['lookup_s']:.2f} s, removals "
                f"{size['removals_s']:.2f} s (peak RSS {size['peak_rss_mb']:.0f} MB) | "
                f"{size['lookup_over_floor']:.2f}, {size['removals_over_floor']:.2f} | |"
            )
            if "repeats_s" in size:
                lines.append(
                    f"| before a run over {ident['range_rows']:,} appended rows whose ids do not grow, "
                    f"{size['rows']:,} verdicts: does it repeat an id? | read the verdicts' ids: "
                    f"{size['floor_lookup_s']:.2f} s | "
                    f"{size['repeats_s']:.2f} s | {size['repeats_over_floor']:.2f} | |"
                )
        h = ident["hashing"]
        lines.append(
            f"| content hash of every row read (append-only ranges too) | Parquet read: {h['read_us_per_row']:.2f} "
            f"us/row | {h['hash_us_per_row']:.2f} us/row | {h['hash_us_per_row'] / h['read_us_per_row']:.1f} | |"
        )
    t = _latest("tokens_per_row")
    if t:
        seed = t["seed"]
        typical = t["typical_tokens"]["mean"]
        lines.append(
            f"| output tokens per ticket | seed: {seed['tokens']} | typical verdict {typical:.0f}, schema bound "
            f"{t['schema_bound_tokens']} | {typical / seed['tokens']:.2f} | |"
        )
        per_1k = t["usd_per_1k"]
        seed_usd, ours, bound = (
            per_1k[k] for k in ("seed (free-text reasoning)", "icebatch typical verdict", "icebatch schema bound")
        )
        lines.append(
            f"| $ per 1k tickets at the seed's 2,776 tok/s, $2.24208/h | seed: ${seed_usd:.4f} | "
            f"${ours:.4f} (bound ${bound:.4f}) | {ours / seed_usd:.2f} | |"
        )
    day = _latest("day")
    if day:
        lines += _day(day)
    if c:
        cpu = c["machine"].get("cpu", {})
        walls = c["spread"]
        lines += [
            "",
            f"Chunked commits were measured on {cpu.get('model', 'an unrecorded CPU')} "
            f"({', '.join(cpu.get('flags', [])) or 'no flags recorded'}): whole job processes alternated, "
            f"walls {walls['chunked']} s chunked against {walls['unchunked']} s unchunked, so the ratio is "
            "within the run-to-run spread of start-up; the job's own measure of its chunk commits is the "
            f"steadier figure. On a GPU a {c['chunk_rows']:,}-row chunk is 10-40 s of generation and the commit "
            "overlaps it (the rows in flight keep the engine busy), so chunks of that size hold there too.",
        ]
    if tiny or small:
        first = tiny or small
        assert first is not None
        cpu = first["machine"].get("cpu", {})
        missed = [small] if small and small["end_to_end_ratio"] < GOAL else []
        lines += [
            "",
            f"The job-vs-bare figures come from {cpu.get('model', 'an unrecorded CPU')} "
            f"({', '.join(cpu.get('flags', [])) or 'no flags recorded'}), {first['machine'].get('cpus')} CPUs"
            + _dtype_note(first)
            + ": both "
            "sides are whole processes alternated in one run, over the same tickets, sharing one warm model cache; "
            "the bare script writes nothing back; both leave decoding to vLLM. The goal is set on the "
            "generation-dominated run, where what a row costs is the model's compute; the tiny model's run is most "
            "of all start-up, whose difference is given in seconds."
            + (
                " The job misses its goal here "
                f"({'; '.join(_missed_text(x) for x in missed)}): "
                'see "Where the job\'s time goes" below.'
                if missed
                else ""
            ),
        ]
    return "\n".join(lines)


def _day(d: dict[str, Any]) -> list[str]:
    """``bench.day``: a simulated day of triggers per launch policy, and the staleness the example consumers got."""
    rows = d["results"]
    today = {(r["gpu"], r["startup_s"]): r for r in rows if r["policy"].startswith("per crossing")}
    lines = [
        "",
        f"A day of triggers (`bench.day`: {d['commits']:,} commits, {d['rows_per_consumer']:,} rows for each of the "
        f"two consumers, {d['bulk_rows']:,} of them a nightly bulk load), through the launcher's own decision, "
        "estimate and budget code on a simulated clock. The baseline is a job per threshold crossing (icebatch "
        "before the cost gate); the batch price is the cheapest batch API's for the same tokens. The product runs "
        f"the `{d['product_policy']}` policy today: the gate prices the consumers of one model together and they share "
        "one job (one start-up, one engine), and a drained job lingers (a shared one for all its consumers), starting "
        "its engine again for each range it takes (assumed 60 s on a GPU). At "
        "these defaults a drained job seldom keeps its node: the rows that land within a window of a cold start's "
        "length do not pay for one; a burst does.",
        "",
        "| GPU, start-up | policy | cold starts | GPU-hours | $ per 1k rows (batch API) | worst staleness (max) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        base = today[(r["gpu"], r["startup_s"])]
        ratio = base["cold_starts"] / max(1, r["cold_starts"])
        fewer = "" if r is base else " (as many)" if ratio < 1.05 else f" ({ratio:.{0 if ratio >= 10 else 1}f}x fewer)"
        worst = ", ".join(
            f"{name} {r['worst_staleness_s'][name] / 3600:.1f} h ({r['max_staleness_s'][name] / 3600:g} h)"
            for name in r["worst_staleness_s"]
        )
        lines.append(
            f"| {r['gpu']}, {r['startup_s']} s | {r['policy']} | {r['cold_starts']}{fewer} | {r['gpu_hours']:.2f} | "
            f"${r['usd_per_1k_rows']:.4f} (${r['batch_usd_per_1k_rows']:.4f}) | {worst} |"
        )
    chosen = d["chosen_max_staleness_s"]
    tried = ", ".join(f"{s['max_staleness_s'] / 3600:g} h {'meets' if s['meets'] else 'misses'}" for s in d["sweep"])
    lines += [
        "",
        f"The example consumers' `max_staleness_seconds`: {chosen:,} ({chosen / 3600:g} h), the freshest at which the "
        f"`{d['product_policy']}` policy keeps $ per 1k rows at or below the batch price with every row within it, "
        f"in all four scenarios ({tried}).",
    ]
    return lines


def section(text: str) -> str:
    return text.split(START, 1)[1].split(END, 1)[0].strip() if START in text and END in text else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is not up to date")
    args = parser.parse_args()
    text = PAGE.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{PAGE} has no {START} ... {END} markers")
    fresh = render()
    if args.check:
        sys.exit(0 if section(text) == fresh else 1)
    before, rest = text.split(START, 1)
    after = rest.split(END, 1)[1]
    PAGE.write_text(f"{before}{START}\n{fresh}\n{END}{after}")
    print(fresh)


if __name__ == "__main__":
    main()
