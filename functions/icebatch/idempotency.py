"""Idempotency stores for the reporter (EventBridge delivers at least once).

AWS: Powertools' DynamoDB persistence layer (``ICEBATCH_IDEMPOTENCY_TABLE``). Embedded default: a
folder of JSON records under ``$ICEBATCH_HOME/idempotency``, created exclusively so that two deliveries
of one event cannot both win.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from aws_lambda_powertools.utilities.idempotency import BasePersistenceLayer
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord

from icebatch.settings import Settings


class FilePersistenceLayer(BasePersistenceLayer):
    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def _path(self, key: str) -> Path:
        return self.folder / (hashlib.sha256(key.encode()).hexdigest() + ".json")

    def _get_record(self, idempotency_key: str) -> DataRecord:
        try:
            data = json.loads(self._path(idempotency_key).read_text())
        except FileNotFoundError as e:
            raise IdempotencyItemNotFoundError from e
        return DataRecord(**data)

    def _put_record(self, data_record: DataRecord) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(data_record.idempotency_key)
        if path.exists():
            existing = DataRecord(**json.loads(path.read_text()))
            if not existing.is_expired:
                raise IdempotencyItemAlreadyExistsError(old_data_record=existing)
            path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "w") as f:
            json.dump(_as_dict(data_record), f)

    def _update_record(self, data_record: DataRecord) -> None:
        tmp = self._path(data_record.idempotency_key).with_suffix(".tmp")
        tmp.write_text(json.dumps(_as_dict(data_record)))
        tmp.replace(self._path(data_record.idempotency_key))

    def _delete_record(self, data_record: DataRecord) -> None:
        self._path(data_record.idempotency_key).unlink(missing_ok=True)


def _as_dict(r: DataRecord) -> dict[str, Any]:
    return {
        "idempotency_key": r.idempotency_key,
        "status": r.status,
        "expiry_timestamp": r.expiry_timestamp,
        "in_progress_expiry_timestamp": r.in_progress_expiry_timestamp,
        "response_data": r.response_data,
        "payload_hash": r.payload_hash,
    }


def persistence_for(settings: Settings) -> BasePersistenceLayer:
    if settings.idempotency_table:
        import boto3
        from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

        client = boto3.client("dynamodb", region_name=settings.aws_region, endpoint_url=settings.aws_endpoint_url)
        return DynamoDBPersistenceLayer(table_name=settings.idempotency_table, boto3_client=client)
    return FilePersistenceLayer(settings.home_abs / "idempotency")
