"""The launcher Lambda: parse the trigger, make one launch decision, log it, return it.

Permanent errors (a malformed event, bad configuration, missing permissions) are logged with context,
counted, and answered without raising, so that neither Lambda's async retries nor EventBridge turn
them into a retry storm. Transient errors (catalog or Kubernetes API unavailable) are raised: the
platform retries, then the on-failure destination keeps the event.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from icebatch.errors import InvalidEventError, PermanentError
from icebatch.handlers import current_settings
from icebatch.settings import Settings

logger = Logger(service="icebatch-launcher")
tracer = Tracer(service="icebatch-launcher")
metrics = Metrics(service="launcher")  # namespace: POWERTOOLS_METRICS_NAMESPACE (icebatch/<stack> in AWS)


@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    from icebatch.triggers import parse_trigger

    try:
        s = current_settings()
        metrics.add_dimensions(consumer=s.consumer)
        trigger = parse_trigger(event)
        outcome = _launch(trigger, s)
    except InvalidEventError as e:
        logger.error(
            "rejected event",
            extra={"error": str(e), "event_keys": sorted(event)[:10] if isinstance(event, dict) else None},
        )
        metrics.add_metric(name="InvalidEvents", unit=MetricUnit.Count, value=1)
        return {"decision": {"decision": "rejected", "reason": str(e)}, "manifest": None}
    except PermanentError as e:
        logger.error("launch failed permanently", extra={"error": str(e), "error_type": type(e).__name__})
        metrics.add_metric(name="LaunchErrors", unit=MetricUnit.Count, value=1)
        return {
            "decision": {"decision": "error", "reason": str(e), "error_type": type(e).__name__},
            "manifest": None,
        }

    d = outcome.decision
    logger.info("launch decision", extra={"launch_decision": d.model_dump(mode="json")})
    metrics.add_metric(name="BacklogRows", unit=MetricUnit.Count, value=d.backlog_rows)
    metrics.add_metric(name=f"Decision_{d.decision}", unit=MetricUnit.Count, value=1)
    if d.oldest_unprocessed_age_seconds is not None:
        metrics.add_metric(name="OldestUnprocessedAge", unit=MetricUnit.Seconds, value=d.oldest_unprocessed_age_seconds)
    if d.decision == "launch":
        metrics.add_metric(name="JobsLaunched", unit=MetricUnit.Count, value=1)
        metrics.add_metric(name="GpusRequested", unit=MetricUnit.Count, value=d.gpus or 0)
    return outcome.response()


@tracer.capture_method
def _launch(trigger: Any, s: Settings) -> Any:
    from icebatch.backends import load_backend
    from icebatch.bus import load_publisher
    from icebatch.launcher import launch
    from icebatch.ledger import open_ledger
    from icebatch.reconcile import reconcile

    ledger = open_ledger(s, control_plane=True)
    backend = load_backend(s)
    publisher = load_publisher(s)
    if trigger.kind == "schedule" and not (trigger.dry_run or s.dry_run):
        summary = reconcile(s, backend=backend, ledger=ledger, publisher=publisher)
        if summary.reported_failures:
            metrics.add_metric(
                name="SilentFailuresReported", unit=MetricUnit.Count, value=len(summary.reported_failures)
            )
        logger.info("reconciled", extra={"reconcile": summary.to_dict()})
    return launch(trigger, s, ledger=ledger, backend=backend, publisher=publisher)
