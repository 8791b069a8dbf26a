"""Rendering runs for people: the job's console blocks and the reporter's cost report.

One renderer for both, so that what the job prints and what finance receives cannot drift apart.
"""

from __future__ import annotations

from icebatch.core.costs.before_job import BeforeJob
from icebatch.core.costs.money import usd
from icebatch.core.costs.prices import BatchPrice, comparison
from icebatch.core.events import BatchJobCompleted, BatchJobFailed


def watermark_text(snapshot_id: object) -> str:
    """A watermark as a person reads it (logs, errors, the CLI): no watermark is not ``None``."""
    return "(none: nothing processed yet)" if snapshot_id is None else str(snapshot_id)


def range_text(from_exclusive: int | None, to_inclusive: int) -> str:
    """A run's range of source snapshots, ``(W, T]``; from no watermark, ``(start, T]``."""
    return f"({'start' if from_exclusive is None else from_exclusive}, {to_inclusive}]"


WIDTH = 64


def _rule(title: str) -> str:
    return f"{'=' * 4} {title} {'=' * max(4, WIDTH - len(title) - 6)}"


def _line(label: str, value: object) -> str:
    return f"{label:<22}: {value}"


def _money(x: float | None) -> str:
    return usd(x)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def incremental_state(
    *,
    consumer: str,
    source_table: str,
    from_snapshot: int | None,
    to_snapshot: int | None,
    new_rows: int,
    snapshots: int | None = None,
    noun: str = "rows",
) -> str:
    lines = [
        _rule("INCREMENTAL STATE"),
        _line("consumer", consumer),
        _line("source table", source_table),
        _line("watermark (from)", from_snapshot if from_snapshot is not None else "(none: first run)"),
        _line("pinned snapshot (to)", to_snapshot if to_snapshot is not None else "-"),
    ]
    if snapshots is not None:
        lines.append(_line("snapshots", snapshots))
    lines.append(_line(f"new {noun}", new_rows))
    return "\n".join(lines)


def batch_summary(e: BatchJobCompleted) -> str:
    statuses = ", ".join(f"{k} {v:,}" for k, v in sorted(e.rows_by_status.items()))
    lines = [
        _rule("BATCH SUMMARY"),
        _line("run", e.run_id),
        _line("rows", f"{e.rows:,} ({statuses})"),
        _line("truncated inputs", f"{e.rows_truncated:,}"),
    ]
    if e.rows_unchanged:
        lines.append(_line("rows unchanged", f"{e.rows_unchanged:,} (their content has a verdict: not sent again)"))
    if e.verdicts_removed:
        lines.append(_line("verdicts removed", f"{e.verdicts_removed:,} (rows deleted from the source, or changed)"))
    for field, counts in e.labels.items():
        total = sum(counts.values()) or 1
        parts = " | ".join(f"{k} {v} ({100 * v / total:.0f}%)" for k, v in counts.items())
        lines.append(_line(field, parts or "-"))
    lines.append(_line("results", e.results_location))
    lines.append(_line("model", f"{e.model} on {e.cost.gpus} x {e.device}"))
    return "\n".join(lines)


def tokenomics(e: BatchJobCompleted, prices: tuple[BatchPrice, ...] = ()) -> str:
    c = e.cost
    per_row_in = e.tokens.input / e.rows if e.rows else 0
    per_row_out = e.tokens.output / e.rows if e.rows else 0
    generating = e.engine_seconds - (e.engine_startup_seconds or 0.0)
    streaming = e.engine_seconds - e.first_result_seconds
    if e.engine_startup_seconds is not None and generating > 0 and e.tokens.output:
        engine = (
            f"{_duration(e.engine_seconds)} (start-up {_duration(e.engine_startup_seconds)}{_startup_parts(e)}, then "
            f"{_duration(generating)} generating at {e.tokens.output / generating:,.0f} output tok/s)"
        )
    elif streaming >= 1.0:  # events from before the start-up was measured: no honest rate to give
        engine = f"{_duration(e.engine_seconds)} (first result after {_duration(e.first_result_seconds)})"
    else:  # everything arrived at once: start-up and generation cannot be told apart
        engine = f"{_duration(e.engine_seconds)} (including engine start-up)"
    cpu_note = (
        [_line("priced as", "the GPU-equivalent: this run ran on CPU, billed as if on that GPU")] if _on_cpu(e) else []
    )
    return "\n".join(
        [
            _rule("TOKENOMICS"),
            _line("input tokens", f"{e.tokens.input:,} ({per_row_in:.1f} per row)"),
            _line("output tokens", f"{e.tokens.output:,} ({per_row_out:.1f} per row)"),
            _line("engine wall time", engine),
            *([_line("before the job", _before_job(e))] if e.before_job_seconds else []),
            _line("job wall time", _duration(e.job_seconds)),
            _line("GPU-hours (engine)", f"{c.engine_gpu_seconds / 3600:.4f}"),
            _line(
                "GPU lifetime",
                f"{_duration(c.gpu_lifetime_seconds)} (idle tail {_duration(c.idle_tail_seconds)}"
                + (f", of which the job's linger window {_duration(e.linger_seconds)}" if e.linger_seconds else "")
                + ("; taken warm by a lingering job, the wait before it included" if e.warm else "")
                + ")",
            ),
            *(
                [
                    _line(
                        "shared job",
                        f"one engine with {', '.join(e.shared_with)}: this run paid {c.share:.0%} of the node by "
                        f"tokens; sharing saved {_money(c.sharing_saved)} of start-up and idle tail",
                    )
                ]
                if e.shared_with
                else []
            ),
            _line(
                "hourly rate",
                f"{_money(c.hourly_rate)} per GPU-hour" + (f" ({c.rate_source})" if c.rate_source else ""),
            ),
            *cpu_note,
            _line("cost (engine only)", _money(c.engine_cost)),
            _line("cost (GPU lifetime)", _money(c.lifetime_cost)),
            _line("$ per 1k rows", _money(c.usd_per_1k_rows)),
            _line("$ per 1M output tok", _money(c.usd_per_1m_output_tokens)),
            _line("$ per 1M tokens", _money(c.usd_per_1m_tokens)),
            *(
                _line("at batch APIs" if i == 0 else "", line)
                for i, line in enumerate(comparison(prices, e.tokens.input, e.tokens.output, c.lifetime_cost))
            ),
        ]
    )


