"""A day of triggers through the launcher's own decision code, on a simulated clock: which launch policy pays.

A streaming writer commits once a minute, 1,440 commits of 5 to 50 rows on a daily curve (most by day), and a bulk
load of ``--bulk`` rows lands at 02:00. Two consumers of one model, the example's triage and privacy as
``functions/icebatch/consumers/consumers.yaml`` declares them, read the table. Every commit is an append trigger
and 00:00 is the nightly schedule. At each trigger each consumer without a job is decided by the launcher's code:
``estimate.cost_check`` (``lease.group_check`` for consumers that share a job), ``gate.decide``, its daily budget
from ``estimate.spent_on`` over the runs committed so far; each run goes back into the consumer's history as the
ledger records it, and the next estimate learns from it. A job takes its start-up, then each row at the GPU's rows
per second; its node lives on for the idle tail (``ICEBATCH_JOB_TTL_SECONDS`` + consolidation), as on EKS.

Policies: ``per crossing`` (today: a job per threshold crossing, one consumer each, no cost gate); ``gate`` (the
cost gate); ``linger`` (a drained job keeps its node while ``lease.keeps_node`` says arriving rows pay for it, judged
at each consumer's reference price even where the gate is off);
``gate and linger`` (a lingering job starts its engine again for each range, ``WARM_ENGINE_SECONDS``);
``sharing`` (consumers due together run in one job, priced together by the gate); ``all three`` (the product: a
shared job lingers for all its consumers, ``icebatch_job.shared``). Scenarios: a start-up of 90 s
and of 300 s, on an L4 (g6.xlarge) and an L40S (g6e.xlarge). Rows per second are the GPU's decode rate over the output
tokens of a row: the seed measured 2,776 output tok/s for an 8B model on an L40S; an L4 decodes at its share of the
memory bandwidth (300 against 864 GB/s): 964 tok/s. Tokens per row: triage 155 in and 38 out (the README's report),
privacy 184 in and 24 out (its longer prompt, four short fields).

    python -m bench.day [--bulk 30000] [--seed 1]

Nothing here is timed: the figures are those of the cost model, the same on every machine.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from icebatch.control.gate import GateInput, decide, staleness_lead
from icebatch.core.consumers import Consumer, load_consumers
from icebatch.core.costs.estimate import cost_check, estimate_run, idle_tail_seconds, spent_on
from icebatch.core.costs.lease import Member, first_commit_seconds, group_check, idle_window_seconds, keeps_node
from icebatch.core.ledger import Key, RunRecord
from icebatch.core.settings import Settings

from bench.common import RESULTS, machine

DAY = 86_400
START = datetime(2026, 12, 1, tzinfo=UTC)  # the simulated day (UTC)


@dataclass(frozen=True)
class Gpu:
    name: str
    instance_type: str
    usd_per_hour: float
    output_tok_per_s: float


GPUS = (Gpu("L4", "g6.xlarge", 0.8048, 964.0), Gpu("L40S", "g6e.xlarge", 1.861, 2776.0))
STARTUPS = (90, 300)
TOKENS = {"triage": (155, 38), "privacy": (184, 24)}  # (in, out) per row


@dataclass(frozen=True)
class Policy:
    name: str
    gate: bool
    linger: bool
    share: bool


POLICIES = (
    Policy("per crossing (before)", False, False, False),
    Policy("gate", True, False, False),
    Policy("linger", False, True, False),
    Policy("linger, a window only", False, True, False),
    Policy("gate and linger", True, True, False),
    Policy("sharing", False, False, True),
    Policy("all three", True, True, True),
)
# what the product does: the launcher prices consumers of one model together and launches them in one job, and a
# drained job lingers (a shared one for all its consumers)
PRODUCT = POLICIES[6]
# a lingering job starts the engine again for each range it takes (icebatch_job.linger): vLLM loading an 8B model's
# weights from the node's page cache and warming up; the node, the image and Ray are up (an assumption, not measured
# on a GPU here: the published warm-cache cold start of such a model is ~82 s, its container included)
WARM_ENGINE_SECONDS = 60
STALENESS_CHOICES = (3600, 2 * 3600, 3 * 3600, 4 * 3600, 6 * 3600, 8 * 3600, 12 * 3600)


def writer(seed: int, bulk: int) -> list[tuple[int, int]]:
    """(second of the day, rows) of each commit: one a minute, 5-50 rows on a curve peaking at 14:00, and the bulk
    load at 02:00."""
    rng = random.Random(seed)
    commits = []
    for minute in range(1440):
        curve = 0.5 - 0.5 * math.cos(2 * math.pi * (minute - 120) / 1440)  # 0 at 02:00, 1 at 14:00
        rows = round(5 + 45 * curve * rng.uniform(0.6, 1.0))
        commits.append((minute * 60, max(5, min(50, rows))))
    commits.append((2 * 3600, bulk))
    return sorted(commits)


@dataclass
class Job:
    members: tuple[str, ...]
    started: float
    busy_until: float  # the end of its start-up, then of its last rows
    rows: dict[str, int] = field(default_factory=dict)
    processing: dict[str, float] = field(default_factory=dict)
    idle: bool = False  # drained and lingering


@dataclass
class Outcome:
    cold_starts: int = 0
    gpu_seconds: float = 0.0
    usd: float = 0.0
    rows: dict[str, int] = field(default_factory=dict)
    worst_staleness: dict[str, float] = field(default_factory=dict)
    batch_usd: float = 0.0
    batch_name: str = ""


class Day:
    def __init__(self, consumers: Sequence[Consumer], settings: Settings, gpu: Gpu, startup: int, policy: Policy):
        self.settings, self.gpu, self.startup, self.policy = settings, gpu, startup, policy
        self.consumers = {
            c.name: _window_only(c, settings) if policy.name.endswith("window only") else c for c in consumers
        }
        self.rate = {c: gpu.output_tok_per_s / TOKENS[c][1] for c in self.consumers}  # rows per second
        self.pending: dict[str, list[tuple[float, int]]] = {c: [] for c in self.consumers}
        self.landed: dict[str, list[tuple[float, int]]] = {c: [] for c in self.consumers}
        self.runs: dict[str, list[RunRecord]] = {c: [self._yesterday(c)] for c in self.consumers}
        self.jobs: list[Job] = []
        self.out = Outcome(rows=dict.fromkeys(self.consumers, 0), worst_staleness=dict.fromkeys(self.consumers, 0.0))

    def _yesterday(self, name: str) -> RunRecord:
        """A 10,000-row run of the day before: what the consumer's estimates start from (its measured pace)."""
        return self._record(name, 10_000, self.startup, 10_000 / self.rate[name], at=-DAY / 2)

    def _record(self, name: str, rows: int, startup: float, processing: float, *, at: float) -> RunRecord:
        tin, tout = TOKENS[name]
        props = {
            Key.ROWS: str(rows),
            Key.INPUT_TOKENS: str(rows * tin),
            Key.OUTPUT_TOKENS: str(rows * tout),
            Key.ENGINE_SECONDS: f"{startup + processing:.3f}",
            Key.ENGINE_STARTUP_SECONDS: f"{startup:.3f}",
            Key.JOB_SECONDS: f"{startup + processing:.3f}",
            Key.GPUS: "1",
        }
        when = int((START.timestamp() + at) * 1000)
        return RunRecord(f"{name}-{when}", 1, when, None, 1, self.consumers[name].task.name, 1, props)

    # --- the day --------------------------------------------------------------------------------------
    def run(self, commits: Sequence[tuple[int, int]]) -> Outcome:
        for t, rows in commits:
            for name in self.consumers:
                self.pending[name].append((t, rows))
                self.landed[name].append((t, rows))
            self._advance(t)
            self._triggers(t, "schedule" if t == 0 else "append")
        self._flush()  # rows still waiting are counted as waiting until the day's end
        for name, waiting in self.pending.items():
            for arrival, _ in waiting:
                self.out.worst_staleness[name] = max(self.out.worst_staleness[name], DAY - arrival)
        self._price_at_batch()
        return self.out

    def _active(self, name: str) -> Job | None:
        return next((j for j in self.jobs if name in j.members), None)

    def _triggers(self, t: float, kind: str) -> None:
        for name, consumer in self.consumers.items():
            if self._active(name) is not None or not self.pending[name]:
                continue
            members = self._members(name) if self.policy.share else [name]
            result = decide(self._gate_input(t, kind, consumer, members))
            if result.decision == "launch":
                self._launch(t, members)

    def _members(self, name: str) -> list[str]:
        """The consumers a launch for ``name`` takes along: those of its model with rows waiting and no job."""
        model = self.consumers[name].model
        return [name] + [
            o
            for o, c in self.consumers.items()
            if o != name and c.model == model and self.pending[o] and self._active(o) is None
        ]

    def _gate_input(self, t: float, kind: str, consumer: Consumer, members: list[str]) -> GateInput:
        rows = sum(n for _, n in self.pending[consumer.name])
        oldest = t - self.pending[consumer.name][0][0]
        runs = self.runs[consumer.name]
        if not self.policy.gate or (consumer.cost_reference == "off" and consumer.max_usd_per_1k_rows is None):
            cost = None
        elif len(members) > 1:
            cost = group_check([self._member(m) for m in members], self.settings)
        else:
            cost = cost_check(rows, consumer, runs, self.settings)
        estimate = estimate_run(rows, consumer, runs, self.settings)
        first_commit = (
            first_commit_seconds([self._member(m) for m in members], self.settings)
            if len(members) > 1
            else estimate.first_commit_seconds
        )
        budget = consumer.budget
        return GateInput(
            kind=kind,  # type: ignore[arg-type]
            force=False,
            dry_run=False,
            backlog_rows=rows,
            oldest_age_seconds=oldest,
            threshold=consumer.backlog_threshold,
            max_staleness_seconds=consumer.max_staleness_seconds,
            active_job=None,
            failed_attempts=0,
            max_attempts=3,
            estimate_usd=estimate.usd,
            max_usd_per_run=budget.max_usd_per_run if budget else None,
            spent_today_usd=spent_on(datetime.fromtimestamp(START.timestamp() + t, UTC), runs, self.settings),
            max_usd_per_day=budget.max_usd_per_day if budget else None,
            cost=cost,
            lead_seconds=staleness_lead(first_commit, oldest, len(self.pending[consumer.name])) if cost else 0,
        )

    def _member(self, name: str, since: float | None = None) -> Member:
        source = self.landed[name] if since is not None else self.pending[name]
        rows = sum(n for t, n in source if since is None or t > since)
        return Member(self.consumers[name], rows, self.runs[name])

    def _launch(self, t: float, members: list[str]) -> None:
        job = Job(tuple(members), t, t + self.startup)
        self.out.cold_starts += 1
        self.jobs.append(job)
        self._take(job)

    def _take(self, job: Job) -> None:
        """The job takes every row its consumers have waiting, in the order they landed (one engine, the consumers'
        rows side by side); a row is labelled when its consumer's chunk (``ICEBATCH_CHUNK_ROWS``) commits, or the last
        chunk of what the job took."""
        chunk = self.settings.progress.chunk_rows
        landed = sorted((a, name, rows) for name in job.members for a, rows in self.pending[name])
        marks: dict[str, list[tuple[int, float, float]]] = {}  # consumer -> (rows done in the job, when, landed)
        for arrival, name, rows in landed:
            seconds = rows / self.rate[name]
            job.busy_until += seconds
            job.rows[name] = job.rows.get(name, 0) + rows
            job.processing[name] = job.processing.get(name, 0.0) + seconds
            self.out.rows[name] += rows
            marks.setdefault(name, []).append((job.rows[name], job.busy_until, arrival))
        for name, done in marks.items():
            for count, _, arrival in done:
                boundary = -(-count // chunk) * chunk
                committed = next((t for c, t, _ in done if c >= boundary), job.busy_until)
                self.out.worst_staleness[name] = max(self.out.worst_staleness[name], committed - arrival)
            self.pending[name] = []
        for name in job.members:
            self.pending[name] = []

    def _advance(self, t: float) -> None:
        """Every job up to time ``t`` (the rows committed at ``t`` included): a drained job either ends or lingers;
        a lingering one takes the rows that land (warm: no start-up), and ends when a window passes with none."""
        for job in list(self.jobs):
            while job.busy_until <= t:
                drained = job.busy_until
                if not job.idle:
                    if not self._lingers(job, drained):
                        self._end(job, drained)
                        break
                    job.idle = True
                arrivals = [a for m in job.members for a, _ in self.pending[m]]
                if not arrivals:
                    break  # nothing yet: the next commit decides
                window = self._window(job)
                if min(arrivals) > drained + window:
                    self._end(job, drained + window)
                    break
                job.busy_until, job.idle = max(drained, min(arrivals)) + WARM_ENGINE_SECONDS, False
                self._take(job)

    def _flush(self) -> None:
        """The day is over: busy jobs finish, lingering ones wait out their window."""
        self._advance(math.inf)
        for job in list(self.jobs):
            self._end(job, job.busy_until + self._window(job))

    def _window(self, job: Job) -> float:
        return max(idle_window_seconds(self.consumers[m], self.runs[m], self.settings) for m in job.members)

    def _lingers(self, job: Job, at: float) -> bool:
        if not self.policy.linger:
            return False
        since = at - self._window(job)
        return keeps_node([self._member(m, since=since) for m in job.members], self.settings)

    def _end(self, job: Job, at: float) -> None:
        self.jobs.remove(job)
        at = max(at, job.busy_until)
        lifetime = at - job.started + idle_tail_seconds(self.settings)
        self.out.gpu_seconds += lifetime
        self.out.usd += lifetime * self.gpu.usd_per_hour / 3600
        for name in job.members:
            if job.rows.get(name):
                self.runs[name].insert(0, self._record(name, job.rows[name], self.startup, job.processing[name], at=at))

    def _price_at_batch(self) -> None:
        prices = self.settings.cost.batch_prices()
        totals = {p.name: 0.0 for p in prices}
        for name, rows in self.out.rows.items():
            tin, tout = TOKENS[name]
            for p in prices:
                totals[p.name] += p.cost(rows * tin, rows * tout)
        self.out.batch_name, self.out.batch_usd = min(totals.items(), key=lambda kv: kv[1])


def _window_only(consumer: Consumer, settings: Settings) -> Consumer:
    """The idle-window rule alone: no price to judge by, a window of start-up and idle tail, kept while rows land."""
    window = settings.launch.startup_seconds_prior + idle_tail_seconds(settings)
    return consumer.model_copy(update={"cost_reference": "off", "max_usd_per_1k_rows": None, "linger_seconds": window})


def scenario_settings(gpu: Gpu, startup: int) -> Settings:
    return Settings(
        backend="kuberay",
        gpu_hourly_rate=gpu.usd_per_hour,
        startup_seconds_prior=startup,
        rows_per_gpu_hour=int(gpu.output_tok_per_s / 38 * 3600),
    )


def simulate(consumers: Sequence[Consumer], gpu: Gpu, startup: int, policy: Policy, commits: list) -> dict:
    settings = scenario_settings(gpu, startup)
    out = Day(consumers, settings, gpu, startup, policy).run(commits)
    rows = sum(out.rows.values())
    return {
        "policy": policy.name,
        "gpu": gpu.name,
        "startup_s": startup,
        "cold_starts": out.cold_starts,
        "gpu_hours": round(out.gpu_seconds / 3600, 3),
        "usd": round(out.usd, 4),
        "rows": rows,
        "usd_per_1k_rows": round(out.usd / rows * 1000, 5) if rows else None,
        "batch_usd_per_1k_rows": round(out.batch_usd / rows * 1000, 5) if rows else None,
        "batch_api": out.batch_name,
        "worst_staleness_s": {k: round(v) for k, v in out.worst_staleness.items()},
        "max_staleness_s": {c.name: c.max_staleness_seconds for c in consumers},
    }


def scenarios(consumers: Sequence[Consumer], policies: Sequence[Policy], commits: list) -> list[dict]:
    return [
        simulate(consumers, gpu, startup, policy, commits)
        for gpu in GPUS
        for startup in STARTUPS
        for policy in policies
    ]


def meets(results: Sequence[dict]) -> bool:
    """At or below the batch APIs' price of the same tokens, each consumer within its max staleness, everywhere."""
    return all(
        r["usd_per_1k_rows"] <= r["batch_usd_per_1k_rows"]
        and all(r["worst_staleness_s"][c] <= r["max_staleness_s"][c] for c in r["worst_staleness_s"])
        for r in results
    )


def sweep(consumers: Sequence[Consumer], commits: list) -> tuple[list[dict], int | None]:
    """The product's policy at each max staleness (both consumers): the freshest that pays everywhere is the
    example consumers' default."""
    rows, chosen = [], None
    for staleness in STALENESS_CHOICES:
        tried = [c.model_copy(update={"max_staleness_seconds": staleness}) for c in consumers]
        results = scenarios(tried, [PRODUCT], commits)
        rows.append({"max_staleness_s": staleness, "meets": meets(results), "results": results})
        if chosen is None and meets(results):
            chosen = staleness
    return rows, chosen


def _line(r: dict) -> str:
    worst = ", ".join(f"{k} {v / 3600:.2f} h" for k, v in r["worst_staleness_s"].items())
    return (
        f"{r['gpu']:<5} {r['startup_s']:>3} s  {r['policy']:<22} cold starts {r['cold_starts']:>4}  "
        f"GPU-h {r['gpu_hours']:>6.2f}  $/1k rows {r['usd_per_1k_rows']:.4f} (batch "
        f"{r['batch_usd_per_1k_rows']:.4f})  worst staleness {worst}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bulk", type=int, default=30_000, help="rows of the nightly bulk load (default 30,000)")
    parser.add_argument("--seed", type=int, default=1, help="the writer's random curve (default 1)")
    args = parser.parse_args()
    consumers = load_consumers(Settings())
    commits = writer(args.seed, args.bulk)
    results = scenarios(consumers, POLICIES, commits)
    for r in results:
        print(_line(r))
    swept, chosen = sweep(consumers, commits)
    for s in swept:
        print(f"max staleness {s['max_staleness_s'] / 3600:g} h: {'meets' if s['meets'] else 'misses'} the goal")
        for r in s["results"]:
            print("  " + _line(r))
    print(f"chosen max_staleness_seconds: {chosen}")
    result = {
        "bench": "day",
        "machine": machine(),
        "commits": len(commits),
        "rows_per_consumer": sum(n for _, n in commits),
        "bulk_rows": args.bulk,
        "seed": args.seed,
        "consumers": [
            c.model_dump(
                include={
                    "name",
                    "backlog_threshold",
                    "max_staleness_seconds",
                    "max_usd_per_1k_rows",
                    "cost_reference",
                    "linger_seconds",
                }
            )
            for c in consumers
        ],
        "results": results,
        "sweep": swept,
        "product_policy": PRODUCT.name,
        "chosen_max_staleness_s": chosen,
    }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%z")
    RESULTS.mkdir(exist_ok=True)
    for name in (f"day-{stamp}.json", "day-latest.json"):
        (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
