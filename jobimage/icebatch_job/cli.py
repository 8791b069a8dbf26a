"""``python -m icebatch_job``: the data plane's own command line (the RayJob's entrypoint).

The job image carries the core and the data plane only; this is its command line. ``icebatch job run``
(the full CLI) is the same command.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING

from icebatch.core.bus import report_printed_by_the_job
from icebatch.core.errors import EXIT_CONFLICT, EXIT_FAILED, EXIT_OK, EXIT_TRANSIENT
from icebatch.core.settings import Settings
from icebatch.core.terminal import console
from icebatch.core.terminal.command_line import StrictParser, run_cli
from icebatch.core.terminal.json_stdout import stdout_kept_for_json, stdout_kept_for_json_until_exit
from icebatch.core.untrusted import CONSUMER_NAME, K8S_NAME, RUN_ID, summarize, whole_number

if TYPE_CHECKING:
    from icebatch_job.job import JobRequest

RUN_HELP = "read new rows, label them with the LLM, commit results + watermark"
RUN_DESCRIPTION = (
    "Run one job against the configured catalog: plan the range after the consumer's watermark, stream it "
    "through the LLM, commit the results in chunks (ICEBATCH_CHUNK_ROWS; the last one moves the watermark), "
    "print the INCREMENTAL STATE / BATCH SUMMARY / TOKENOMICS blocks and emit a completion event. With "
    "nothing new it prints `new rows : 0` (the consumer's row_noun) and starts no engine. A run part way "
    "through its range (an earlier attempt was killed) is resumed: only the rows not yet committed are "
    "processed. SIGTERM commits the finished rows and exits (a second signal exits at once); so does a job "
    "that waits ICEBATCH_STALL_SECONDS for a result. A job whose range kept the engine busy may then linger: while "
    "the rows that landed within the consumer's idle window (linger_seconds) would pay for a cold start of their "
    "own, it waits up to that window for the next commit and takes it as a run of its own (--to-snapshot pins "
    "the first range only; with --no-linger or --limit the job ends with its range). With --with, the job takes "
    "other consumers' runs through the same engine (one model load; each run its own range, results, watermark and "
    "report; a run that fails fails alone), and lingers for all of them: rows that land for any make a round "
    "of runs through one engine. "
    "Exit status: 0 done, nothing new, or deferred (a run "
    "the launcher gave no GPU whose range has changed rows for the model: nothing committed, its next "
    "attempt gets one), 5 another run covered the range first, 1 failed (a 'Batch Job Failed' event was "
    "emitted; committed rows stay), 2 bad input or configuration, 3 a dependency is unavailable or the job "
    "stalled, 130 interrupted."
)
STATUS = {
    "completed": EXIT_OK,
    "nothing_new": EXIT_OK,
    "deferred": EXIT_OK,
    "conflict": EXIT_CONFLICT,
    "failed": EXIT_FAILED,
}


def snapshot_arg(value: str) -> int | None:
    """A snapshot id, or ``none`` (before the first snapshot)."""
    if value == "none":
        return None
    snapshot = whole_number(value)
    if snapshot is None:
        raise argparse.ArgumentTypeError(f"{summarize(value, 40)!r} is not a snapshot id (digits) or `none`")
    return snapshot


def matching(pattern: str, what: str) -> Callable[[str], str]:
    """An argparse type: a value that ``pattern`` matches whole (an identifier, not free text)."""

    def parse(value: str) -> str:
        if not re.fullmatch(pattern, value):
            raise argparse.ArgumentTypeError(f"{summarize(value, 40)!r} is not {what}")
        return value

    return parse


# it names report files and ledger entries
run_id_arg = matching(RUN_ID, "a run id (letters, digits and '-', at most 100, e.g. triage-20261129T073000-3fa9c2)")
# recorded in the run's events
rayjob_name_arg = matching(K8S_NAME, "a Kubernetes object name (lower case, digits, '-' and '.', at most 253)")


def shared_run_arg(value: str) -> JobRequest:
    """``--with``: another consumer's run the job takes through its engine (and lingers for). ``NAME`` (its range:
    after its watermark, to the current snapshot) or ``NAME:RUN_ID:FROM:TO`` (pinned, as the launcher passes it; FROM
    may be ``none``)."""
    from icebatch_job.job import JobRequest

    parts = value.split(":")
    if not re.fullmatch(CONSUMER_NAME, parts[0]) or len(parts) not in (1, 4):
        raise argparse.ArgumentTypeError(
            f"{summarize(value, 60)!r} is not a consumer's name, or NAME:RUN_ID:FROM:TO (e.g. privacy, or "
            "privacy:privacy-20261207T080000-3fa9c2:none:7012)"
        )
    if len(parts) == 1:
        return JobRequest(consumer=parts[0], linger=False)
    to_snapshot = snapshot_arg(parts[3])
    if to_snapshot is None:
        raise argparse.ArgumentTypeError(f"{summarize(value, 60)!r}: TO is a snapshot id")
    return JobRequest(run_id_arg(parts[1]), snapshot_arg(parts[2]), to_snapshot, consumer=parts[0], linger=False)


def positive_int(value: str) -> int:
    number = whole_number(value, 1, 10**12)
    if number is None:
        raise argparse.ArgumentTypeError(f"{summarize(value, 40)!r} is not a whole number from 1 to 10^12")
    return number


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--consumer", help="the consumer to run for (needed when several are declared)")
    p.add_argument("--limit", type=positive_int, help="process at most N rows (whole snapshots, at least one)")
    p.add_argument("--json", action="store_true", help="print one JSON summary instead of the report")
    p.add_argument("--run-id", type=run_id_arg, help="run id (the launcher passes one; default: generated)")
    p.add_argument(
        "--from-snapshot",
        type=snapshot_arg,
        default=argparse.SUPPRESS,
        help="expected watermark (`none` for the first run); refused if stale",
    )
    p.add_argument("--to-snapshot", type=snapshot_arg, help="last source snapshot to include (default: current)")
    p.add_argument("--rayjob-name", type=rayjob_name_arg, help="recorded in the events (set by the RayJob)")
    p.add_argument(
        "--with",
        dest="shared_with",
        metavar="CONSUMER",
        type=shared_run_arg,
        action="append",
        default=[],
        help="also take this consumer's run through the same engine (repeatable; its model must match): NAME, or "
        "NAME:RUN_ID:FROM:TO as the launcher pins it",
    )
    p.add_argument(
        "--no-linger",
        dest="linger",
        action="store_false",
        help="end once the range is committed, whatever the consumer's idle window says",
    )


def run_command(args: argparse.Namespace, settings: Settings, *, whole_process: bool = False) -> int:
    """The job, run in this process (``icebatch job run``); ``whole_process``: this process is the job's own
    (``python -m icebatch_job``, a RayJob's entrypoint), which ends when the job has printed its document."""
    from icebatch_job.job import JobRequest
    from icebatch_job.process.interrupts import Interrupts
    from icebatch_job.shared import run_request

    interrupts = Interrupts(settings.progress.drain_seconds)
    interrupts.install()
    request = JobRequest(
        run_id=args.run_id,
        from_snapshot=getattr(args, "from_snapshot", "watermark"),  # not given: whatever the ledger says
        to_snapshot=args.to_snapshot,
        limit=args.limit,
        rayjob_name=args.rayjob_name,
        consumer=args.consumer,
        linger=args.linger and args.limit is None,  # a run of at most N rows: all it asked
        shared_with=tuple(replace(r, limit=args.limit, rayjob_name=args.rayjob_name) for r in args.shared_with),
    )
    printed = nullcontext() if args.json else report_printed_by_the_job()  # the local reporter: not twice
    # Ray forwards the engine's output to this process's stdout; in the job's own process, until Ray is shut down
    # at its exit, after the document: stdout stays on stderr until then
    document = stdout_kept_for_json_until_exit(args.json) if whole_process else None
    with stdout_kept_for_json(args.json and not whole_process), printed:
        result = run_request(
            settings, request, out=(lambda _text: None) if args.json else console.say, interrupts=interrupts
        )
    if args.json:
        text = json.dumps(result.to_json(), indent=2, sort_keys=True, default=str)
        print(text, file=document or console.out(), flush=True)
    return STATUS[result.job_status]


COPY_HELP = "copy an s3:// model to this node's model cache (a GPU worker's init container)"
COPY_DESCRIPTION = (
    "Copy the files of an s3:// model prefix (weights included) to this node's model cache under ICEBATCH_HOME, "
    "unless the copy there was made from the objects the prefix holds now, and print the copy's folder. With "
    "ICEBATCH_MODEL_LOAD_FORMAT=nvme_streamer each GPU worker of a RayJob runs this before Ray starts on its node "
    "(on EKS the cache is the node's NVMe); the job's engine then streams the weights from the copy. The S3 client "
    "is configured as the job's (ICEBATCH_AWS_REGION, ICEBATCH_AWS_ENDPOINT_URL). Exit status: 0 copied or already "
    "there, 2 no model there (or no *.safetensors, or no permission to read it), 3 S3 unreachable."
)


def s3_model_arg(value: str) -> str:
    """An ``s3://bucket/prefix`` (bounded: it names a folder of the cache)."""
    if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\x00-\x1f]{0,900})?", value):
        raise argparse.ArgumentTypeError(f"{summarize(value, 60)!r} is not an s3:// model prefix (s3://bucket/prefix/)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = StrictParser(prog="python -m icebatch_job", description="The icebatch job (data plane).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = sub.add_parser("run", help=RUN_HELP, description=RUN_DESCRIPTION)
    add_run_arguments(run)
    copy = sub.add_parser("copy-model", help=COPY_HELP, description=COPY_DESCRIPTION)
    copy.add_argument("source", type=s3_model_arg, help="the model's s3:// prefix, e.g. s3://models/llama-3.1-8b/")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli("icebatch-job", build_parser(), argv, _run, status_of=stalled_status)


def _run(args: argparse.Namespace) -> int:
    from icebatch.core.terminal.command_line import quiet_handler_records

    settings = Settings.from_env()
    logging.basicConfig(
        level=settings.top.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "copy-model":
        return copy_model_command(args.source, settings)
    with quiet_handler_records(settings.top.log_level):
        return run_command(args, settings, whole_process=True)


def copy_model_command(source: str, settings: Settings) -> int:
    from icebatch_job.process.runtime import prepare_environment
    from icebatch_job.stages.model_copy import copy_model

    prepare_environment(settings, device="gpu", model=source)  # boto3's region and endpoint, as the job's processes
    print(copy_model(source, settings.home), flush=True)
    return EXIT_OK


def stalled_status(error: BaseException) -> int | None:
    """A stalled job (a GPU node, an engine or a node that never came back) is transient: retry later."""
    from icebatch_job.process.interrupts import JobStalled

    return EXIT_TRANSIENT if isinstance(error, JobStalled) else None
