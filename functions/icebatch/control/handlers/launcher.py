"""The launcher Lambda: parse the trigger, make one launch decision per consumer, log them, return them.

Permanent errors (a malformed event, bad configuration, missing permissions, a consumer refused by the gate
such as ``source_replaced``) are logged with context, counted (``LaunchErrors``, ``InvalidEvents``: alarmed
in template.yaml) and answered without raising,
so that neither Lambda's async retries nor EventBridge turn them into a retry storm. Transient errors
(catalog or Kubernetes API unavailable) are counted (``TransientErrors``) and raised: the platform
retries, then the on-failure destination keeps the event.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from icebatch.control.gate import REFUSALS
from icebatch.control.handlers import consumer_metrics, count_retry, environment_settings
from icebatch.control.launcher import LaunchDecision, LaunchOutcome
from icebatch.control.triggers import Trigger, parse_trigger
from icebatch.core.errors import InvalidEventError, PermanentError, TransientError
from icebatch.core.settings import Settings

logger = Logger(service="icebatch-launcher")
tracer = Tracer(service="icebatch-launcher")
metrics = Metrics(service="launcher")  # namespace: POWERTOOLS_METRICS_NAMESPACE (icebatch/<stack> in AWS)


@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def lambda_handler(event: Any, context: LambdaContext, settings: Settings | None = None) -> dict[str, Any]:
    try:
        trigger = parse_trigger(event)
        outcomes = run(trigger, settings or environment_settings())
    except InvalidEventError as e:
        logger.error("rejected event", extra={"error": str(e)})
        metrics.add_metric(name="InvalidEvents", unit=MetricUnit.Count, value=1)
        return {"status": "rejected", "reason": str(e), "decisions": [], "manifests": []}
    except TransientError as e:  # the platform retries
        count_retry(logger, metrics, "launch", e)
        raise
    except PermanentError as e:
        logger.error("launch failed permanently", extra={"error": str(e), "error_type": type(e).__name__})
        metrics.add_metric(name="LaunchErrors", unit=MetricUnit.Count, value=1)
        return {"status": "error", "reason": str(e), "error_type": type(e).__name__, "decisions": [], "manifests": []}
    metrics.add_metric(name="Decisions", unit=MetricUnit.Count, value=len(outcomes))
    for outcome in outcomes:
        record = outcome.decision.model_dump(mode="json")
        if outcome.decision.decision in REFUSALS:  # permanent: an operator must act (alarmed as a launch error)
            logger.error("launch refused", extra={"launch_decision": record})
            metrics.add_metric(name="LaunchErrors", unit=MetricUnit.Count, value=1)
        else:
            logger.info("launch decision", extra={"launch_decision": record})
        count(outcome.decision)
    return {
        "status": "ok",
        "decisions": [o.decision.model_dump(mode="json") for o in outcomes],
        "manifests": [o.manifest for o in outcomes],
    }


@tracer.capture_method
def run(trigger: Trigger, settings: Settings) -> list[LaunchOutcome]:
    """Reconcile on the nightly schedule, then decide for every consumer the trigger concerns."""
    from icebatch.control.backends import load_backend
    from icebatch.control.launcher import launch
    from icebatch.control.reconcile import reconcile
    from icebatch.core.bus import load_publisher
    from icebatch.core.catalog import open_catalog
    from icebatch.core.consumers import load_consumers

    consumers = load_consumers(settings)
    catalog = open_catalog(settings, control_plane=True)
    backend, publisher = load_backend(settings), load_publisher(settings)
    if trigger.kind == "schedule" and not (trigger.dry_run or settings.launch.dry_run):
        summary = reconcile(settings, consumers, catalog=catalog, backend=backend, publisher=publisher)
        logger.info("reconciled", extra={"reconcile": summary.to_dict()})
        if summary.reported_failures:
            metrics.add_metric(
                name="SilentFailuresReported", unit=MetricUnit.Count, value=len(summary.reported_failures)
            )
    return launch(trigger, settings, consumers, catalog=catalog, backend=backend, publisher=publisher)


def count(d: LaunchDecision) -> None:
    with consumer_metrics(metrics, d.consumer) as m:
        m.add_metric(name="BacklogRows", unit=MetricUnit.Count, value=d.backlog_rows)
        m.add_metric(name=f"Decision_{d.decision}", unit=MetricUnit.Count, value=1)
        if d.oldest_unprocessed_age_seconds is not None:
            m.add_metric(name="OldestUnprocessedAge", unit=MetricUnit.Seconds, value=d.oldest_unprocessed_age_seconds)
        if d.over_budget:
            m.add_metric(name="BudgetRefusals", unit=MetricUnit.Count, value=1)
        if d.spent_today_usd is not None:  # the daily spend against the budget (the dashboard's "spend" panel)
            m.add_metric(name="SpentTodayUsd", unit=MetricUnit.NoUnit, value=d.spent_today_usd)
        if d.max_usd_per_day is not None:
            m.add_metric(name="BudgetPerDayUsd", unit=MetricUnit.NoUnit, value=d.max_usd_per_day)
        if d.decision == "launch":
            m.add_metric(name="JobsLaunched", unit=MetricUnit.Count, value=1)
            m.add_metric(name="GpusRequested", unit=MetricUnit.Count, value=d.gpus or 0)
