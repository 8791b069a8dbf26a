"""The embedded default's backend: jobs on this machine, with the same idempotency rules as KubeRay.

Each job has a record ``$ICEBATCH_HOME/jobs/<name>.json``, created exclusively (the analogue of 409
AlreadyExists). ``ICEBATCH_LOCAL_MODE`` chooses how the job runs:

- ``inprocess`` (default, the demo): ``icebatch_job.job.run_job`` in the launcher's own process; the
  launch returns when the job has finished.
- ``ray-jobs``: submitted to a Ray cluster through Ray's job submission API (``ICEBATCH_RAY_ADDRESS``, or the
  home's own head, started on demand), with the job's name as submission id; the launch returns at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icebatch.control.backends import JobBackend, Submission
from icebatch.control.jobs import JobState
from icebatch.control.rayjob import JobSpec, job_env, labels
from icebatch.core.consumers import job_consumers_json
from icebatch.core.errors import ClusterUnavailableError, ConfigError
from icebatch.core.settings import Settings, ensure_folder
from icebatch.core.untrusted import one_line

if TYPE_CHECKING:
    from icebatch_job.process.interrupts import Interrupts

log = logging.getLogger(__name__)

HEAD_RECORD = "ray-head.json"  # under the home: where the home's own Ray head listens
SUBMIT_PATIENCE_SECONDS = 120

_RAY_STATUS = {  # Ray job status -> (jobDeploymentStatus, jobStatus), as KubeRay reports them
    "PENDING": ("Initializing", "PENDING"),
    "RUNNING": ("Running", "RUNNING"),
    "SUCCEEDED": ("Complete", "SUCCEEDED"),
    "FAILED": ("Failed", "FAILED"),
    "STOPPED": ("Complete", "STOPPED"),
}


class LocalBackend(JobBackend):
    def __init__(self, settings: Settings, *, ray_client: Any = None) -> None:
        self.settings = settings
        self.dir = settings.home / "jobs"
        self._ray_client = ray_client
        self._address = settings.launch.ray_address

    # --------------------------------------------------------------------------------------------
    def list_jobs(self, deployment: str) -> list[JobState]:
        if not self.dir.exists():
            return []
        states = []
        for path in sorted(self.dir.glob("*.json")):
            record = _read(path)
            if record is None or record.get("deployment", "local") != deployment:
                continue
            self._refresh(path, record)
            states.append(_state(record))
        return states

    def submit(self, manifest: dict[str, Any], spec: JobSpec) -> Submission:
        ensure_folder(self.dir)
        path = self.dir / f"{spec.name}.json"
        record = {
            "name": spec.name,
            "deployment": spec.deployment,
            "consumer": spec.consumer.name,
            "run_id": spec.run_id,
            "from_tag": spec.tag,
            "attempt": spec.attempt,
            "mode": self.settings.launch.local_mode,
            "status": "RUNNING",
            "pid": os.getpid(),
            "pid_started": _process_started(os.getpid()),
            "start_time": _now(),
            "annotations": dict(manifest["metadata"].get("annotations", {})),
            "labels": labels(spec.deployment, spec.consumer.name, spec.tag, spec.attempt),
        }
        try:
            with path.open("x") as f:  # exclusive create: the local 409
                json.dump(record, f)
        except FileExistsError:
            return Submission(spec.name, created=False, detail="job record exists")
        if self.settings.launch.local_mode == "ray-jobs":
            try:
                self._submit_ray(spec, record)
            except BaseException:
                path.unlink(missing_ok=True)  # nothing was submitted: do not block the name
                raise
            _write(path, record)
            return Submission(spec.name, created=True, detail=f"submitted to Ray at {self._ray_address()}")
        return Submission(spec.name, created=True, detail="created; runs in-process")

    def start(self, spec: JobSpec) -> str | None:
        if self.settings.launch.local_mode != "inprocess":
            return None
        path = self.dir / f"{spec.name}.json"
        record = _read(path)
        assert record is not None
        return self._run_inprocess(spec, path, record).detail

    def annotate(self, name: str, annotations: dict[str, str]) -> None:
        path = self.dir / f"{name}.json"
        record = _read(path)
        if record is None:
            return
        record.setdefault("annotations", {}).update(annotations)
        _write(path, record)

    def delete(self, name: str) -> None:
        (self.dir / f"{name}.json").unlink(missing_ok=True)

    # --------------------------------------------------------------------------------------------
    def _run_inprocess(self, spec: JobSpec, path: Path, record: dict[str, Any]) -> Submission:
        from icebatch_job.job import JobRequest
        from icebatch_job.shared import run_request

        from icebatch.core.terminal import console
        from icebatch.tools.run_log import to_run_log

        settings = self.settings.with_overrides(
            concurrency=spec.gpus, job_consumer=job_consumers_json(spec.consumers)
        )  # no ICEBATCH_JOB_LAUNCHED_AT: the job starts in this process now, nothing comes before it
        riders = tuple(
            JobRequest(
                run_id=r.run_id,
                from_snapshot=r.from_snapshot,
                to_snapshot=r.to_snapshot,
                rayjob_name=spec.name,
                consumer=r.consumer.name,
                linger=False,
            )
            for r in spec.riders
        )
        request = JobRequest(
            run_id=spec.run_id,
            from_snapshot=spec.from_snapshot,
            to_snapshot=spec.to_snapshot,
            rayjob_name=spec.name,
            consumer=spec.consumer.name,
            shared_with=riders,  # the job lingers for all (only where each consumer sets linger_seconds, locally)
        )
        log_path = path.with_suffix(".log")  # the job's console, kept as a pod log would be
        record["log"] = str(log_path)

        def job_log(text: str) -> None:
            with log_path.open("a") as f:
                f.write(text + "\n")

        # the decision is printed when the launcher returns, after the job: say now what runs, and where it writes
        shared = f" with {', '.join(r.consumer.name for r in spec.riders)} (one engine)" if spec.riders else ""
        console.phase(
            f"{spec.consumer.name}: job {spec.name} runs here now{shared} ({spec.backlog_rows:,} rows, attempt "
            f"{spec.attempt}); its console: {log_path}"
        )
        interrupts = _interrupts(settings)
        _import_ray_untagged()
        try:
            with to_run_log(log_path):  # Ray's, vLLM's and the reporter's records: the console file, as a pod's log
                result = run_request(settings, request, out=job_log, interrupts=interrupts)
        except BaseException as e:
            message = one_line(str(e), 500)
            record.update(status="FAILED", reason=type(e).__name__, message=message, end_time=_now())
            _write(path, record)
            if isinstance(e, Exception):
                log.error("local job %s failed: %s (its log: %s)", spec.name, message, log_path)
                return Submission(spec.name, created=True, detail=f"ran in-process: failed ({type(e).__name__})")
            raise
        finally:
            if interrupts is not None:
                interrupts.uninstall()
        # a shared job whose run failed (the others' went on) failed, as its RayJob would: that run's attempts count
        status = {"failed": "FAILED", "conflict": "STOPPED"}.get(result.job_status, "SUCCEEDED")
        record.update(status=status, end_time=_now(), outcome=result.job_status)
        _write(path, record)
        return Submission(spec.name, created=True, detail=f"ran in-process: {result.job_status}")

    def _ray_address(self) -> str:
        return self._address or self.settings.launch.ray_address or own_head(self.settings) or "(no Ray head)"

    def _client(self, *, start_head: bool = True) -> Any:
        """Ray's job client: for ``ICEBATCH_RAY_ADDRESS``, or else for the home's own head, started if asked.

        Never whatever answers on Ray's default port: a notebook's Ray, another home's head or a test's would
        run the job with its own environment (its catalog, its settings)."""
        if self._ray_client is None:
            try:
                from ray.job_submission import JobSubmissionClient
            except ImportError as e:
                raise ConfigError("local_mode=ray-jobs needs Ray with its job API (`icebatch[local]`)") from e
            configured = self.settings.launch.ray_address
            address = configured or own_head(self.settings)
            try:
                if address is None:
                    raise ConnectionError("this home has no Ray head yet")
                self._ray_client = JobSubmissionClient(address)
            except ConnectionError as e:
                if configured or not start_head:
                    raise ClusterUnavailableError(f"no Ray cluster at {address or 'this home'}") from e
                address = start_local_head(self.settings)
                self._ray_client = JobSubmissionClient(address)
            self._address = address
        return self._ray_client

    def _submit_ray(self, spec: JobSpec, record: dict[str, Any]) -> None:
        env = {e["name"]: e["value"] for e in job_env(self.settings, spec, home=str(self.settings.home))}
        client = self._client()
        # A head that just started answers before its job agent is ready (HTTP 500). Retried for a bounded time;
        # the submission id makes a retry idempotent: if the job exists, an earlier attempt landed.
        from tenacity import Retrying, before_sleep_log, retry_if_exception_type, stop_after_delay, wait_fixed

        retrying = Retrying(
            retry=retry_if_exception_type(RuntimeError),
            stop=stop_after_delay(SUBMIT_PATIENCE_SECONDS),
            wait=wait_fixed(2),
            before_sleep=before_sleep_log(log, logging.INFO),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    _submit_once(client, spec, env)
        except RuntimeError as e:
            raise ClusterUnavailableError(f"Ray did not accept job {spec.name}: {e}") from e

    def _refresh(self, path: Path, record: dict[str, Any]) -> None:
        """Bring a RUNNING record up to date: verified against its owner, and expired after the job deadline.

        A record that says RUNNING blocks every later launch of its consumer ("already launched"), so it
        must never outlive its job: a Ray job is asked about (a cluster that is gone, or no longer knows
        the job, means the job is gone); an in-process job's owner must still be the same process (a pid
        and its start time); and whatever it says, a record older than ``ICEBATCH_JOB_DEADLINE_SECONDS``
        (the RayJob's ``activeDeadlineSeconds``) has expired.
        """
        if record.get("status") not in {"RUNNING", "PENDING"}:
            return
        gone: tuple[str, str] | None = None
        if _age_seconds(record) > self.settings.kubernetes.job_deadline_seconds:
            gone = ("DeadlineExceeded", "the job outlived ICEBATCH_JOB_DEADLINE_SECONDS; its record expired")
        elif record.get("mode") == "ray-jobs":
            gone = self._ray_job_gone(path, record)
        elif not _same_process(int(record.get("pid", 0)), record.get("pid_started")):
            gone = ("ProcessDied", "the launcher process ended mid-job")
        if gone is not None:
            record.update(status="FAILED", reason=gone[0], message=gone[1], end_time=_now())
            _write(path, record)

    def _ray_job_gone(self, path: Path, record: dict[str, Any]) -> tuple[str, str] | None:
        try:
            status = str(self._client(start_head=False).get_job_status(record["name"]))
        except ClusterUnavailableError:
            return ("ClusterGone", f"no Ray cluster at {self._ray_address()}: the job went with it")
        except RuntimeError as e:  # the cluster answers, and does not know the job (a new head)
            if "does not exist" in str(e) or "not found" in str(e).lower():
                return ("JobGone", "the Ray cluster does not know the job (it was restarted)")
            log.warning("could not read Ray job %s: %s", record["name"], e)
            return None
        except Exception as e:  # unreachable now: the deadline expires the record if it stays so
            log.warning("could not read Ray job %s: %s", record["name"], e)
            return None
        status = status.rsplit(".", 1)[-1]
        if status != record["status"]:
            record["status"] = status
            if status in {"SUCCEEDED", "FAILED", "STOPPED"}:
                record["end_time"] = _now()
            _write(path, record)
        return None


def _interrupts(settings: Settings) -> Interrupts | None:
    """SIGTERM/SIGINT (Ctrl-C) stop an in-process job as they stop the job's own process: the finished rows
    committed, a resumable failure reported; so does a stall (``ICEBATCH_STALL_SECONDS``). Only from the
    main thread, where signals arrive (a launcher called from another thread runs the job without them)."""
    from icebatch_job.process.interrupts import Interrupts

    if threading.current_thread() is not threading.main_thread():
        return None
    interrupts = Interrupts(settings.progress.drain_seconds)
    interrupts.install()
    return interrupts


def own_head(settings: Settings) -> str | None:
    """The job API address of the head this home started (``$ICEBATCH_HOME/ray-head.json``), if it still answers
    there as itself.

    A head that is gone leaves its record behind, and its free-picked port may since be another Ray's (a notebook's,
    another home's head): the Ray answering must name a session whose folder is in this home's Ray temp dir."""
    try:
        address = str(json.loads((settings.home / HEAD_RECORD).read_text())["address"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    session = _session_at(address)
    if session is None:
        return None  # nothing answers: the head is gone
    if not session or not (settings.home / "ray" / session).is_dir():
        log.warning(
            "the Ray answering at %s is not this home's head (its session %s is not under %s): the head this "
            "home started is gone",
            address,
            session or "(none)",
            settings.home / "ray",
        )
        return None
    return address


def _session_at(address: str) -> str | None:
    """The session name of the Ray whose job API answers at ``address`` ("" when what answers names none); None when
    nothing answers."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{address}/api/version", timeout=5) as answer:
            body = json.loads(answer.read(64 * 1024))
    except (urllib.error.HTTPError, ValueError):
        return ""  # something answers, not a Ray job API
    except OSError:
        return None
    name = body.get("session_name") if isinstance(body, dict) else None
    return name if isinstance(name, str) and name.startswith("session_") and "/" not in name else ""


