"""The reporter Lambda: "Batch Job Completed/Failed" events in, one cost report per run out (SNS).

Idempotent per run (EventBridge delivers at least once, and a failed job may be reported both by the
job and by the nightly reconciliation): the key is the detail-type plus the run id. A malformed event
is logged, counted and answered without raising (no crash loop); a failure to publish is raised so the
platform retries, then keeps the event in the on-failure destination.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.typing import LambdaContext

from icebatch.errors import InvalidEventError, PermanentError
from icebatch.handlers import current_settings

logger = Logger(service="icebatch-reporter")
tracer = Tracer(service="icebatch-reporter")
metrics = Metrics(service="reporter")  # namespace: POWERTOOLS_METRICS_NAMESPACE (icebatch/<stack> in AWS)

IDEMPOTENCY = IdempotencyConfig(
    event_key_jmespath='["detail-type", detail.run_id || id]',
    expires_after_seconds=30 * 86400,
)
_report_once: Callable[..., dict[str, Any]] | None = None
_store_for: Any = None


def _reporter() -> Callable[..., dict[str, Any]]:
    """The idempotent report function, bound to the settings' persistence store (once per container)."""
    global _report_once, _store_for
    s = current_settings()
    if _report_once is None or _store_for is not s:
        from icebatch.idempotency import persistence_for
        from icebatch.reporter import build_report, load_notifier

        notifier = load_notifier(s)

        def report(event: dict[str, Any]) -> dict[str, Any]:
            detail = parse_detail(event)
            report = build_report(detail, event_id=event["id"])
            message_id = notifier.notify(report)
            return {"status": "reported", "run": report.key, "subject": report.subject, "message_id": message_id,
                    "report_status": report.status, "attributes": report.attributes}  # fmt: skip

        _report_once = idempotent_function(data_keyword_argument="event", persistence_store=persistence_for(s),
                                           config=IDEMPOTENCY)(report)  # fmt: skip
        _store_for = s
    return _report_once


def parse_detail(event: Any) -> Any:
    """The Completed/Failed detail of an EventBridge event, validated; InvalidEventError otherwise."""
    from aws_lambda_powertools.utilities.parser import ValidationError, parse
    from aws_lambda_powertools.utilities.parser.models import EventBridgeModel

    from icebatch.events import EVENT_SOURCE, BatchJobCompleted, BatchJobFailed

    if not isinstance(event, dict):
        raise InvalidEventError(f"expected an EventBridge event (a JSON object), got {type(event).__name__}")
    try:
        envelope = parse(event=event, model=EventBridgeModel)
    except ValidationError as e:
        raise InvalidEventError(f"not an EventBridge event: {_first(e)}") from e
    models = {m.detail_type: m for m in (BatchJobCompleted, BatchJobFailed)}
    if envelope.source != EVENT_SOURCE or envelope.detail_type not in models:
        raise InvalidEventError(
            f"the reporter handles {sorted(models)} from source {EVENT_SOURCE!r}, got {envelope.detail_type!r} "
            f"from {envelope.source!r} (check the rule's event pattern)"
        )
    try:
        return models[envelope.detail_type].model_validate(envelope.detail)
    except ValidationError as e:
        raise InvalidEventError(f"malformed {envelope.detail_type!r} detail: {_first(e)}") from e


def _first(e: Any) -> str:
    errors = e.errors() if hasattr(e, "errors") else []
    if not errors:
        return str(e)
    where = ".".join(str(p) for p in errors[0].get("loc", ())) or "event"
    return f"{where}: {errors[0].get('msg')}"


@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        s = current_settings()
        metrics.add_dimensions(consumer=s.consumer)
        detail = parse_detail(event)
        IDEMPOTENCY.register_lambda_context(context)
        result = _reporter()(event=event)
    except InvalidEventError as e:
        logger.error("rejected event", extra={"error": str(e)})
        metrics.add_metric(name="InvalidEvents", unit=MetricUnit.Count, value=1)
        return {"status": "rejected", "reason": str(e)}
    except PermanentError as e:
        logger.error("report failed permanently", extra={"error": str(e), "error_type": type(e).__name__})
        metrics.add_metric(name="ReportErrors", unit=MetricUnit.Count, value=1)
        return {"status": "error", "reason": str(e)}
    logger.info("cost report", extra={"report": result})
    if result.get("report_status") == "completed":
        c = detail.cost
        metrics.add_metric(name="RowsProcessed", unit=MetricUnit.Count, value=detail.rows)
        metrics.add_metric(name="RowsNotOk", unit=MetricUnit.Count, value=detail.rows_error)
        metrics.add_metric(name="OutputTokens", unit=MetricUnit.Count, value=detail.tokens.output)
        metrics.add_metric(name="GpuSeconds", unit=MetricUnit.Seconds, value=c.gpu_lifetime_seconds)
        metrics.add_metric(name="CostUsd", unit=MetricUnit.NoUnit, value=c.lifetime_cost)
        if c.usd_per_1k_rows is not None:
            metrics.add_metric(name="CostPer1kRowsUsd", unit=MetricUnit.NoUnit, value=c.usd_per_1k_rows)
    else:
        metrics.add_metric(name="JobFailures", unit=MetricUnit.Count, value=1)
    return result
