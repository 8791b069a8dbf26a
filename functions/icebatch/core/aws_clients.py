"""AWS clients as every icebatch function makes them: bounded retries and timeouts, the settings' region
and endpoint.

botocore's defaults retry DynamoDB 10 times and the other services 5 ("legacy" mode), with 60-second
timeouts: an unreachable idempotency table held the reporter for half a minute before it failed. A
Lambda has seconds; Lambda retries the invocation itself.
"""

from __future__ import annotations

from typing import Any

from icebatch.core.settings import Settings

MAX_RETRIES = 3  # after the first attempt (botocore's ``max_attempts`` in ``retries`` counts the retries alone)
CONNECT_TIMEOUT_SECONDS = 5
READ_TIMEOUT_SECONDS = 30


def bounded_config(**changes: Any) -> Any:
    """A botocore ``Config`` with icebatch's retries and timeouts (``changes``: other options)."""
    from botocore.config import Config

    return Config(
        retries={"max_attempts": MAX_RETRIES, "mode": "standard"},
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS,
        **changes,
    )


def aws_client(service: str, settings: Settings) -> Any:
    """A boto3 client for ``service`` in the settings' region, at their endpoint override if any."""
    import boto3

    return boto3.client(
        service,
        region_name=settings.aws.aws_region,
        endpoint_url=settings.aws.aws_endpoint_url,
        config=bounded_config(),
    )


def unreachable(error: BaseException) -> bool:
    """An AWS call that got no answer: refused, reset, or timed out connecting or reading (a retry may help).

    botocore's ``EndpointConnectionError`` is only the first of these; a timeout is another class.
    """
    from botocore.exceptions import ConnectionError, HTTPClientError

    return isinstance(error, (ConnectionError, HTTPClientError))
