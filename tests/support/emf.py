"""What a Lambda handler published through powertools: the metric names in the EMF lines it printed."""

from __future__ import annotations

import json


def metric_names(stdout: str) -> set[str]:
    """The names of every metric in the Embedded Metric Format lines of ``stdout``."""
    return {
        metric["Name"]
        for line in stdout.splitlines()
        if line.startswith("{") and "_aws" in line
        for directive in json.loads(line)["_aws"]["CloudWatchMetrics"]
        for metric in directive["Metrics"]
    }
