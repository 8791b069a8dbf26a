"""The embedded default's reports: printed and filed under ``$ICEBATCH_HOME/reports``, once per run.

The reporter's local stand-ins for SNS (``FileNotifier``) and DynamoDB (``FilePersistenceLayer``, for
Powertools' idempotency: a folder of JSON records, created exclusively so that two deliveries of one
event cannot both win). Loaded by name by ``icebatch.control.reporter`` and
``icebatch.control.idempotency`` when no topic or table is configured.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aws_lambda_powertools.utilities.idempotency import BasePersistenceLayer
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord

from icebatch.control.reporter import CostReport, Notifier
from icebatch.core.bus import JOB_PRINTED_ITS_REPORT
from icebatch.core.errors import PermanentError
from icebatch.core.settings import Settings
from icebatch.core.terminal import console
from icebatch.core.untrusted import summarize


class FileNotifier(Notifier):
    """The embedded default: print the report and keep it under ``reports/``."""

    def __init__(self, folder: Path, out: Callable[[str], None] = console.say) -> None:
        self.folder = folder
        self.out = out

    def notify(self, report: CostReport) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        stem = f"{report.key}.{report.status}"
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,140}", stem) or ".." in stem:
            raise PermanentError(
                f"report key {summarize(report.key, 40)!r} is not a file name (run ids are checked "
                "by the event contracts; this one was not)"
            )
        (self.folder / f"{stem}.txt").write_text(f"Subject: {report.subject}\n\n{report.text}\n")
        (self.folder / f"{stem}.json").write_text(
            json.dumps({"subject": report.subject, "attributes": report.attributes, **report.data}, indent=2)
        )
        if report.status == "completed" and JOB_PRINTED_ITS_REPORT.get():  # the job printed it just above
            self.out(f"[report] {report.subject}: written to {self.folder / stem}.txt")
        else:
            self.out(f"\n[report] {report.subject}\n{report.text}\n[report written to {self.folder / stem}.txt]")
        return stem


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


def file_notifier(settings: Settings) -> FileNotifier:
    return FileNotifier(settings.reports_dir)


def file_persistence(settings: Settings) -> FilePersistenceLayer:
    return FilePersistenceLayer(settings.home / "idempotency")
