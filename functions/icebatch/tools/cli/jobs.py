"""Commands of the data plane, run here: the job, the tiny model."""

from __future__ import annotations

import argparse

from icebatch.core.settings import Settings


def cmd_job_run(args: argparse.Namespace, settings: Settings) -> int:
    """The job, here. Its terminal output is icebatch's own (what it will do, its phases, progress, the report);
    Ray's, vLLM's and the handlers' records go to the run's log under the home (``-v``: to the terminal too)."""
    from icebatch_job.cli import run_command

    from icebatch.core.terminal import console
    from icebatch.tools.run_log import run_log_path, to_run_log

    if getattr(args, "verbose", False):
        return run_command(args, settings)  # everything live; with --json, only the summary reaches stdout
    path = run_log_path(settings, "job-run")
    console.phase(f"the full log (Ray, vLLM, icebatch's records): {path}; -v shows it here")
    with to_run_log(path):
        return run_command(args, settings)


def cmd_model_tiny(args: argparse.Namespace, settings: Settings) -> int:
    from icebatch_job.example.tiny_model import build_tiny_model

    print(build_tiny_model(settings.tiny_model_dir, force=args.force))
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from icebatch_job.cli import RUN_DESCRIPTION, RUN_HELP, add_run_arguments

    p = sub.add_parser("job", help="the data-plane job (what a RayJob runs: `python -m icebatch_job run`)")
    jsub = p.add_subparsers(dest="job_command", metavar="ACTION", required=True)
    q = jsub.add_parser("run", help=RUN_HELP, description=RUN_DESCRIPTION)
    add_run_arguments(q)
    q.set_defaults(handler=cmd_job_run)

    p = sub.add_parser("model", help="the local tiny model")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    q = msub.add_parser(
        "tiny",
        help="build the tiny random-weight Llama used on machines without a GPU (cached)",
        description="Build (once) a tiny Llama with random weights and a tokenizer trained on generated tickets "
        "under $ICEBATCH_HOME/models/tiny-llama, and print its path.",
    )
    q.add_argument("--force", action="store_true", help="rebuild even if it exists")
    q.set_defaults(handler=cmd_model_tiny)
