"""`icebatch runs` and `icebatch costs`: every run, however it ended, with its cost, read back from the ledger
(real SQL catalog) and the local bus's event log, through the command line as users call it."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.errors import WatermarkError
from icebatch.core.events import BatchJobFailed, SnapshotRange
from icebatch.core.ledger import ResultsLedger, open_ledger
from icebatch.core.settings import Settings
from icebatch.tools.cli import main as icebatch_main
from icebatch.tools.local_bus import local_bus
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets
from icebatch_job.job import JobRequest, run_job

from tests.support.aws import REGION, client
from tests.support.consumers import consumers_file, triage
from tests.support.runs import Crash, dies_after, run_once

pytestmark = pytest.mark.functional
EXAMPLE_FAILED = Path(__file__).resolve().parents[2] / "eventbridge" / "examples" / "valid" / "batch-job-failed.json"


def _history(settings: Settings) -> tuple[ResultsLedger, dict[str, str]]:
    """A completed run; a run interrupted after a chunk, then resumed to its end; a job that failed before reading a
    row; a reset; and a run part way through. Returns the ledger and {what: run id}."""
    ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    ledger = open_ledger(settings, triage(settings))

    def append(n: int, seed: int) -> None:
        append_tickets(ledger.source(), generate_tickets(n, random.Random(seed)))

    append(6, 1)
    done = run_once(ledger)
    append(12, 2)
    with pytest.raises(Crash):
        run_once(ledger, transform=dies_after(6), chunk_rows=5)
    pending = ledger.pending()
    assert done is not None and pending is not None
    # the interrupted attempt's event, as the job publishes it when a signal stops it (through the local bus)
    local_bus(settings).publish(
        BatchJobFailed(
            deployment=settings.top.deployment,
            run_id=pending.run_id,
            consumer="triage",
            task="triage",
            task_version=1,
            source_table=settings.catalog.source_table,
            range=SnapshotRange(
                from_exclusive=pending.from_snapshot_exclusive, to_inclusive=pending.to_snapshot_inclusive
            ),
            reason="interrupted (signal): this attempt committed 5 rows; 5 of the range are committed",
            error_type="JobInterrupted",
            stage="inference",
            retryable=True,
            resumable=True,
            attempt=1,
            rows_processed=6,
            rows_committed=5,
            attempt_rows_committed=5,
            job_seconds=30.0,
            started_at=datetime.now(UTC) - timedelta(seconds=30),
            failed_at=datetime.now(UTC),
        )
    )
    resumed = run_once(ledger, chunk_rows=5)
    assert resumed is not None
    # a job started on a range that is not there: it fails planning, and says so with a real failure event
    with pytest.raises(WatermarkError):
        run_job(settings, JobRequest(run_id="triage-failed-at-plan", to_snapshot=12345), out=lambda _: None)
    ledger.reset(ledger.watermark().source_snapshot_id, reason="operator: nothing to redo")
    append(9, 3)
    with pytest.raises(Crash):
        run_once(ledger, transform=dies_after(4), chunk_rows=3)
    part_way = ledger.pending()
    assert part_way is not None
    ids = {
        "completed": done.plan.run_id,
        "resumed": resumed.plan.run_id,
        "failed": "triage-failed-at-plan",
        "in_progress": part_way.run_id,
    }
    return ledger, ids


@pytest.fixture
def home(settings: Settings, cli_environment: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    only = consumers_file(cli_environment / "consumers", {"name": "triage"})
    monkeypatch.setenv("ICEBATCH_CONSUMERS_FILE", str(only))
    return settings.with_overrides(home=cli_environment, consumers_file=only)


def test_runs_lists_every_run_however_it_ended_with_its_cost(
    home: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a consumer's history: completed, interrupted then resumed, failed, reset, part way through
    _, ids = _history(home)
    capsys.readouterr()
    # when the history is asked for as JSON
    assert icebatch_main(["runs", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    by_status = {r["status"]: r for r in runs}
    # then each of them is there, newest first with the run in progress on top, with what a user asks of a run
    assert [r["status"] for r in runs] == ["in_progress", "reset", "failed", "resumed", "interrupted", "completed"]
    assert by_status["completed"]["run_id"] == ids["completed"] and by_status["completed"]["rows"] == 6
    assert by_status["resumed"]["run_id"] == ids["resumed"] and by_status["resumed"]["attempts"] == 2
    assert by_status["resumed"]["rows"] == 12 and by_status["interrupted"]["run_id"] == ids["resumed"]
    assert by_status["failed"]["run_id"] == ids["failed"] and "not in the source table" in by_status["failed"]["note"]
    assert by_status["reset"]["note"] == "operator: nothing to redo"
    assert by_status["in_progress"]["run_id"] == ids["in_progress"] and by_status["in_progress"]["ended_at"] is None
    assert all(r["cost_usd"] > 0 for r in runs if r["status"] not in ("reset",))
    assert all(r["started_at"] for r in runs if r["status"] in ("completed", "resumed", "interrupted", "failed"))
    # when read as a table, then it has a header and one line per run, each naming its status
    assert icebatch_main(["runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["ENDED", "(UTC)", "CONSUMER"] and len(lines) == 1 + len(runs)
    assert [line.split()[4] for line in lines[2:]] == [r["status"] for r in runs[1:]]
    # and one run shows its attempts: the interrupted one and the run it became
    assert icebatch_main(["runs", "show", ids["resumed"], "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["records"]
    assert sorted(r["status"] for r in shown) == ["interrupted", "resumed"]
    assert icebatch_main(["runs", "show", "nobody-1"]) == 2
    assert "icebatch runs" in capsys.readouterr().err


def test_costs_total_each_day_against_the_budget_without_counting_an_attempt_twice(
    home: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # given the same history
    _history(home)
    capsys.readouterr()
    assert icebatch_main(["runs", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    # when today's spend is asked for
    assert icebatch_main(["costs", "--since", "1d", "--json"]) == 0
    costs = json.loads(capsys.readouterr().out)
    # then it is the two finished runs and the failed attempt that committed nothing; the interrupted attempt
    # that committed rows is already in its run's figure
    [today] = costs["days"]
    expected = sum(r["cost_usd"] for r in runs if r["status"] in ("completed", "resumed", "failed"))
    assert (today["consumer"], today["runs"], today["failed_attempts"], today["rows"]) == ("triage", 2, 1, 18)
    assert today["cost_usd"] == pytest.approx(expected) and costs["total_usd"] == pytest.approx(expected)
    assert today["day"] == datetime.now(UTC).date().isoformat()
    # and the table says so in one line per day and a total
    assert icebatch_main(["costs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("DAY (UTC)") and out[1].startswith(today["day"]) and out[-1].startswith("total since")


@pytest.mark.parametrize("since", ["30", "0d", "1e3d", "30 d", "-1d", "9999999d", "1w"])
def test_costs_refuses_a_look_back_it_cannot_read(
    since: str, cli_environment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert icebatch_main(["costs", f"--since={since}"]) == 2
    assert "not a look-back like 30d or 12h" in capsys.readouterr().err


def test_the_history_reads_the_same_from_the_glue_catalog(any_settings: Settings) -> None:
    from icebatch.tools.runs import history, spend_per_day

    # given a completed run, a reset and a run part way through, on each catalog
    ensure_source_table(open_catalog(any_settings), any_settings.catalog.source_table)
    ledger = open_ledger(any_settings, triage(any_settings))
    append_tickets(ledger.source(), generate_tickets(5, random.Random(1)))
    done = run_once(ledger)
    ledger.reset(ledger.watermark().source_snapshot_id, reason="checked by hand")
    append_tickets(ledger.source(), generate_tickets(6, random.Random(2)))
    with pytest.raises(Crash):
        run_once(ledger, transform=dies_after(4), chunk_rows=3)
    # when the history is read
    rows = history(any_settings, [ledger.consumer], {"triage": ledger})
    # then it is the same on either catalog: part way, reset, completed, and the day's spend is the completed run's
    assert [(r.status, r.rows) for r in rows] == [("in_progress", 3), ("reset", 0), ("completed", 5)]
    assert done is not None and rows[2].run_id == done.plan.run_id and rows[1].note == "checked by hand"
    [today] = spend_per_day(rows, [ledger.consumer], datetime.now(UTC) - timedelta(days=1))
    assert (today.runs, today.rows) == (1, 5) and today.cost_usd == pytest.approx(rows[2].cost_usd)


def test_on_aws_a_failed_attempt_is_on_record_where_icebatch_runs_reads_it(
    glue_settings: Settings, aws_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    from icebatch.control.failure_records import failure_records
    from icebatch.core.events import envelope
    from icebatch.tools.invoke import invoke
    from icebatch.tools.runs import history, spend_per_day

    # given a deployment whose warehouse is in S3 (moto) and a consumer with a completed run in Glue
    s = glue_settings.with_overrides(aws_endpoint_url=aws_endpoint, aws_region=REGION, deployment="icebatch-prod")
    ensure_source_table(open_catalog(s), s.catalog.source_table)
    ledger = open_ledger(s, triage(s))
    append_tickets(ledger.source(), generate_tickets(5, random.Random(1)))
    assert run_once(ledger) is not None
    # when the reporter gets an attempt's failure, twice (at-least-once delivery), the same run's next attempt's
    # failure (a RayJob of its own), and another run's
    failed = BatchJobFailed.model_validate(json.loads(EXAMPLE_FAILED.read_text())["detail"]).model_copy(
        update={"deployment": "icebatch-prod", "failed_at": datetime.now(UTC) - timedelta(minutes=5)}
    )
    retried = failed.model_copy(
        update={
            "rayjob_name": "ib-triage-2c77a0b1f4-a2",
            "attempt": 2,
            "failed_at": datetime.now(UTC) - timedelta(minutes=3),
        }
    )
    later = failed.model_copy(update={"run_id": "triage-20261205T010000-aaaaaa", "failed_at": datetime.now(UTC)})
    results = [
        invoke("reporter", envelope(d, event_id=str(uuid.uuid4()), time=d.failed_at), s)
        for d in (failed, failed, retried, later)
    ]
    # then each failed attempt is one object under the warehouse, named by its consumer, time and run
    records = failure_records(s)
    assert records is not None and records.prefix == "warehouse/_icebatch/icebatch-prod/failures/"
    s3 = client("s3", aws_endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=records.bucket, Prefix=records.prefix)["Contents"]]
    assert len(keys) == 3 and all(k.startswith(records.prefix + "triage/") for k in keys), keys
    assert {r["failure_record"] for r in results} == {f"s3://{records.bucket}/{k}" for k in keys}
    # when something else lands among them
    s3.put_object(Bucket=records.bucket, Key=f"{records.prefix}triage/20261205T000000000000Z-x.json", Body=b"{oops")
    # then the history lists the completed run and each failed attempt once, newest first, and passes the stranger
    # over, saying so
    rows = history(s, [ledger.consumer], {"triage": ledger})
    assert [(r.status, r.run_id) for r in rows] == [
        ("failed", later.run_id),
        ("completed", ledger.runs()[0].run_id),
        ("failed", failed.run_id),
        ("failed", failed.run_id),
    ]
    assert rows[0].note.startswith("start: CUDA out of memory") and rows[0].cost_usd > 0
    assert any("is not a failure record, passed over" in r.getMessage() for r in caplog.records)
    # and a day's spend read from an hour back counts the three failed attempts (none committed rows)
    [today] = spend_per_day(
        history(s, [ledger.consumer], {"triage": ledger}, since=datetime.now(UTC) - timedelta(hours=1)),
        [ledger.consumer],
        datetime.now(UTC) - timedelta(hours=1),
    )
    assert (today.runs, today.failed_attempts) == (1, 3)


def test_a_failure_that_cannot_be_put_on_record_is_still_reported_and_says_so(
    glue_settings: Settings, aws_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    from icebatch.core.events import envelope
    from icebatch.tools.invoke import invoke

    # given a deployment whose warehouse bucket is not there (deleted, or a typo in the stack's parameters)
    s = glue_settings.with_overrides(
        aws_endpoint_url=aws_endpoint, aws_region=REGION, warehouse=f"s3://gone-{uuid.uuid4().hex[:8]}/warehouse/"
    )
    detail = BatchJobFailed.model_validate(json.loads(EXAMPLE_FAILED.read_text())["detail"])
    # when the reporter gets a failure, then the report still goes out, and the result and the log say what is missing
    result = invoke(
        "reporter",
        envelope(detail, event_id=str(uuid.uuid4()), time=detail.failed_at),
        s.with_overrides(catalog_properties={}),
    )
    assert result["status"] == "reported" and result["failure_record"].startswith("not recorded: "), result
    assert "NoSuchBucket" in result["failure_record"]
    assert any("`icebatch runs` will not list this attempt" in r.getMessage() for r in caplog.records)
    # and where the warehouse is not in S3 (the embedded default), nothing is put on record: the event log is it
    local = invoke(
        "reporter", envelope(detail, event_id=str(uuid.uuid4()), time=detail.failed_at), Settings(home=s.home / "local")
    )
    assert local["status"] == "reported" and "failure_record" not in local