def completed_text(e: BatchJobCompleted, *, include_state: bool = True, prices: tuple[BatchPrice, ...] = ()) -> str:
    """The completion report; ``prices``: batch APIs to price its tokens at (``ICEBATCH_BATCH_API_PRICES``)."""
    if not include_state:
        return "\n".join([batch_summary(e), tokenomics(e, prices)])
    state = incremental_state(
        consumer=e.consumer,
        source_table=e.source_table,
        from_snapshot=e.range.from_exclusive,
        to_snapshot=e.range.to_inclusive,
        new_rows=e.rows,
        noun=e.row_noun,
    )
    return "\n".join([state, batch_summary(e), tokenomics(e, prices)])


def _range(e: BatchJobFailed) -> str:
    if e.range is None:
        return "-"
    start = e.range.from_exclusive if e.range.from_exclusive is not None else "(none: first run)"
    return f"{start} -> {e.range.to_inclusive}"


def _next(e: BatchJobFailed) -> str:
    if not e.retryable:
        return "needs an operator: see the error"
    if e.rows_committed and e.resumable:
        return "the range stays pending; the next trigger resumes the run and processes the rest of it"
    return "the range stays pending and the next trigger processes it"


def failed_text(e: BatchJobFailed) -> str:
    lines = [
        _rule("BATCH JOB FAILED"),
        _line("consumer", e.consumer),
        _line("source table", e.source_table),
        _line("run", e.run_id or "-"),
        _line("RayJob", e.rayjob_name or "-"),
        _line("stage", e.stage),
        _line("error", f"{e.error_type}: {e.reason}"),
        _line("found by", e.origin),
        _line("range", _range(e)),
        _line("rows processed", f"{e.rows_processed:,} by this attempt"),
        _line(
            "rows committed",
            f"{e.rows_committed:,} of the range (they stay: no attempt redoes them)" if e.rows_committed else "none",
        ),
        _line("what happens next", _next(e)),
    ]
    if e.cost is not None:
        lines.append(
            _line(
                "cost so far",
                f"{_money(e.cost.lifetime_cost)} ({_duration(e.cost.gpu_lifetime_seconds)} GPU)",
            )
        )
    return "\n".join(lines)


def _startup_parts(e: BatchJobCompleted) -> str:
    """What vLLM said its start-up spent loading the checkpoint and warming up, where it said so."""
    parts = [
        f"{what} {_duration(seconds)}"
        for what, seconds in (("weights", e.engine_weights_seconds), ("warm-up", e.engine_warmup_seconds))
        if seconds is not None
    ]
    return f": {', '.join(parts)}" if parts else ""


def _before_job(e: BatchJobCompleted) -> str:
    """The time before the job's process, and where it went where the job measured it (``core.costs.before_job``)."""
    before = BeforeJob(e.before_job_seconds, e.before_job_node_seconds, e.before_job_image_seconds)
    if before.node_seconds is None or before.image_seconds is None:
        return f"{_duration(before.seconds)} (GPU node, image pull, Ray cluster)"
    return (
        f"{_duration(before.seconds)} (GPU node {_duration(before.node_seconds)}, joining and image pull "
        f"{_duration(before.image_seconds)}, Ray cluster {_duration(before.ray_seconds)})"
    )


def _on_cpu(e: BatchJobCompleted) -> bool:
    """A run whose engine ran on CPU (the embedded default): its cost is what the same time costs on the GPU."""
    return e.device.lower() == "cpu"


def subject(e: BatchJobCompleted | BatchJobFailed) -> str:
    """A readable one-liner (SNS subjects are at most 100 characters)."""
    if isinstance(e, BatchJobCompleted):
        removed = f", {e.verdicts_removed:,} verdicts removed" if e.verdicts_removed else ""
        priced = " GPU-equivalent" if _on_cpu(e) else ""
        text = f"icebatch {e.consumer}: {e.rows:,} {e.row_noun}{removed}, {_money(e.cost.lifetime_cost)}{priced}"
        if e.rows_error:
            text += f" ({e.rows_error:,} not ok)"
    else:
        text = f"icebatch {e.consumer}: FAILED ({e.error_type}) at {e.stage}"
    return text[:100]
