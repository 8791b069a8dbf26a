"""The command line as users type it (a subprocess each; stdout/stderr and exit codes checked)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional
EVENTS = Path(__file__).resolve().parents[2] / "sam" / "events"


def icebatch(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ICEBATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "icebatch.tools.cli", *args],
        capture_output=True,
        text=True,
        env={**base, "ICEBATCH_HOME": str(home), **env},
        timeout=180,
    )


def test_help_teaches(tmp_path: Path) -> None:
    out = icebatch(tmp_path, "--help").stdout
    for word in ("generate", "backlog", "launch", "invoke", "job", "report", "config", "Typical session"):
        assert word in out
    assert "sam local invoke" in icebatch(tmp_path, "invoke", "--help").stdout


def test_generate_then_backlog_json(tmp_path: Path) -> None:
    gen = icebatch(tmp_path, "generate", "--tickets", "25", "--batches", "3", "--seed", "5")
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.count("-> snapshot ") == 3
    backlogs = json.loads(icebatch(tmp_path, "backlog", "--json").stdout)  # a consumer each
    assert [b["consumer"] for b in backlogs] == ["triage", "privacy"]
    for backlog in backlogs:
        assert {
            "consumer",
            "task_version",
            "watermark_snapshot_id",
            "current_snapshot_id",
            "backlog_rows",
            "oldest_unprocessed_age_seconds",
        } <= set(backlog)
        assert backlog["backlog_rows"] == 25 and backlog["watermark_snapshot_id"] is None
    [one] = json.loads(icebatch(tmp_path, "backlog", "--consumer", "privacy", "--json").stdout)
    assert one["consumer"] == "privacy"


def test_generate_with_more_batches_than_tickets_counts_the_batches_it_makes(tmp_path: Path) -> None:
    # when a user asks for 3 tickets in 10 batches
    gen = icebatch(tmp_path, "generate", "--tickets", "3", "--batches", "10")
    # then it makes 3 snapshots of one ticket and numbers them out of 3 (not "batch 3/10", then nothing)
    assert gen.returncode == 0, gen.stderr
    lines = gen.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == ["batch 1/3", "batch 2/3", "batch 3/3"], gen.stdout
    assert lines[-1] == "support.tickets: 3 tickets in 3 snapshot(s)"


def test_launch_dry_run_json_holds_decision_and_manifest(tmp_path: Path) -> None:
    icebatch(tmp_path, "generate", "--tickets", "10")
    done = icebatch(tmp_path, "launch", "--trigger", "schedule", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # stdout is exactly one JSON object: logs went to stderr
    assert [d["decision"] for d in data["decisions"]] == ["dry_run", "dry_run"]
    for decision, manifest in zip(data["decisions"], data["manifests"], strict=True):
        assert manifest["kind"] == "RayJob" and manifest["metadata"]["name"] == decision["job_name"]
    # one job for both consumers (one model): each decision's manifest is that job's
    assert len({d["job_name"] for d in data["decisions"]}) == 1


def test_launch_dry_run_prints_the_manifest_for_review(tmp_path: Path) -> None:
    icebatch(tmp_path, "generate", "--tickets", "10")
    out = icebatch(tmp_path, "launch", "--force", "--dry-run").stdout
    assert "decision                      : dry_run" in out and "kind: RayJob" in out
    # the example's two consumers share one model: one job for both, its manifest printed once
    assert out.count("kind: RayJob") == 1 and "icebatch.io/shared-with: privacy/" in out
    assert "printed above (one job for several consumers)" in out


@pytest.mark.parametrize("name", sorted(p.name for p in (EVENTS / "malformed").glob("*.json")))
def test_invoke_with_a_malformed_event_is_one_line_and_non_zero(tmp_path: Path, name: str) -> None:
    done = icebatch(tmp_path, "invoke", "launcher", "--event", str(EVENTS / "malformed" / name))
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("icebatch:")]
    assert len(lines) == 1 and lines[0].startswith("icebatch: error: ")
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_invoke_missing_or_broken_event_files(tmp_path: Path) -> None:
    missing = icebatch(tmp_path, "invoke", "launcher", "-e", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    (tmp_path / "bad.json").write_text("{not json")
    broken = icebatch(tmp_path, "invoke", "launcher", "-e", str(tmp_path / "bad.json"))
    assert broken.returncode == 2 and "is not JSON" in broken.stderr
    # an endless file (a device, a pipe) is refused after the events' size limit, not read until memory runs out
    endless = icebatch(tmp_path, "invoke", "launcher", "-e", "/dev/zero")
    assert endless.returncode == 2 and "holds more than 262,144 bytes" in endless.stderr


def test_invoke_an_event_for_another_table_is_ignored_exit_zero(tmp_path: Path) -> None:
    done = icebatch(tmp_path, "invoke", "launcher", "-e", str(EVENTS / "glue-other-table.json"))
    assert done.returncode == 0, done.stderr
    assert "decision                      : ignored" in done.stdout


def test_bad_configuration_is_one_line(tmp_path: Path) -> None:
    done = icebatch(tmp_path, "backlog", ICEBATCH_MAX_ATTEMPTS="many")
    assert done.returncode == 2 and "ICEBATCH_MAX_ATTEMPTS" in done.stderr and "Traceback" not in done.stderr


def test_config_lists_every_variable(tmp_path: Path) -> None:
    data = json.loads(icebatch(tmp_path, "config", "--json").stdout)
    assert data["ICEBATCH_HOME"] == str(tmp_path) and "ICEBATCH_MAX_ATTEMPTS" in data and "ICEBATCH_BATCH_SIZE" in data
    text = icebatch(tmp_path, "config").stdout
    assert "[launch]" in text and "[engine]" in text  # by concern


def test_invoke_reporter_with_the_sam_event_is_idempotent(tmp_path: Path) -> None:
    first = icebatch(tmp_path, "invoke", "reporter", "-e", str(EVENTS / "completed.json"), "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["status"] == "reported" and "TOKENOMICS" in first.stderr
    second = icebatch(tmp_path, "invoke", "reporter", "-e", str(EVENTS / "completed.json"), "--json")
    assert json.loads(second.stdout) == json.loads(first.stdout)
    assert [p.name for p in (tmp_path / "reports").glob("*.txt")] == ["triage-20261129T020005-4f1c2a.completed.txt"]
    human = icebatch(tmp_path, "invoke", "reporter", "-e", str(EVENTS / "failed.json"))
    assert human.returncode == 0 and "BATCH JOB FAILED" in human.stdout and "reporter: reported" in human.stdout
    bad = icebatch(tmp_path, "invoke", "reporter", "-e", str(EVENTS / "glue-table-change.json"))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
        "icebatch: error: the reporter handles"
    )


def test_report_rebuilds_a_run_from_the_ledger(tmp_path: Path) -> None:
    from icebatch.core.catalog import open_catalog
    from icebatch.core.ledger import open_ledger
    from icebatch.core.settings import Settings
    from icebatch_job.example.tickets import ensure_source_table, generate

    from tests.support.consumers import triage
    from tests.support.runs import run_once

    settings = Settings(home=tmp_path)
    generate(ensure_source_table(open_catalog(settings), settings.catalog.source_table), tickets=30, batches=2, seed=4)
    run = run_once(open_ledger(settings, triage(settings)))
    assert run is not None
    data = json.loads(icebatch(tmp_path, "report", "--json").stdout)
    assert (data["run_id"], data["rows"], data["rows_ok"]) == (run.plan.run_id, 30, 30)
    assert sum(data["labels"]["category"].values()) == 30
    text = icebatch(tmp_path, "report", run.plan.run_id).stdout
    assert "BATCH SUMMARY" in text and "TOKENOMICS" in text and "new tickets           : 30" in text
    missing = icebatch(tmp_path, "report", "no-such-run")
    assert missing.returncode == 2 and "icebatch ledger runs" in missing.stderr


def test_ledger_runs_and_reset(tmp_path: Path) -> None:
    from icebatch.core.ledger import open_ledger
    from icebatch.core.settings import Settings

    from tests.support.consumers import triage
    from tests.support.runs import run_once

    icebatch(tmp_path, "generate", "--tickets", "10")
    settings = Settings(home=tmp_path)
    run = run_once(open_ledger(settings, triage(settings)))
    assert run is not None
    listed = json.loads(icebatch(tmp_path, "ledger", "runs", "--json").stdout)
    runs = listed["runs"]
    assert [(r["consumer"], r["run_id"]) for r in runs] == [("triage", run.plan.run_id)] and runs[0]["rows"] == 10
    assert listed["in_progress"] == [] and runs[0]["chunks"] == 1
    icebatch(tmp_path, "generate", "--tickets", "5")
    [backlog] = json.loads(icebatch(tmp_path, "backlog", "--consumer", "triage", "--json").stdout)
    reset = icebatch(
        tmp_path,
        "ledger",
        "reset",
        "--consumer",
        "triage",
        "--to-snapshot",
        str(backlog["current_snapshot_id"]),
        "--reason",
        "skip a bad batch",
    )
    assert reset.returncode == 0, reset.stderr
    [after] = json.loads(icebatch(tmp_path, "backlog", "--consumer", "triage", "--json").stdout)
    assert after["backlog_rows"] == 0
    # and the ledger lists the reset with its reason, not as a run of 0 rows
    [line] = [x for x in icebatch(tmp_path, "ledger", "runs").stdout.splitlines() if "reset" in x]
    assert line.endswith(f"reset to {backlog['current_snapshot_id']}: skip a bad batch") and "rows=" not in line
    first = json.loads(icebatch(tmp_path, "ledger", "runs", "--json").stdout)["runs"][0]
    assert first["reset_reason"] == "skip a bad batch"
    unknown = icebatch(tmp_path, "ledger", "reset", "--consumer", "triage", "--to-snapshot", "12345", "--reason", "x")
    assert unknown.returncode == 2 and "not in support.tickets" in unknown.stderr
    several = icebatch(tmp_path, "ledger", "reset", "--to-snapshot", "12345", "--reason", "x")
    assert several.returncode == 2 and "name one with --consumer" in several.stderr


def test_model_tiny_reuses_the_built_model(tmp_path: Path, tiny_model: Path) -> None:
    import shutil

    target = tmp_path / "models" / "tiny-llama"
    shutil.copytree(tiny_model, target)
    done = icebatch(tmp_path, "model", "tiny")
    assert done.returncode == 0 and done.stdout.strip() == str(target)


def test_contracts_check_passes_on_the_checked_in_files(tmp_path: Path) -> None:
    done = icebatch(tmp_path, "contracts", "check")
    assert done.returncode == 0 and "matches the code" in done.stdout


def job(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ICEBATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "icebatch_job", *args],
        capture_output=True,
        text=True,
        env={**base, "ICEBATCH_HOME": str(home)},
        timeout=180,
    )


@pytest.mark.parametrize(
    ("command", "env", "status", "error_type", "message"),
    [
        (["backlog", "--json", "--limit", "3"], {}, 2, "UsageError", "unrecognized arguments: --limit 3"),
        (["backlog", "--json"], {"ICEBATCH_CHUNK_ROWS": "1e3"}, 2, "ConfigError", "ICEBATCH_CHUNK_ROWS"),
        (["report", "--json"], {}, 2, "PermanentError", "no runs committed yet"),
        (["ledger", "runs", "--json", "--consumer", "nobody"], {}, 2, "ConfigError", "'nobody'"),
    ],
)
def test_a_failed_json_command_prints_one_json_document(
    tmp_path: Path, command: list[str], env: dict[str, str], status: int, error_type: str, message: str
) -> None:
    # given a command asked for --json that cannot succeed (its command line, its settings, its data)
    # when it runs
    done = icebatch(tmp_path, *command, **env)
    # then stdout is exactly one JSON document saying so, with the process's exit status
    assert done.returncode == status, done.stderr
    [document] = [json.loads(done.stdout)]
    assert document["error"]["exit_status"] == status and document["error"]["type"] == error_type
    assert message in document["error"]["message"]
    # and stderr still has the one line a person reads, without a traceback
    assert message in done.stderr and "Traceback" not in done.stderr
    # and without --json, stdout stays empty
    plain = icebatch(tmp_path, *[word for word in command if word != "--json"], **env)
    assert (plain.returncode, plain.stdout) == (status, "")


def test_the_job_fails_its_json_contract_neither(tmp_path: Path) -> None:
    # given the RayJob's entrypoint with --json and a value it refuses
    done = job(tmp_path, "run", "--json", "--limit", "0")
    # then its stdout is one JSON document with the usage error, stderr the usage
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"]["type"] == "UsageError"
    assert done.stderr.startswith("usage: python -m icebatch_job run")


def test_what_a_person_reads_never_says_none(tmp_path: Path) -> None:
    # given a table with tickets that nothing has processed yet (no watermark, no job, no run)
    assert icebatch(tmp_path, "generate", "--tickets", "10", "--seed", "2").returncode == 0
    # when a person reads the backlog, the estimate, a launch decision, the ledger and the settings
    for command in (
        ["backlog"],
        ["estimate"],
        ["launch", "--trigger", "manual", "--dry-run"],
        ["ledger", "runs"],
        ["config"],
    ):
        done = icebatch(tmp_path, *command)
        # then each says what is missing in words ("none: nothing processed yet", "-"), not Python's None
        assert done.returncode == 0, done.stderr
        assert "None" not in done.stdout, (command, [line for line in done.stdout.splitlines() if "None" in line])


@pytest.mark.parametrize(("where", "why"), [("a-file", "a file is there"), ("a-file/home", "Not a directory")])
def test_a_home_that_cannot_be_a_folder_is_one_line_naming_the_setting(tmp_path: Path, where: str, why: str) -> None:
    # given ICEBATCH_HOME pointing at a file, or under one
    (tmp_path / "a-file").write_text("not a folder")
    # when a command needs its home (the catalog, the job records, the local bus live there)
    done = icebatch(tmp_path / where, "generate", "--tickets", "3")
    # then it stops with one line naming the folder, why, and the setting to change; no traceback
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"icebatch: error: cannot create the folder {tmp_path / where} ({why}): "
        "set ICEBATCH_HOME to a folder this user can write\n"
    )


def test_a_reset_back_over_labelled_rows_says_what_it_costs_and_needs_yes(tmp_path: Path) -> None:
    from icebatch.core.ledger import open_ledger
    from icebatch.core.settings import Settings

    from tests.support.consumers import triage
    from tests.support.runs import run_once

    # given a consumer that has labelled 10 rows
    icebatch(tmp_path, "generate", "--tickets", "10")
    settings = Settings(home=tmp_path)
    assert run_once(open_ledger(settings, triage(settings))) is not None
    back = ["ledger", "reset", "--consumer", "triage", "--to-snapshot", "none", "--reason", "relabel all"]
    # when the watermark is moved back to the start without --yes, then nothing is recorded and one line says
    # what it would cost and how to go on
    refused = icebatch(tmp_path, *back)
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert "about 10 rows already labelled to the model again" in refused.stderr and "--yes" in refused.stderr
    # and a dry run says the same on stdout and records nothing
    dry = icebatch(tmp_path, *back, "--dry-run")
    assert dry.returncode == 0 and "about 10 rows already labelled would be sent" in dry.stdout, dry.stderr
    assert "nothing recorded" in dry.stdout
    [backlog] = json.loads(icebatch(tmp_path, "backlog", "--consumer", "triage", "--json").stdout)
    assert backlog["backlog_rows"] == 0
    # when it is confirmed, then the next run will label the 10 rows again
    done = icebatch(tmp_path, *back, "--yes")
    assert done.returncode == 0 and "watermark set to none" in done.stdout, done.stderr
    [backlog] = json.loads(icebatch(tmp_path, "backlog", "--consumer", "triage", "--json").stdout)
    assert backlog["backlog_rows"] == 10


def test_results_shows_the_verdicts_and_how_to_query_them_elsewhere(tmp_path: Path) -> None:
    from icebatch.core.ledger import open_ledger
    from icebatch.core.settings import Settings

    from tests.support.consumers import triage
    from tests.support.runs import run_once

    # given a consumer before its first run, then `results` says there is nothing yet, in one line
    icebatch(tmp_path, "generate", "--tickets", "12")
    missing = icebatch(tmp_path, "results", "--consumer", "triage")
    assert missing.returncode == 2 and "first run creates it" in missing.stderr
    # given 12 labelled rows
    settings = Settings(home=tmp_path)
    run = run_once(open_ledger(settings, triage(settings)))
    assert run is not None
    # when a user looks at them, then each row shows its id, status and verdict columns, one line each ...
    shown = icebatch(tmp_path, "results", "--consumer", "triage", "--limit", "5")
    assert shown.returncode == 0, shown.stderr
    header, *lines = shown.stdout.split("\n\n")[0].splitlines()
    assert header.split()[:6] == ["source_id", "status", "sentiment", "urgency", "category", "summary"]
    assert len(lines) == 5 and all(" ok " in line for line in lines)
    # ... followed by how to query the table from DuckDB and Athena
    assert "iceberg_scan('" in shown.stdout and "FROM support.tickets_triage_results" in shown.stdout
    # and --json is exactly one document holding the rows whole
    data = json.loads(icebatch(tmp_path, "results", "--consumer", "triage", "--json").stdout)
    assert data["results_table"] == "support.tickets_triage_results" and len(data["rows"]) == 12
    assert {r["status"] for r in data["rows"]} == {"ok"} and all(r["summary"] for r in data["rows"])
    # and a status filter keeps only those rows
    none = json.loads(
        icebatch(tmp_path, "results", "--consumer", "triage", "--status", "invalid_output", "--json").stdout
    )
    assert none["rows"] == []


def test_results_show_each_verdict_with_the_columns_its_prompt_read_and_filter_on_both(tmp_path: Path) -> None:
    from icebatch.core.catalog import open_catalog
    from icebatch.core.ledger import open_ledger
    from icebatch.core.settings import Settings

    from tests.support.consumers import triage
    from tests.support.runs import run_once

    # given 30 labelled tickets
    icebatch(tmp_path, "generate", "--tickets", "30", "--seed", "11")
    settings = Settings(home=tmp_path)
    assert run_once(open_ledger(settings, triage(settings))) is not None
    source = {
        str(r["ticket_id"]): r
        for r in open_catalog(settings).load_table("support.tickets").scan().to_arrow().to_pylist()
    }

    def shown(*args: str) -> list[dict[str, str]]:
        out = icebatch(tmp_path, "results", "--consumer", "triage", "--limit", "100", "--format", "csv", *args)
        assert out.returncode == 0, out.stderr
        return list(csv.DictReader(io.StringIO(out.stdout)))

    # when a user asks for the verdicts as CSV, then each row carries its source row's prompt columns, by id
    rows = shown()
    assert [r["source_id"] for r in rows] == sorted(source)
    assert list(rows[0])[:3] == ["source_id", "status", "sentiment"] and list(rows[0])[-2:] == ["error", "run_id"]
    for r in rows:  # (CSV writes a null as an empty cell)
        row = source[r["source_id"]]
        assert (r["subject"], r["body"], r["channel"]) == tuple(row[c] or "" for c in ("subject", "body", "channel"))
    # when filtered on a verdict column, then only the verdicts it keeps, still with their prompt columns
    category = rows[0]["category"]
    same = shown("--where", f"category = '{category}'")
    assert same and [r["source_id"] for r in same] == [r["source_id"] for r in rows if r["category"] == category]
    assert all(r["subject"] == source[r["source_id"]]["subject"] for r in same)
    # when filtered on a prompt column and a verdict column, then the rows both keep
    assert len({r["category"] for r in rows}) > 1, "the labeller gave every ticket one category: no filter to test"
    channel = next(r["channel"] for r in rows if r["category"] != category)
    both = shown("--where", f"channel = '{channel}' and category != '{category}'")
    expected = [r["source_id"] for r in rows if r["channel"] == channel and r["category"] != category]
    assert [r["source_id"] for r in both] == expected and expected
    # and --limit takes the first rows by id
    assert [r["source_id"] for r in shown("--limit", "3")] == sorted(source)[:3]
    # when the filter names no column of either table, or does not parse, then one line says so (exit 2)
    for bad, said in (
        ("urgncy = 'high'", "urgncy"),
        ("category === 'high'", "does not parse"),
        ("status = 1", "Cannot convert"),
        ("channel = 1", "Cannot convert"),
    ):
        out = icebatch(tmp_path, "results", "--consumer", "triage", "--where", bad)
        assert out.returncode == 2 and out.stdout == "" and said in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    # and two output forms at once are refused
    both_forms = icebatch(tmp_path, "results", "--consumer", "triage", "--json", "--format", "csv")
    assert both_forms.returncode == 2 and "not allowed with" in both_forms.stderr


def test_the_handlers_json_records_stay_off_the_terminal_unless_asked(tmp_path: Path) -> None:
    # given the reporter invoked locally, as `sam local invoke` would (its report printed for a person)
    event = str(Path(__file__).resolve().parents[2] / "sam" / "events" / "completed.json")
    quiet = icebatch(tmp_path, "invoke", "reporter", "--event", event)
    # then the terminal gets the report, not the handler's Lambda JSON records between its lines
    assert quiet.returncode == 0 and "BATCH SUMMARY" in quiet.stdout, quiet.stderr
    assert '"level":"INFO"' not in quiet.stderr and '"function_arn"' not in quiet.stderr, quiet.stderr
    # and -v shows them, as Lambda writes them
    verbose = icebatch(tmp_path / "v", "-v", "invoke", "reporter", "--event", event)
    assert verbose.returncode == 0 and '"message":"cost report"' in verbose.stderr


def _in(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A command typed in ``folder`` with no ICEBATCH_* variable but ``env`` (the home is found, not given)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ICEBATCH_", "PYICEBERG_"))}
    command = [sys.executable, "-m", "icebatch.tools.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env={**base, **env}, cwd=folder, timeout=180)


def test_a_command_finds_its_projects_home_from_a_subfolder_and_says_when_there_is_none(tmp_path: Path) -> None:
    # given a project whose tickets `icebatch generate` made in its folder (its home: .icebatch/ there)
    project, deep, outside = tmp_path / "project", tmp_path / "project" / "src" / "deep", tmp_path / "elsewhere"
    deep.mkdir(parents=True)
    outside.mkdir()
    above = [f for f in (outside, *outside.parents) if (f / ".icebatch").is_dir()]
    assert not above, f"{above[0]}/.icebatch is above the test's temporary folder: the test cannot run here"
    assert _in(project, "generate", "--tickets", "20", "--batches", "1", "--seed", "1").returncode == 0
    # when `backlog` runs in a subfolder, then it reads the project's catalog, as git finds .git
    found = _in(deep, "backlog", "--json")
    assert found.returncode == 0, found.stderr
    assert {b["backlog_rows"] for b in json.loads(found.stdout)} == {20}
    assert not (deep / ".icebatch").exists()
    # when it runs outside any project, then one line says so (exit 2) and no empty catalog is made
    lost = _in(outside, "backlog")
    assert lost.returncode == 2 and lost.stdout == ""
    assert "no icebatch home here" in lost.stderr and "ICEBATCH_HOME" in lost.stderr, lost.stderr
    assert "`icebatch init <namespace.table>` here makes a project" in lost.stderr
    assert len(lost.stderr.strip().splitlines()) == 1 and not (outside / ".icebatch").exists()


def test_init_scaffolds_a_consumer_of_your_own_table_that_the_other_commands_then_use(tmp_path: Path) -> None:
    import pyarrow as pa
    from icebatch.core.catalog import open_catalog
    from icebatch.core.settings import Settings

    # given a table of the user's (reviews, in the project's local catalog), not the example's tickets
    project = tmp_path / "shop"
    catalog = open_catalog(Settings(home=project / ".icebatch"))
    catalog.create_namespace("shop")
    rows = pa.table(
        {
            "review_id": ["r1", "r2", "r3"],
            "stars": pa.array([1, 5, 3], pa.int32()),
            "title": ["broken", "great", "ok"],
            "text": ["it broke", "love it", "fine"],
        }
    )
    catalog.create_table("shop.reviews", schema=rows.schema).append(rows)
    # when `icebatch init shop.reviews` runs in the project's folder
    made = _in(project, "init", "shop.reviews", "--consumer", "sentiment")
    # then it wrote a consumer and a task over the table's text columns, its id found by name
    assert made.returncode == 0, made.stderr
    assert "id review_id, prompt over title, text" in made.stdout
    # and says what comes next, each command as it is typed
    assert (
        "`icebatch launch --dry-run --force`" in made.stdout
        and "`icebatch job run --consumer sentiment`" in made.stdout
    )
    task = (project / "tasks" / "sentiment.yaml").read_text()
    assert "{title}" in task and "{text}" in task and "stars" not in task.split("input_columns")[1].split("\n")[0]
    # and the other commands, typed anywhere in the project, use it: the backlog is the table's 3 rows
    (project / "notebooks").mkdir()
    backlog = _in(project / "notebooks", "backlog", "--json")
    assert backlog.returncode == 0, backlog.stderr
    assert [(b["consumer"], b["backlog_rows"]) for b in json.loads(backlog.stdout)] == [("sentiment", 3)]
    dry = _in(project, "launch", "--dry-run", "--force", "--json")
    assert dry.returncode == 0 and json.loads(dry.stdout)["decisions"][0]["decision"] == "dry_run", dry.stdout
    # and a second init does not overwrite the edited files; a table that is not there is one line, exit 2
    again = _in(project, "init", "shop.reviews", "--consumer", "sentiment")
    assert again.returncode == 2 and "exists" in again.stderr and "--force" in again.stderr
    escape = _in(project, "init", "shop.reviews", "--consumer", "../../x", "--force")
    assert escape.returncode == 2 and not (tmp_path / "x.yaml").exists() and not (project / "x.yaml").exists()
    missing = _in(project, "init", "shop.nothing")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    misspelt = _in(project, "init", "shop.reveiws")
    assert misspelt.returncode == 2 and "(did you mean 'shop.reviews'?)" in misspelt.stderr, misspelt.stderr


@pytest.mark.parametrize("configured_by", ["environment", ".pyiceberg.yaml"])
def test_a_catalog_configured_the_pyiceberg_way_is_opened_by_every_command(tmp_path: Path, configured_by: str) -> None:
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    # given a catalog called `lake` that only pyiceberg's own configuration describes (here an SQL catalog: any type
    # pyiceberg supports is configured alike), holding a table of the user's
    properties = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'lake.db'}", "warehouse": f"file://{tmp_path / 'wh'}"}
    (tmp_path / "wh").mkdir()
    lake = load_catalog("lake", **properties)
    lake.create_namespace("crm")
    notes = pa.table({"note_id": ["n1", "n2"], "text": ["call back", "refund sent"]})
    lake.create_table("crm.notes", schema=notes.schema).append(notes)
    env = {"ICEBATCH_CATALOG_TYPE": "pyiceberg", "ICEBATCH_CATALOG_NAME": "lake"}
    if configured_by == "environment":
        env |= {f"PYICEBERG_CATALOG__LAKE__{k.upper()}": v for k, v in properties.items()}
    else:
        (tmp_path / "config").mkdir()
        lines = "".join(f"    {k}: {v}\n" for k, v in properties.items())
        (tmp_path / "config" / ".pyiceberg.yaml").write_text(f"catalog:\n  lake:\n{lines}")
        env |= {"PYICEBERG_HOME": str(tmp_path / "config")}
    project = tmp_path / "project"
    project.mkdir()
    # when the project is made for that table and its backlog read
    made = _in(project, "init", "crm.notes", **env)
    assert made.returncode == 0, made.stderr
    backlog = _in(project, "backlog", "--json", **env)
    # then both opened the catalog pyiceberg's configuration names
    assert backlog.returncode == 0, backlog.stderr
    assert [b["backlog_rows"] for b in json.loads(backlog.stdout)] == [2]
    # and a catalog name pyiceberg has no configuration for is one line saying where to give it (exit 2)
    unknown = _in(project, "backlog", **{**env, "ICEBATCH_CATALOG_NAME": "nowhere"})
    assert unknown.returncode == 2 and "PYICEBERG_CATALOG__NOWHERE__" in unknown.stderr, unknown.stderr
