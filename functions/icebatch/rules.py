"""EventBridge rule patterns and the nightly schedule: the one source of truth.

``eventbridge/patterns/*.json`` and ``eventbridge/schedules/*.json`` are written from here by
``icebatch contracts write``; template.yaml carries the same patterns with ``!Ref`` where these have
``${Parameter}`` placeholders, and tests/contract/ proves all three agree. The local bus applies the
same patterns with the placeholders filled from the settings.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from icebatch.events import EVENT_SOURCE, BatchJobCompleted, BatchJobFailed
from icebatch.triggers import GLUE_APPEND_CHANGES, GLUE_DETAIL_TYPE

# Placeholders are CloudFormation parameter names of template.yaml.
PATTERNS: dict[str, dict[str, Any]] = {
    "reporter": {
        "source": [EVENT_SOURCE],
        "detail-type": [BatchJobCompleted.detail_type, BatchJobFailed.detail_type],
    },
    "launcher-glue-table-change": {
        "source": ["aws.glue"],
        "detail-type": [GLUE_DETAIL_TYPE],
        "detail": {
            "databaseName": ["${SourceDatabase}"],
            "tableName": ["${SourceTableName}"],
            "typeOfChange": list(GLUE_APPEND_CHANGES),
        },
    },
    "launcher-s3-metadata-object": {
        "source": ["aws.s3"],
        "detail-type": ["Object Created"],
        "detail": {
            "bucket": {"name": ["${WarehouseBucket}"]},
            # a commit writes manifests (.avro) before its metadata file: only the metadata file means a commit
            "object": {"key": [{"wildcard": "${SourceTablePrefix}metadata/*.metadata.json"}]},
        },
    },
}

SCHEDULES: dict[str, dict[str, Any]] = {
    "nightly": {
        "ScheduleExpression": "${ScheduleExpression}",
        "ScheduleExpressionTimezone": "UTC",
        "Input": {"trigger": "schedule", "schedule": "nightly"},
        "Default": "cron(0 2 * * ? *)",
    },
}

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9]+)\}")


def fill(pattern: Any, values: dict[str, str]) -> Any:
    """The pattern with ``${Name}`` placeholders replaced (the local bus, and the tests)."""
    if isinstance(pattern, dict):
        return {k: fill(v, values) for k, v in pattern.items()}
    if isinstance(pattern, list):
        return [fill(v, values) for v in pattern]
    if isinstance(pattern, str):
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], pattern)
    return copy.deepcopy(pattern)


def placeholders(pattern: Any) -> set[str]:
    if isinstance(pattern, dict):
        return set().union(*(placeholders(v) for v in pattern.values())) if pattern else set()
    if isinstance(pattern, list):
        return set().union(*(placeholders(v) for v in pattern)) if pattern else set()
    if isinstance(pattern, str):
        return set(_PLACEHOLDER.findall(pattern))
    return set()
