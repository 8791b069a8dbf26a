"""RayJob objects read back: their state (KubeRay's two status fields) and what icebatch labelled them with."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from icebatch.control.rayjob import LABEL

TERMINAL_DEPLOYMENT = {"Complete", "Failed", "ValidationFailed"}
TERMINAL_JOB = {"SUCCEEDED", "FAILED", "STOPPED"}


@dataclass(frozen=True)
class JobState:
    name: str
    deployment: str | None
    consumer: str | None
    from_tag: str | None
    attempt: int
    deployment_status: str
    job_status: str
    reason: str
    message: str
    start_time: str | None
    end_time: str | None
    annotations: dict[str, str]

    @property
    def terminal(self) -> bool:
        # a stopped or failed Ray job can show jobDeploymentStatus "Complete": read both fields
        return self.deployment_status in TERMINAL_DEPLOYMENT or self.job_status in TERMINAL_JOB

    @property
    def succeeded(self) -> bool:
        return self.job_status == "SUCCEEDED" and self.deployment_status not in {"Failed", "ValidationFailed"}

    @property
    def failed(self) -> bool:
        return self.terminal and not self.succeeded

    @property
    def failure_reason(self) -> str:
        parts = [p for p in (self.reason, self.job_status, self.message) if p]
        return ": ".join(parts) or self.deployment_status or "unknown"


def job_state(obj: dict[str, Any]) -> JobState:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    lab = meta.get("labels") or {}
    try:
        attempt = int(lab.get(f"{LABEL}/attempt", "1"))
    except ValueError:
        attempt = 1
    return JobState(
        name=meta.get("name", ""),
        deployment=lab.get(f"{LABEL}/deployment"),
        consumer=lab.get(f"{LABEL}/consumer"),
        from_tag=lab.get(f"{LABEL}/from"),
        attempt=attempt,
        deployment_status=status.get("jobDeploymentStatus") or "",
        job_status=status.get("jobStatus") or "",
        reason=status.get("reason") or "",
        message=status.get("message") or "",
        start_time=status.get("startTime"),
        end_time=status.get("endTime"),
        annotations=dict(meta.get("annotations") or {}),
    )


_RIDER = re.compile(r"([a-z][a-z0-9-]{0,19})/([0-9a-f]{10})/a([0-9]{1,3})")


def members(job: JobState) -> list[JobState]:
    """A job as each consumer it runs for sees it: a shared job (``icebatch.control.rayjob.shared_with``) is also
    each other consumer's job, from that consumer's range and attempt, with its own run's annotations
    (``icebatch.control.rayjob.shared_runs``; none where they are missing); what it says otherwise is ignored."""
    riders = job.annotations.get(f"{LABEL}/shared-with", "")
    found = [_RIDER.fullmatch(part) for part in riders.split(",") if part]
    runs = _shared_runs(job.annotations.get(f"{LABEL}/shared-runs", ""))
    first = {k: v for k, v in job.annotations.items() if k not in _RUN_KEYS}
    return [
        job,
        *(
            replace(job, consumer=m[1], from_tag=m[2], attempt=int(m[3]), annotations={**first, **runs.get(m[1], {})})
            for m in found
            if m
        ),
    ]


_RUN_KEYS = {
    f"{LABEL}/{key}" for key in ("run-id", "source-table", "task", "from-snapshot", "to-snapshot", "backlog-rows")
}


def _shared_runs(text: str) -> dict[str, dict[str, str]]:
    """The ``shared-runs`` annotation read back: each consumer's run annotations; what is not one is left out."""
    try:
        parsed = json.loads(text) if 0 < len(text) <= 65536 else {}
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {
        name: {
            f"{LABEL}/{k}": v
            for k, v in run.items()
            if f"{LABEL}/{k}" in _RUN_KEYS and isinstance(v, str) and len(v) <= 512
        }
        for name, run in parsed.items()
        if isinstance(run, dict)
    }
