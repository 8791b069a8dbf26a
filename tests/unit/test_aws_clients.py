"""Every AWS client icebatch makes retries a bounded number of times, with bounded timeouts."""

from __future__ import annotations

import pytest
from icebatch.core.aws_clients import aws_client
from icebatch.core.settings import Settings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("service", ["dynamodb", "sns", "events", "s3"])
def test_clients_retry_three_times_with_timeouts(service: str) -> None:
    # given the settings of a deployment (botocore alone would retry DynamoDB 10 times, 60-second timeouts)
    settings = Settings(aws_region="us-east-1", aws_endpoint_url="http://127.0.0.1:9")
    # when icebatch makes a client, then its retries and timeouts are bounded, at the settings' endpoint
    config = aws_client(service, settings).meta.config
    assert (config.retries["mode"], config.retries["total_max_attempts"]) == ("standard", 4)  # 1 + 3 retries
    assert (config.connect_timeout, config.read_timeout) == (5, 30)
    assert aws_client(service, settings).meta.endpoint_url == "http://127.0.0.1:9"
