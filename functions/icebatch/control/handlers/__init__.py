"""Lambda entry points: thin handlers that parse an event, call one function and return.

Each ``lambda_handler(event, context, settings=None)`` uses the settings it is handed (the CLI, the
local bus, tests) or, in Lambda, ``environment_settings()``: built from the environment once per
container. Nothing overwrites them.

Metrics: permanent errors are answered without a retry (a retry cannot succeed), so no dead letter
records them; they are counted with the ``service`` dimension alone, which template.yaml's alarms
watch (``PERMANENT_ERROR_METRICS``). A call the deployment refuses (``RefusedError``: a grant, a resource
gone) is counted the same way, and raised, so that the platform keeps the input for a re-drive once fixed.
Transient errors are raised for Lambda to retry, counted first (``count_retry``: ``TransientErrors``) so
that retries show before dead letters. Per-consumer figures are published per consumer
(``consumer_metrics``), with the consumer as a dimension.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import EphemeralMetrics, Metrics, MetricUnit

from icebatch.core.settings import Settings

PERMANENT_ERROR_METRICS = {
    "launcher": ("LaunchErrors", "InvalidEvents"),
    "reporter": ("ReportErrors", "InvalidEvents"),
}


TRANSIENT_ERROR_METRIC = "TransientErrors"


def count_retry(logger: Logger, metrics: Metrics, what: str, error: Exception) -> None:
    """Log and count a transient failure of ``what`` that the caller re-raises for Lambda to retry."""
    logger.warning(f"{what} failed, to be retried", extra={"error": str(error), "error_type": type(error).__name__})
    metrics.add_metric(name=TRANSIENT_ERROR_METRIC, unit=MetricUnit.Count, value=1)


@functools.cache
def environment_settings() -> Settings:
    """The container's settings, from its environment (a ConfigError is not cached: it is raised again)."""
    return Settings.from_env()


@contextmanager
def consumer_metrics(metrics: Metrics, consumer: str) -> Iterator[EphemeralMetrics]:
    """A metric set of one consumer, flushed as its own EMF document (dimensions: service, consumer)."""
    scoped = EphemeralMetrics(namespace=metrics.namespace, service=metrics.service)
    scoped.add_dimension(name="consumer", value=consumer)
    yield scoped
    scoped.flush_metrics()
