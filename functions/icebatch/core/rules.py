"""EventBridge rule patterns and the nightly schedule: the one source of truth.

``eventbridge/patterns/*.json`` and ``eventbridge/schedules/*.json`` are written from here by
``icebatch contracts write``; template.yaml carries the same patterns with ``!Ref`` where these have
``${Parameter}`` placeholders, and tests/contract/ proves all three agree. The local bus applies the
same patterns with the placeholders filled from the settings.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from icebatch.core.events import EVENT_SOURCE, BatchJobCompleted, BatchJobDeferred, BatchJobFailed

GLUE_DETAIL_TYPE = "Glue Data Catalog Table State Change"
# A commit through an Iceberg catalog on Glue (pyiceberg, Spark, Trino, Athena) replaces the table's
# metadata_location: "UpdateTable". Creating a table arrives as a *Database* State Change ("CreateTable")
# and adds no rows; partition changes do not concern Iceberg tables.
GLUE_APPEND_CHANGES = ("UpdateTable",)

# Placeholders are CloudFormation parameter names of template.yaml (and the pseudo parameter AWS::StackName,
# which the local bus fills with ICEBATCH_DEPLOYMENT).
PATTERNS: dict[str, dict[str, Any]] = {
    # a deployment reports only its own runs: two stacks in one account do not cross-talk
    "reporter": {
        "source": [EVENT_SOURCE],
        "detail-type": [BatchJobCompleted.detail_type, BatchJobFailed.detail_type],
        "detail": {"deployment": ["${AWS::StackName}"]},
    },
    # a run given no model that found changed rows: the range's next attempt, with the model, at once
    "launcher-deferred-run": {
        "source": [EVENT_SOURCE],
        "detail-type": [BatchJobDeferred.detail_type],
        "detail": {"deployment": ["${AWS::StackName}"]},
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

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9:]+)\}")


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


# ---------------------------------------------------------------------------------------------------
# EventBridge pattern matching (the subset icebatch's rules use): the local bus and the tests
# ---------------------------------------------------------------------------------------------------
def matches(pattern: Mapping[str, Any], event: Mapping[str, Any]) -> bool:
    """Whether ``event`` matches an EventBridge ``pattern``.

    Supported: nested objects, lists of allowed values, ``{"prefix": ...}``, ``{"suffix": ...}``,
    ``{"anything-but": ...}``, ``{"exists": bool}``, and ``{"wildcard": ...}`` with ``*``.
    """
    for key, expected in pattern.items():
        present = isinstance(event, Mapping) and key in event
        value = event.get(key) if present else None
        if isinstance(expected, Mapping):
            if not present or not isinstance(value, Mapping) or not matches(expected, value):
                return False
            continue
        if not isinstance(expected, list):
            raise ValueError(f"pattern value for {key!r} must be a list or an object, got {expected!r}")
        if not _match_any(expected, value, present):
            return False
    return True


def _match_any(options: list[Any], value: Any, present: bool) -> bool:
    values = value if isinstance(value, list) else [value]
    for option in options:
        if isinstance(option, Mapping):
            if "exists" in option:
                if bool(option["exists"]) == present:
                    return True
                continue
            if not present:
                continue
            if any(_match_operator(option, v) for v in values):
                return True
        elif present and option in values:
            return True
    return False


def _match_operator(option: Mapping[str, Any], value: Any) -> bool:
    import fnmatch

    if "prefix" in option:
        return isinstance(value, str) and value.startswith(option["prefix"])
    if "suffix" in option:
        return isinstance(value, str) and value.endswith(option["suffix"])
    if "wildcard" in option:
        return isinstance(value, str) and fnmatch.fnmatchcase(value, option["wildcard"])
    if "anything-but" in option:
        excluded = option["anything-but"]
        excluded = excluded if isinstance(excluded, list) else [excluded]
        return value not in excluded
    raise ValueError(f"unsupported pattern operator {dict(option)!r}")
