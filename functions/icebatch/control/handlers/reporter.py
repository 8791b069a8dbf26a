"""The reporter Lambda: "Batch Job Completed/Failed" events in, one cost report per run out (SNS).

Idempotent per run attempt (EventBridge delivers at least once, and a failed job may be reported both by the
job and by the nightly reconciliation): the key is the detail-type, the run id and the attempt's RayJob (each
attempt of a run is a RayJob of its own, and each failed attempt is reported and on record). A malformed event
is logged, counted (``InvalidEvents``) and answered without raising (no crash loop); a failure to publish
is raised so the platform retries, then keeps the event in the on-failure destination: SNS out of reach
(``TransientErrors``) or refusing the deployment's publish (its grant, the topic, its key: ``ReportErrors``, as an
operator must act; the kept event is re-driven once fixed). Metrics carry the event's consumer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.typing import LambdaContext

from icebatch.control.handlers import consumer_metrics, count_retry, environment_settings
from icebatch.control.reporter import parse_detail
from icebatch.core.errors import InvalidEventError, PermanentError, RefusedError, TransientError
from icebatch.core.events import BatchJobCompleted, BatchJobFailed
from icebatch.core.settings import Settings
from icebatch.core.untrusted import summarize

logger = Logger(service="icebatch-reporter")
tracer = Tracer(service="icebatch-reporter")
metrics = Metrics(service="reporter")  # namespace: POWERTOOLS_METRICS_NAMESPACE (icebatch/<stack> in AWS)

IDEMPOTENCY = IdempotencyConfig(
    event_key_jmespath="[\"detail-type\", detail.run_id || id, detail.rayjob_name || '']",
    expires_after_seconds=30 * 86400,
)
_reporters: dict[int, tuple[Settings, Callable[..., dict[str, Any]]]] = {}


@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def lambda_handler(event: Any, context: LambdaContext, settings: Settings | None = None) -> dict[str, Any]:
    try:
        s = settings or environment_settings()
        detail = parse_detail(event)
        IDEMPOTENCY.register_lambda_context(context)
        result = _reported(s, event)
    except InvalidEventError as e:
        logger.error("rejected event", extra={"error": str(e)})
        metrics.add_metric(name="InvalidEvents", unit=MetricUnit.Count, value=1)
        return {"status": "rejected", "reason": str(e)}
    except RefusedError as e:  # an operator must act: counted as an error (alarmed), raised to keep the event
        logger.error("report refused", extra={"error": str(e), "error_type": type(e).__name__})
        metrics.add_metric(name="ReportErrors", unit=MetricUnit.Count, value=1)
        raise
    except TransientError as e:  # the platform retries
        count_retry(logger, metrics, "report", e)
        raise
    except PermanentError as e:
        logger.error("report failed permanently", extra={"error": str(e), "error_type": type(e).__name__})
        metrics.add_metric(name="ReportErrors", unit=MetricUnit.Count, value=1)
        return {"status": "error", "reason": str(e)}
    logger.info("cost report", extra={"report": result})
    metrics.add_metric(name="Reports", unit=MetricUnit.Count, value=1)
    count(detail)
    return result


def _reported(settings: Settings, event: Any) -> dict[str, Any]:
    """The report, sent once per run; the idempotency table out of reach is a retry, as SNS out of reach is."""
    from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyPersistenceLayerError

    try:
        return reporter_for(settings)(event=event)
    except IdempotencyPersistenceLayerError as e:
        raise TransientError(f"the idempotency table cannot be used: {summarize(str(e), 300)}") from e


def reporter_for(settings: Settings) -> Callable[..., dict[str, Any]]:
    """The idempotent report function of these settings (built once per container and settings)."""
    cached = _reporters.get(id(settings))
    if cached is None or cached[0] is not settings:
        from icebatch.control.idempotency import persistence_for
        from icebatch.control.reporter import report_with

        report = report_with(settings)
        store = persistence_for(settings)
        once = idempotent_function(data_keyword_argument="event", persistence_store=store, config=IDEMPOTENCY)(report)
        cached = _reporters[id(settings)] = (settings, once)
    return cached[1]


def count(detail: BatchJobCompleted | BatchJobFailed) -> None:
    with consumer_metrics(metrics, detail.consumer) as m:
        if isinstance(detail, BatchJobFailed):
            m.add_metric(name="JobFailures", unit=MetricUnit.Count, value=1)
            return
        c = detail.cost
        m.add_metric(name="RowsProcessed", unit=MetricUnit.Count, value=detail.rows)
        m.add_metric(name="RowsNotOk", unit=MetricUnit.Count, value=detail.rows_error)
        m.add_metric(name="OutputTokens", unit=MetricUnit.Count, value=detail.tokens.output)
        m.add_metric(name="GpuSeconds", unit=MetricUnit.Seconds, value=c.gpu_lifetime_seconds)
        m.add_metric(name="CostUsd", unit=MetricUnit.NoUnit, value=c.lifetime_cost)
        if c.usd_per_1k_rows is not None:
            m.add_metric(name="CostPer1kRowsUsd", unit=MetricUnit.NoUnit, value=c.usd_per_1k_rows)
