"""Idempotency stores for the reporter (EventBridge delivers at least once).

AWS: Powertools' DynamoDB persistence layer (``ICEBATCH_IDEMPOTENCY_TABLE``). Embedded default: a
folder of JSON records under ``$ICEBATCH_HOME/idempotency`` (``icebatch.tools.local_reports``).
"""

from __future__ import annotations

from aws_lambda_powertools.utilities.idempotency import BasePersistenceLayer

from icebatch.core.aws_clients import aws_client
from icebatch.core.bus import load_adapter
from icebatch.core.settings import Settings

FILE_PERSISTENCE = "icebatch.tools.local_reports:file_persistence"


def persistence_for(settings: Settings) -> BasePersistenceLayer:
    """DynamoDB when a table is configured; else records in a local folder (tooling)."""
    if settings.aws.idempotency_table:
        from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

        client = aws_client("dynamodb", settings)
        return DynamoDBPersistenceLayer(table_name=settings.aws.idempotency_table, boto3_client=client)
    layer: BasePersistenceLayer = load_adapter(
        FILE_PERSISTENCE, "local idempotency records (no ICEBATCH_IDEMPOTENCY_TABLE)"
    )(settings)
    return layer