def start_local_head(settings: Settings) -> str:
    """Start this home's Ray head on 127.0.0.1, every port free-picked; return its job API address (also
    recorded in ``$ICEBATCH_HOME/ray-head.json``). It outlives this process: stop it with `ray stop`.

    Its temp dir, logs and caches live under ICEBATCH_HOME like the job's. It carries no ``ICEBATCH_*`` variable
    of the shell that started it: a job's settings are exactly those it is submitted with.
    """
    import subprocess

    from icebatch_job.local.ray_instance import ray_temp_dir
    from icebatch_job.process.runtime import job_environment

    inherited = {k: v for k, v in os.environ.items() if not k.startswith("ICEBATCH_")}
    env = {**inherited, **job_environment(settings, device="cpu"), "RAY_AUTH_MODE": "disabled"}
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    # Every port is picked free: another Ray on this machine (a notebook, a test process, another home's head)
    # holds the defaults (dashboard 8265, GCS 6379, dashboard agent 52365), and an agent that cannot bind leaves
    # the head unable to accept jobs.
    names = (
        "port",
        "dashboard-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "metrics-export-port",
        "runtime-env-agent-port",
        "ray-client-server-port",
    )
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    cmd = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        *(f"--{name}={port}" for name, port in ports.items()),
        f"--temp-dir={ray_temp_dir(settings)}",
        f"--num-cpus={max(4, 2 * (os.cpu_count() or 2))}",
        "--disable-usage-stats",
    ]
    log.info("starting a local Ray head: %s", " ".join(cmd))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise ClusterUnavailableError(f"could not start a local Ray head: {done.stderr.strip()[-500:]}")
    address = f"http://127.0.0.1:{ports['dashboard-port']}"
    _write(settings.home / HEAD_RECORD, {"address": address, "started": _now(), "temp_dir": ray_temp_dir(settings)})
    return address


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now. Each is bound while the others are picked: a port picked
    and let go at once may be the kernel's next answer too (two of a head's components given one port: Ray
    refuses to start)."""
    import socket

    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def _submit_once(client: Any, spec: JobSpec, env: dict[str, str]) -> None:
    """Submit the job to Ray, or find that an earlier try did (Ray's client raises RuntimeError for either)."""
    import shlex

    try:
        client.submit_job(
            entrypoint=shlex.join(spec.entrypoint()),
            submission_id=spec.name,
            runtime_env={"env_vars": env},
            metadata={"icebatch.consumer": spec.consumer.name},
        )
    except RuntimeError as refused:
        try:
            client.get_job_info(spec.name)  # it exists: an earlier try landed, only its answer was lost
        except RuntimeError:
            raise refused from None


def _state(record: dict[str, Any]) -> JobState:
    deployment, job_status = _RAY_STATUS.get(record.get("status", ""), ("", ""))
    return JobState(
        name=record["name"],
        deployment=record.get("deployment"),
        consumer=record.get("consumer"),
        from_tag=record.get("from_tag"),
        attempt=int(record.get("attempt", 1)),
        deployment_status=deployment,
        job_status=job_status,
        reason=record.get("reason", ""),
        message=record.get("message", ""),
        start_time=record.get("start_time"),
        end_time=record.get("end_time"),
        annotations=dict(record.get("annotations", {})),
    )


def _process_started(pid: int) -> str | None:
    """When a process started (psutil's ``create_time``): with its pid, it names the process."""
    import psutil

    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return None


def _same_process(pid: int, started: str | None) -> bool:
    """Is ``pid`` still the process that wrote the record (not dead, not a reused pid)?"""
    from icebatch_job.local.lineage import alive

    if not alive(pid):
        return False
    return started is None or _process_started(pid) in (None, started)


def _age_seconds(record: dict[str, Any]) -> float:
    try:
        start = datetime.strptime(str(record.get("start_time")), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return float("inf")  # a record without a readable start time cannot be trusted to be live
    return (datetime.now(UTC) - start).total_seconds()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _import_ray_untagged() -> None:
    """Import Ray, but keep the process's log records as they were: Ray's import tags every record
    (_ray_timestamp_ns), and the handlers here log as on AWS, where the job runs elsewhere."""
    factory = logging.getLogRecordFactory()
    import ray  # noqa: F401

    logging.setLogRecordFactory(factory)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
