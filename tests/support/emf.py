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


def published(stdout: str) -> set[tuple[str, frozenset[str], str]]:
    """Every metric in the EMF lines of ``stdout`` as CloudWatch stores it: (the ``service`` dimension's value, the
    dimension names it is published with, its name). A query with ``matchExact`` finds it only by all of them."""
    found = set()
    for line in stdout.splitlines():
        if not (line.startswith("{") and "_aws" in line):
            continue
        document = json.loads(line)
        for directive in document["_aws"]["CloudWatchMetrics"]:
            for dimensions in directive["Dimensions"]:
                for metric in directive["Metrics"]:
                    found.add((document.get("service", ""), frozenset(dimensions), metric["Name"]))
    return found
