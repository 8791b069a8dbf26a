"""Exactly once through what production tables go through: long streaming histories, drop and recreate.

Each case drives the ledger as the job does (``tests.support.runs``: the job's planning, reading, chunking
and commits, with a rule-based labeller) on a real SQL catalog, and checks the outcome with an independent
count: the source table's live ids against the result rows' ids, read back with plain scans.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.errors import InvalidTaskError, SourceReplacedError
from icebatch.core.ledger import ResultsLedger, open_ledger
from icebatch.core.settings import Settings
from icebatch.tools.cli import main as icebatch_main
from icebatch.tools.invoke import invoke
from icebatch_job.commit.done import DoneRows
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets
from icebatch_job.plan.source import IncrementalIcebergDatasource, plan_range
from pyiceberg.expressions import In
from pyiceberg.types import IntegerType, LongType
from ray import cloudpickle

from tests.support.consumers import TASKS, consumers_file, triage
from tests.support.crafted_history import add_empty_appends
from tests.support.emf import metric_names
from tests.support.runs import ledger_ids, run_once, source_ids

pytestmark = pytest.mark.functional
EVENTS = Path(__file__).resolve().parents[2] / "sam" / "events"
SCHEDULE = json.loads((EVENTS / "schedule.json").read_text())


def _ledger(settings: Settings) -> ResultsLedger:
    ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    return open_ledger(settings, triage(settings))


def _labelled(settings: Settings, n: int) -> ResultsLedger:
    """A consumer that labelled its source's first ``n`` rows."""
    ledger = _ledger(settings)
    _append(ledger, n, seed=1)
    run_once(ledger)
    return ledger


def _append(ledger: ResultsLedger, n: int, seed: int) -> int:
    return append_tickets(ledger.source(), generate_tickets(n, random.Random(seed)))


def _every_live_row_once(ledger: ResultsLedger) -> None:
    """The independent count: each live source id has exactly one result row, and no other id has one."""
    results = Counter(ledger_ids(ledger))
    live = Counter(source_ids(ledger))
    assert {i: n for i, n in results.items() if n > 1} == {}
    assert set(results) == set(live), (sorted(set(live) - set(results))[:5], sorted(set(results) - set(live))[:5])


# --------------------------------------------------------------------------------------------------
# a streaming-fed source: thousands of snapshots
# --------------------------------------------------------------------------------------------------
def test_read_tasks_do_not_carry_the_sources_history(settings: Settings) -> None:
    # given a source fed by a streaming writer: rows, 1,000 checkpoints, more rows
    ledger = _ledger(settings)
    _append(ledger, 5, seed=1)
    add_empty_appends(ledger.source(), 1000)
    _append(ledger, 7, seed=2)
    plan = ledger.plan()
    assert plan is not None and plan.expected_rows == 12
    # when the job plans its read tasks
    planned = plan_range(ledger.source(), plan)
    tasks = IncrementalIcebergDatasource(planned, DoneRows()).get_read_tasks(2)
    # then each is small (Ray warns past 1 MiB, and its warning names the task's function, which has a name):
    # it carries its files and what reading them needs, not 1,000 snapshots (about 360 KB of them; at about 3,000
    # Ray's warning about a large read task failed the read: tests/engine/test_source_read.py)
    sizes = [len(cloudpickle.dumps(t)) for t in tasks]
    assert max(sizes) < 64 * 1024, sizes
    assert all(t.read_fn.__name__ for t in tasks)
    # and, run as Ray runs them, they read every row of the range once
    rows = [row for t in tasks for block in t() for row in block.column("ticket_id").to_pylist()]
    assert sorted(rows) == sorted(source_ids(ledger))


def test_planning_a_range_walks_the_history_once(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyiceberg.table.metadata import TableMetadataV2

    # given a source with 1,000 streaming checkpoints between two appends
    ledger = _ledger(settings)
    _append(ledger, 5, seed=1)
    add_empty_appends(ledger.source(), 1000, distinct_lists=True)
    _append(ledger, 7, seed=2)
    plan = ledger.plan()
    assert plan is not None
    # when the job plans the range's files, counting every snapshot looked up by id in the whole snapshot list
    lookups = []
    real = TableMetadataV2.snapshot_by_id
    monkeypatch.setattr(TableMetadataV2, "snapshot_by_id", lambda self, sid: lookups.append(sid) or real(self, sid))
    planned = plan_range(ledger.source(), plan)
    # then it found the range's files with a handful of lookups, not one per ancestor (pyiceberg's incremental
    # append scan looked every parent up, 1,003 lookups here, each a scan of the whole snapshot list: quadratic)
    assert planned.rows == 12 and len(planned.tasks) == 2
    assert len(lookups) <= 3, len(lookups)


def _live_files(table: Any, snapshot_id: int | None) -> set[str]:
    if snapshot_id is None:
        return set()
    return {t.file.file_path for t in table.scan(snapshot_id=snapshot_id).plan_files()}


def test_the_planned_files_are_the_appended_or_the_live_ones_for_every_range(settings: Settings) -> None:
    from icebatch.core.ledger import RunPlan
    from pyiceberg.expressions import In

    # given a source whose appends merge manifests (as a streaming writer's do), then a delete, then appends
    ledger = _ledger(settings)
    with ledger.source().transaction() as txn:
        txn.set_properties({"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "2"})
    ids = [_append(ledger, 2, seed=i) for i in range(6)]
    ledger.source().delete(In("ticket_id", source_ids(ledger)[:3]))
    ids.append(ledger.source().metadata.current_snapshot_id)
    ids += [_append(ledger, 2, seed=10 + i) for i in range(3)]
    table = ledger.source()
    manifests = table.current_snapshot().manifests(table.io)  # type: ignore[union-attr]
    assert len(manifests) < 5 and all(m.added_snapshot_id == ids[-1] for m in manifests)  # merged by the last one
    # when each range is planned (append-only ranges from the end's manifests; ranges holding the delete, by what
    # is live at their end)
    for start in (None, ids[0], ids[2], ids[5], ids[6]):
        for end in ids[ids.index(start) + 1 if start else 0 :]:
            plan = RunPlan(
                run_id="r",
                consumer="c",
                task="t",
                task_version=1,
                source_table="s",
                results_table="r",
                from_snapshot_exclusive=start,
                to_snapshot_inclusive=end,
                expected_rows=0,
                snapshots=0,
                scan_from_exclusive=start,
            )
            planned = plan_range(table, plan)
            mine = sorted(t.file.file_path for t in planned.tasks)
            scan = table.incremental_append_scan(from_snapshot_id_exclusive=start, to_snapshot_id_inclusive=end)
            holds_the_delete = ids.index(start) < 6 <= ids.index(end) if start else ids.index(end) >= 6
            # then an append-only range's files are pyiceberg's incremental append scan's, whichever way they were
            # found; a first range, or one holding the delete, reads the files live at its end not live at its start
            assert planned.rewrites == (holds_the_delete and start is not None), (start, end)  # a first run: all
            if holds_the_delete or start is None:
                assert mine == sorted(_live_files(table, end) - _live_files(table, start)), (start, end)
            else:
                assert mine == sorted(t.file.file_path for t in scan.plan_files()), (start, end)


def test_a_run_over_thousands_of_snapshots_labels_each_row_once(settings: Settings) -> None:
    # given a processed source, then 1,000 streaming checkpoints among new rows
    ledger = _labelled(settings, 10)
    add_empty_appends(ledger.source(), 500, seed=1)
    _append(ledger, 4, seed=2)
    add_empty_appends(ledger.source(), 500, seed=2)
    _append(ledger, 3, seed=3)
    # when the backlog is computed and the next run goes
    backlog = ledger.backlog()
    run = run_once(ledger)
    # then the backlog counted the new rows, the run labelled them, and nothing is left
    assert (backlog.rows, backlog.snapshots) == (7, 1002)
    assert run is not None and run.stats.rows == 7
    assert ledger.backlog().rows == 0
    _every_live_row_once(ledger)


# --------------------------------------------------------------------------------------------------
# the table's identity: dropped and created again
# --------------------------------------------------------------------------------------------------
def _labelled_then_recreated(settings: Settings) -> tuple[ResultsLedger, list[str]]:
    """A consumer that labelled 30 rows (3 snapshots); then its source dropped and created again with 160 new
    rows in 4 snapshots (snapshot ids new, sequence numbers restarting at 1). Returns the old table's ids."""
    ledger = _ledger(settings)
    for seed in (1, 2, 3):
        _append(ledger, 10, seed=seed)
    run_once(ledger)
    old_ids = source_ids(ledger)
    catalog = open_catalog(settings)
    catalog.drop_table(settings.catalog.source_table)
    ensure_source_table(catalog, settings.catalog.source_table)
    for seed in (11, 12, 13, 14):
        _append(ledger, 40, seed=seed)
    return ledger, old_ids


def test_a_recreated_source_is_refused_by_the_launcher_and_the_job(
    settings: Settings, cli_environment: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a consumer (the only one) whose source was dropped and created again under the same name
    only = consumers_file(cli_environment / "consumers", {"name": "triage"})
    settings = settings.with_overrides(home=cli_environment, consumers_file=only)
    ledger, _old = _labelled_then_recreated(settings)
    before = ledger.results().metadata.current_snapshot_id  # type: ignore[union-attr]
    capsys.readouterr()
    # when the nightly schedule fires
    response = invoke("launcher", SCHEDULE, settings)
    # then the launcher decides source_replaced: no job, a reason naming both tables and the fix, counted as a
    # launch error (alarmed)
    [d] = response["decisions"]
    assert d["decision"] == "source_replaced", d
    assert "dropped and created again" in d["reason"] and "--new-source" in d["reason"] and "\n" not in d["reason"]
    assert d["job_name"] is None and response["manifests"] == [None]
    assert "LaunchErrors" in metric_names(capsys.readouterr().out)
    # and the job, started by hand, refuses before reading a row (exit 2, one line), and nothing was committed
    with pytest.raises(SourceReplacedError):
        ledger.plan()
    monkeypatch.setenv("ICEBATCH_CONSUMERS_FILE", str(only))
    assert icebatch_main(["job", "run"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "created again" in line]  # (and the report's log)
    assert len(err) == 1 and err[0].startswith("icebatch: error: ") and "Traceback" not in err[0], err
    assert ledger.results().metadata.current_snapshot_id == before  # type: ignore[union-attr]


@pytest.mark.parametrize("old_verdicts", ["drop-results", "keep-results"])
def test_after_a_reset_onto_the_new_source_every_new_row_is_labelled_once(
    settings: Settings, cli_environment: Path, capsys: pytest.CaptureFixture[str], old_verdicts: str
) -> None:
    # given a consumer whose source was dropped and created again (160 new rows)
    settings = settings.with_overrides(home=cli_environment)
    ledger, old_ids = _labelled_then_recreated(settings)
    # when a reset without --new-source is tried, then it is refused in one line that names the flag
    assert icebatch_main(["ledger", "reset", "--consumer", "triage", "--to-snapshot", "none", "--reason", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--new-source" in err, err
    # when the operator follows the new table from its start
    argv = ["ledger", "reset", "--consumer", "triage", "--to-snapshot", "none", "--reason", "source recreated"]
    assert icebatch_main([*argv, "--new-source", old_verdicts]) == 0
    # then the backlog is the new table's 160 rows, and a run labels each of them once
    assert ledger.backlog().rows == 160
    run = run_once(ledger)
    assert run is not None and run.stats.rows == 160
    labelled = Counter(ledger_ids(ledger))
    new_ids = source_ids(ledger)
    assert all(labelled[i] == 1 for i in new_ids) and len(new_ids) == 160
    # and the old table's verdicts are gone or kept, as asked
    kept = sum(labelled[i] for i in set(old_ids) - set(new_ids))
    assert kept == (0 if old_verdicts == "drop-results" else len(set(old_ids) - set(new_ids)))
    assert ledger.backlog().rows == 0


def test_a_reset_of_a_source_that_was_not_replaced_refuses_new_source(settings: Settings) -> None:
    # given a consumer that labelled its source, which is still the same table
    ledger = _labelled(settings, 5)
    # when a reset claims the source was replaced, then it is refused (nothing would be followed anew)
    with pytest.raises(Exception, match="leave --new-source out"):
        ledger.reset(None, reason="x", new_source="drop-results")


# --------------------------------------------------------------------------------------------------
# schema evolution: the task's columns followed by field id
# --------------------------------------------------------------------------------------------------
def _only_triage(settings: Settings, home: Path, task: Path | None = None) -> Settings:
    entry: dict[str, Any] = {"name": "triage", "backlog_threshold": 1}
    path = consumers_file(home / "consumers", entry)
    if task is not None:  # a task file of the test's own
        path.write_text(path.read_text().replace(str(TASKS / "triage.json"), str(task)))
    return settings.with_overrides(home=home, consumers_file=path)


def _labelled_alone(settings: Settings, home: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Settings, ResultsLedger]:
    """Triage, the only consumer (for commands run in this process too), has labelled 6 rows of its source."""
    settings = _only_triage(settings, home)
    monkeypatch.setenv("ICEBATCH_CONSUMERS_FILE", str(settings.launch.consumers_file))
    ledger = _labelled(settings, 6)
    return settings, ledger


def _summaries(ledger: ResultsLedger) -> dict[str, str]:
    table = ledger.results()
    assert table is not None
    rows = table.scan(selected_fields=("source_id", "summary")).to_arrow().to_pylist()
    return {r["source_id"]: r["summary"] for r in rows}


def test_renamed_prompt_columns_are_still_read(settings: Settings) -> None:
    # given a consumer that labelled its source's rows
    ledger = _labelled(settings, 6)
    # when the source renames two columns the prompt reads (the id column among them), and new rows arrive
    with ledger.source().update_schema() as update:
        update.rename_column("subject", "title")
        update.rename_column("ticket_id", "id")
    _append_renamed(ledger, 5, seed=2)
    # then the backlog and the launcher see the new rows as work, and the run reads the renamed columns under the
    # task's names: each new row's verdict was made from its title (the rule labeller summarizes the subject)
    assert ledger.backlog().rows == 5
    run = run_once(ledger)
    assert run is not None and run.stats.rows == 5
    titles = {r["id"]: r["title"][:120] for r in ledger.source().scan().to_arrow().to_pylist()}
    assert _summaries(ledger) == titles
    assert ledger.backlog().rows == 0


def _append_renamed(ledger: ResultsLedger, n: int, seed: int) -> None:
    rows = generate_tickets(n, random.Random(seed))
    renamed = [{{"subject": "title", "ticket_id": "id"}.get(k, k): v for k, v in r.items()} for r in rows]
    table = ledger.source()
    table.append(pa.Table.from_pylist(renamed, schema=table.schema().as_arrow()))


def test_a_dropped_prompt_column_is_refused_before_any_job(
    settings: Settings, cli_environment: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a consumer (the only one) that labelled its source's rows
    settings, ledger = _labelled_alone(settings, cli_environment, monkeypatch)
    before = ledger.results().metadata.current_snapshot_id  # type: ignore[union-attr]
    # when the source drops a column the prompt reads, and new rows arrive
    with ledger.source().update_schema() as update:
        update.delete_column("channel")
    table = ledger.source()
    new_rows = [{k: v for k, v in r.items() if k != "channel"} for r in generate_tickets(4, random.Random(2))]
    table.append(pa.Table.from_pylist(new_rows, schema=table.schema().as_arrow()))
    capsys.readouterr()
    # then the launcher refuses the consumer: invalid_task, one line naming the consumer, the task and the column
    [d] = invoke("launcher", SCHEDULE, settings)["decisions"]
    assert d["decision"] == "invalid_task" and d["job_name"] is None, d
    assert "'triage'" in d["reason"] and "'ticket-triage'" in d["reason"] and "'channel'" in d["reason"]
    assert "dropped" in d["reason"] and "\n" not in d["reason"]
    assert "LaunchErrors" in metric_names(capsys.readouterr().out)
    # and `icebatch estimate`, `launch --dry-run` and a job started by hand say so in one line (exit 2)
    for argv in (["estimate"], ["launch", "--dry-run"], ["job", "run"]):
        status = icebatch_main(argv)
        out = capsys.readouterr()
        said = [line for line in (out.err + out.out).splitlines() if line.startswith(("icebatch: error: ", "reason"))]
        assert status == 2 and "'channel'" in said[0] and "Traceback" not in out.err, (argv, status, out)
    assert ledger.results().metadata.current_snapshot_id == before  # type: ignore[union-attr]


def test_a_column_dropped_and_added_again_is_refused_until_a_reset_records_it(settings: Settings) -> None:
    # given a consumer that labelled its source's rows
    ledger = _labelled(settings, 6)
    watermark = ledger.watermark().source_snapshot_id
    # when a prompt column is dropped and added again under the same name (a new field id: another type)
    with ledger.source().update_schema() as update:
        update.delete_column("customer_tier")
    with ledger.source().update_schema() as update:
        update.add_column("customer_tier", IntegerType())
    table = ledger.source()
    rows = [{**r, "customer_tier": 2} for r in generate_tickets(3, random.Random(2))]
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))
    # then it is not read as the old column: refused, naming the new column and the reset that accepts it
    with pytest.raises(InvalidTaskError, match="was added since"):
        ledger.backlog()
    # and once an operator resets at the watermark, the next run reads the new column
    ledger.reset(watermark, reason="customer_tier is now a number")
    run = run_once(ledger)
    assert run is not None and run.stats.rows == 3
    _every_live_row_once(ledger)


def test_a_misspelt_column_is_refused_before_the_first_run(settings: Settings, tmp_path: Path) -> None:
    # given a task whose prompt reads a column the source does not have
    task = json.loads((TASKS / "triage.json").read_text())
    task["input_columns"] = ["subjet" if c == "subject" else c for c in task["input_columns"]]
    task["user_template"] = task["user_template"].replace("{subject}", "{subjet}")
    (tmp_path / "task.json").write_text(json.dumps(task))
    settings = _only_triage(settings, tmp_path / "home", tmp_path / "task.json")
    ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    append_tickets(
        open_catalog(settings).load_table(settings.catalog.source_table), generate_tickets(5, random.Random(1))
    )
    # when a manual dry run asks what the launcher would do, then it says invalid_task, naming the column
    [d] = invoke("launcher", {"action": "launch", "dry_run": True}, settings)["decisions"]
    assert d["decision"] == "invalid_task" and "has no column 'subjet'" in d["reason"], d


def test_added_and_widened_columns_and_a_new_partition_spec_change_nothing(settings: Settings) -> None:
    # given a consumer that labelled its source's rows
    ledger = _labelled(settings, 6)
    # when the source gains a column, widens it, and is partitioned anew, and rows arrive in the new layout
    with ledger.source().update_schema() as update:
        update.add_column("priority", IntegerType())
    with ledger.source().update_schema() as update:
        update.update_column("priority", LongType())
    with ledger.source().update_spec() as spec:
        spec.add_identity("channel")
    table = ledger.source()
    rows = [{**r, "priority": 7} for r in generate_tickets(5, random.Random(2))]
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))
    # then the next run labels the new rows, once each
    run = run_once(ledger)
    assert run is not None and run.stats.rows == 5
    _every_live_row_once(ledger)


# --------------------------------------------------------------------------------------------------
# deletes, overwrites, upserts: verdicts follow the rows' content (icebatch_job.plan.identity)
# --------------------------------------------------------------------------------------------------
def _verdicts(ledger: ResultsLedger) -> list[dict[str, Any]]:
    table = ledger.results()
    assert table is not None
    return table.scan(selected_fields=("source_id", "run_id", "summary")).to_arrow().to_pylist()


def _runs_of(ledger: ResultsLedger) -> dict[str, str]:
    """Each verdict's run, by source id (an id with two verdicts is caught by ``_every_live_row_once``)."""
    return {v["source_id"]: v["run_id"] for v in _verdicts(ledger)}


def _only_new_rows_sent(ledger: ResultsLedger, run: Any, *, new: int, first: dict[str, str], unchanged: int) -> None:
    """The run sent ``new`` rows to the model; every live row has one verdict, the ``first`` ones from their first
    run, and the run's commit counts ``unchanged`` rows it did not send."""
    assert run is not None and run.stats.rows == new
    _every_live_row_once(ledger)
    assert {i: r for i, r in _runs_of(ledger).items() if i in first} == first
    assert _summary(ledger)["icebatch.rows-unchanged"] == str(unchanged)


def _summary(ledger: ResultsLedger) -> dict[str, str]:
    table = ledger.results()
    assert table is not None and table.current_snapshot() is not None
    return dict(table.current_snapshot().summary.additional_properties)  # type: ignore[union-attr]


def test_verdicts_of_rows_deleted_from_the_source_are_removed_by_the_next_run(any_settings: Settings) -> None:
    from pyiceberg.expressions import In

    # given a consumer that labelled its source's 12 rows
    ledger = _labelled(any_settings, 12)
    # when three rows are deleted from the source (pyiceberg: copy-on-write) and nothing new arrives
    gone = source_ids(ledger)[:3]
    ledger.source().delete(In("ticket_id", gone))
    run = run_once(ledger)
    # then a run still goes (no row to label), and its commit removes exactly their verdicts
    assert run is not None and run.stats.rows == 0
    assert not set(gone) & set(ledger_ids(ledger))
    _every_live_row_once(ledger)
    assert _summary(ledger)["icebatch.verdicts-removed-deleted"] == "3"
    assert ledger.backlog().rows == 0 and run_once(ledger) is None


def test_a_row_deleted_before_its_run_is_never_sent_to_the_model(settings: Settings) -> None:
    from pyiceberg.expressions import In

    # given a labelled source, then ten new rows of which two are deleted before any run sees them
    ledger = _labelled(settings, 5)
    before = set(source_ids(ledger))
    _append(ledger, 10, seed=2)
    erased = sorted(set(source_ids(ledger)) - before)[:2]
    ledger.source().delete(In("ticket_id", erased))
    # when the next run goes
    run = run_once(ledger)
    # then it labelled the eight that are left, not the erased two, and labelled nothing twice
    assert run is not None and run.stats.rows == 8
    assert not set(erased) & set(ledger_ids(ledger))
    _every_live_row_once(ledger)


def test_an_overwrite_with_the_same_rows_sends_nothing_again(any_settings: Settings) -> None:
    # given a consumer that labelled its source's 20 rows
    ledger = _labelled(any_settings, 20)
    labelled = _runs_of(ledger)
    # when the whole table is overwritten with the same rows (truncate and reload in one commit), plus two new rows
    source = ledger.source()
    source.overwrite(source.scan().to_arrow())
    _append(ledger, 2, seed=2)
    run = run_once(ledger)
    # then only the two new rows went to the model, and the 20 keep their first verdict
    _only_new_rows_sent(ledger, run, new=2, first=labelled, unchanged=20)


def test_an_upsert_relabels_the_changed_rows_and_supersedes_their_verdicts(any_settings: Settings) -> None:
    import pyarrow.compute as pc

    # given a consumer that labelled its source's 10 rows
    ledger = _labelled(any_settings, 10)
    # when two rows are updated (new subjects) and one inserted by pyiceberg's upsert, with three unchanged rows
    source = ledger.source()
    rows = source.scan().to_arrow().sort_by("ticket_id")
    changed = rows.slice(0, 2)
    changed = changed.set_column(
        changed.schema.get_field_index("subject"),
        "subject",
        pc.binary_join_element_wise(changed["subject"], " (reopened)", ""),
    )
    new = pa.Table.from_pylist(generate_tickets(1, random.Random(7)), schema=source.schema().as_arrow())
    new = new.set_column(0, "ticket_id", pa.array(["T-NEW"]))
    upserted = source.upsert(pa.concat_tables([changed, rows.slice(2, 3), new.cast(rows.schema)]), ["ticket_id"])
    assert (upserted.rows_updated, upserted.rows_inserted) == (2, 1)
    run = run_once(ledger)
    # then exactly the changed and the new rows went to the model; each id has one verdict, the changed ones the
    # new subject's
    assert run is not None and run.stats.rows == 3
    _every_live_row_once(ledger)
    summaries = {v["source_id"]: v["summary"] for v in _verdicts(ledger)}
    assert all(summaries[i].endswith("(reopened)") for i in changed["ticket_id"].to_pylist())
    assert _summary(ledger)["icebatch.verdicts-removed-superseded"] == "2"


def test_merge_on_read_position_deletes_are_followed(settings: Settings) -> None:
    from tests.support.crafted_history import add_position_deletes, positions_of

    # given a consumer that labelled 10 rows, then 5 new rows, and a merge-on-read delete (a position delete file,
    # as Spark writes one) of one labelled row and one new row
    ledger = _labelled(settings, 10)
    labelled = set(ledger_ids(ledger))
    _append(ledger, 5, seed=2)
    new = sorted(set(source_ids(ledger)) - labelled)
    erased = [sorted(labelled)[0], new[0]]
    add_position_deletes(ledger.source(), positions_of(ledger.source(), erased))
    assert set(erased).isdisjoint(source_ids(ledger))  # pyiceberg's own scan applies the delete file
    # when the next run goes
    run = run_once(ledger)
    # then the new row deleted before its run never went to the model, the other four did, and the labelled
    # row's verdict is removed
    assert run is not None and run.stats.rows == 4
    assert set(erased).isdisjoint(ledger_ids(ledger))
    _every_live_row_once(ledger)


def test_a_run_over_deletes_killed_part_way_resumes_without_loss_or_repeat(settings: Settings) -> None:
    from pyiceberg.expressions import In

    from tests.support.runs import Crash, dies_after

    # given a labelled source, then 30 new rows, some old and new rows deleted, and an overwrite of the same rows
    ledger = _labelled(settings, 10)
    first = set(ledger_ids(ledger))
    _append(ledger, 30, seed=2)
    ledger.source().delete(In("ticket_id", source_ids(ledger)[::7]))
    source = ledger.source()
    source.overwrite(source.scan().to_arrow())
    new = set(source_ids(ledger)) - first
    # when its run is killed after its second chunk, and the next attempt resumes it
    with pytest.raises(Crash):
        run_once(ledger, transform=dies_after(12), chunk_rows=5)
    resumed = run_once(ledger, chunk_rows=5)
    # then every live row has one verdict, no deleted row has one, and the run labelled each new live row once
    assert resumed is not None and resumed.plan.resume is not None and resumed.plan.resume.rows_committed == 10
    _every_live_row_once(ledger)
    mine = [v["source_id"] for v in _verdicts(ledger) if v["run_id"] == resumed.plan.run_id]
    assert sorted(mine) == sorted(new) and resumed.stats.rows == len(new)


def test_rows_deleted_are_counted_by_the_backlog_and_a_job_removes_their_verdicts_without_an_engine(
    settings: Settings, cli_environment: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray
    from pyiceberg.expressions import In

    # given a consumer that labelled its source's rows
    _, ledger = _labelled_alone(settings, cli_environment, monkeypatch)
    # when two of them are deleted from the source (pyiceberg: copy-on-write)
    gone = source_ids(ledger)[:2]
    ledger.source().delete(In("ticket_id", gone))
    # then the backlog says so, by name and count
    assert (ledger.backlog().rows, ledger.backlog().deleted_rows) == (0, 2)
    assert icebatch_main(["backlog", "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert shown["deleted_rows"] == 2
    assert icebatch_main(["backlog"]) == 0
    assert "deleted in the source : 2 rows" in capsys.readouterr().out
    # and the job completes with no row labelled, removes the two verdicts, and starts neither Ray nor an engine
    assert icebatch_main(["job", "run", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["status"], result["rows"]) == ("completed", 0)
    assert not ray.is_initialized()
    assert not set(gone) & set(ledger_ids(ledger))
    _every_live_row_once(ledger)


def test_job_run_prints_its_report_once(
    settings: Settings, cli_environment: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyiceberg.expressions import In

    # given a consumer with verdicts to remove (a run with no engine: quick, and a whole report all the same)
    _, ledger = _labelled_alone(settings, cli_environment, monkeypatch)
    ledger.source().delete(In("ticket_id", source_ids(ledger)[:1]))
    capsys.readouterr()
    # when the job runs on a terminal, its completion event delivered to the local reporter in the same process
    assert icebatch_main(["job", "run"]) == 0
    out = capsys.readouterr().out
    # then the report's blocks are printed once, and the reporter says where it filed the report
    assert out.count("BATCH SUMMARY") == 1 and out.count("TOKENOMICS") == 1, out
    [filed] = [line for line in out.splitlines() if line.startswith("[report] ")]
    assert "written to " in filed and filed.endswith(".completed.txt")
    assert "BATCH SUMMARY" in Path(filed.split("written to ")[1]).read_text()


def test_a_recreated_source_on_each_catalog_is_refused_then_followed_after_a_reset(any_settings: Settings) -> None:
    # given a consumer whose source was dropped and created again, on the SQL catalog and on Glue with S3 (moto)
    ledger, old_ids = _labelled_then_recreated(any_settings)
    # then its next plan is refused (another table UUID), and so is a reset that does not say so
    with pytest.raises(SourceReplacedError):
        ledger.plan()
    with pytest.raises(SourceReplacedError):
        ledger.reset(None, reason="x")
    # when the operator follows the new table and drops the old verdicts (deleted in the reset's commit)
    ledger.reset(None, reason="source recreated", new_source="drop-results")
    run = run_once(ledger)
    # then every new row has one verdict and none of the old table's rows has any
    assert run is not None and run.stats.rows == 160
    _every_live_row_once(ledger)
    assert not set(old_ids) - set(source_ids(ledger)) & set(ledger_ids(ledger))


def test_rows_deleted_with_none_added_launch_a_run_that_removes_their_verdicts_without_an_engine(
    settings: Settings, cli_environment: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray
    from pyiceberg.expressions import In

    # given a consumer that labelled its source's rows, two of which are then erased (nothing added)
    _, ledger = _labelled_alone(settings, cli_environment, monkeypatch)
    gone = source_ids(ledger)[:2]
    ledger.source().delete(In("ticket_id", gone))
    capsys.readouterr()
    # when the table-change trigger reaches the launcher (the embedded default: the job runs in this process)
    assert icebatch_main(["launch", "--trigger", "append", "--json"]) == 0
    captured = capsys.readouterr()
    [d] = json.loads(captured.out)["decisions"]
    # then it launched, whatever the threshold, and the run removed the two verdicts with no Ray and no engine
    assert d["decision"] == "launch" and d["reason"].startswith("2 deleted and "), d
    # (while it ran, the terminal was told which job runs here and where its console is)
    [said] = [line for line in captured.err.splitlines() if "runs here now" in line]
    assert said.startswith(f"[icebatch] triage: job {d['job_name']} runs here now") and said.endswith(".log")
    assert not ray.is_initialized()
    assert not set(gone) & set(ledger_ids(ledger))
    _every_live_row_once(ledger)
    # and its completion event and report say so, as the job sent them and rebuilt from the ledger
    events = [json.loads(line) for line in (cli_environment / "events.jsonl").read_text().splitlines()]
    [completed] = [e["detail"] for e in events if e["detail-type"] == "Batch Job Completed"][-1:]
    assert (completed["rows"], completed["verdicts_removed"]) == (0, 2), completed
    assert icebatch_main(["report", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["rows"], report["verdicts_removed"]) == (0, 2), report
    assert icebatch_main(["report"]) == 0
    assert "verdicts removed      : 2" in capsys.readouterr().out
    # and the next trigger finds nothing to do
    assert ledger.backlog().rows == 0 and not ledger.backlog().rewrites


# --------------------------------------------------------------------------------------------------
# format v3: upgraded in place, deletion vectors (row lineage is not read: pyiceberg 0.12 projects no _row_id)
# --------------------------------------------------------------------------------------------------
def test_a_source_upgraded_to_v3_with_deletion_vectors_is_followed_exactly_once(settings: Settings) -> None:
    from tests.support.crafted_history import positions_of
    from tests.support.format_v3 import add_deletion_vectors, upgrade_to_v3, written_as_v2

    # given a consumer that labelled 10 rows of a v2 source, which is then upgraded to v3 in place
    ledger = _labelled(settings, 10)
    labelled = set(ledger_ids(ledger))
    upgrade_to_v3(ledger.source())
    # when a v3 writer appends 5 rows, then deletes one labelled and one new row with a deletion vector
    with written_as_v2(ledger.source()):
        _append(ledger, 5, seed=2)
    new = sorted(set(source_ids(ledger)) - labelled)
    erased = [sorted(labelled)[0], new[0]]
    with written_as_v2(ledger.source()) as source:
        add_deletion_vectors(source, positions_of(source, erased))
    source = ledger.source()
    assert source.metadata.format_version == 3 and source.metadata.next_row_id == 5  # the appended rows' ids
    assert set(erased).isdisjoint(source_ids(ledger))  # pyiceberg's scan applies the deletion vector
    assert ledger.backlog().rows == 5
    run = run_once(ledger)
    # then the erased new row never went to the model, the four others did, the erased labelled row's verdict is
    # removed, and the commit records the source's format
    assert run is not None and run.stats.rows == 4
    assert set(erased).isdisjoint(ledger_ids(ledger))
    _every_live_row_once(ledger)
    assert _summary(ledger)["icebatch.verdicts-removed-deleted"] == "1"
    assert _summary(ledger)["icebatch.source-format-version"] == "3"
    assert ledger.backlog().rows == 0 and run_once(ledger) is None


# --------------------------------------------------------------------------------------------------
# per-consumer policy: on_delete, on_update
# --------------------------------------------------------------------------------------------------
def _with_policy(settings: Settings, **policy: str) -> ResultsLedger:
    ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    return open_ledger(settings, triage(settings).model_copy(update=policy))


def test_on_delete_keep_leaves_the_verdicts_of_deleted_rows_and_launches_nothing_for_them(settings: Settings) -> None:
    from pyiceberg.expressions import In

    # given a consumer whose results are a record (on_delete: keep) that labelled its source's 12 rows
    ledger = _with_policy(settings, on_delete="keep")
    _append(ledger, 12, seed=1)
    run_once(ledger)
    # when three rows are deleted from the source (pyiceberg rewrites their file: copy-on-write) and nothing new
    # arrives, then the launcher's run over it removes nothing (the copies, matched by content, are not labelled)
    gone = source_ids(ledger)[:3]
    ledger.source().delete(In("ticket_id", gone))
    consumers = consumers_file(settings.home / "consumers", {"name": "triage", "on_delete": "keep"})
    decision = invoke("launcher", SCHEDULE, settings.with_overrides(consumers_file=consumers))["decisions"][0]
    assert decision["decision"] == "launch", decision
    assert decision["reason"].startswith("9 rows rewritten (copy-on-write)") and "removed" not in decision["reason"]
    assert set(gone) <= set(ledger_ids(ledger)) and ledger.backlog().rows == 0
    # and a delete that rewrites nothing (a whole file's rows) launches no run at all
    before = set(source_ids(ledger))
    _append(ledger, 4, seed=3)
    run_once(ledger)
    whole_file = sorted(set(source_ids(ledger)) - before)
    ledger.source().delete(In("ticket_id", whole_file))
    decision = invoke("launcher", SCHEDULE, settings.with_overrides(consumers_file=consumers))["decisions"][0]
    assert decision["decision"] == "skip" and "nothing new" in decision["reason"], decision
    assert set(whole_file) <= set(ledger_ids(ledger))
    # when two new rows arrive and a run goes, then it labels them and leaves the deleted rows' verdicts
    _append(ledger, 2, seed=2)
    run = run_once(ledger)
    assert run is not None and run.stats.rows == 2
    assert set(gone) | set(whole_file) <= set(ledger_ids(ledger)) and len(ledger_ids(ledger)) == 18
    assert _summary(ledger)["icebatch.verdicts-removed-deleted"] == "0"


def test_on_update_keep_first_sends_no_changed_row_again(settings: Settings) -> None:
    # given a consumer that keeps a row's first verdict (on_update: keep_first) and labelled 10 rows
    ledger = _with_policy(settings, on_update="keep_first")
    _append(ledger, 10, seed=1)
    run_once(ledger)
    first = _summaries(ledger)
    # when two rows are updated (new subjects) and one inserted by an upsert
    source = ledger.source()
    rows = source.scan().to_arrow().sort_by("ticket_id")
    changed = rows.slice(0, 2)
    subjects = [f"{s} (reopened)" for s in changed["subject"].to_pylist()]
    changed = changed.set_column(changed.schema.get_field_index("subject"), "subject", pa.array(subjects))
    new = pa.Table.from_pylist(generate_tickets(1, random.Random(7)), schema=source.schema().as_arrow())
    new = new.set_column(0, "ticket_id", pa.array(["T-NEW"]))
    source.upsert(pa.concat_tables([changed.cast(rows.schema), new.cast(rows.schema)]), ["ticket_id"])
    run = run_once(ledger)
    # then only the new row went to the model; the changed rows keep their first verdicts, one each
    assert run is not None and run.stats.rows == 1
    _every_live_row_once(ledger)
    assert {i: s for i, s in _summaries(ledger).items() if i != "T-NEW"} == first


# --------------------------------------------------------------------------------------------------
# merge-on-read equality deletes: Flink's and Kafka Connect's upserts
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("delete_format", ["PARQUET", "ORC"])
def test_flink_upserts_and_deletes_with_equality_delete_files_are_followed(
    settings: Settings, delete_format: str
) -> None:
    from tests.support.crafted_history import upsert_with_equality_deletes
    from tests.support.live_rows import live_rows

    # given a consumer that labelled 10 rows; then 5 new rows appended, and, as Flink's upsert mode commits them,
    # an upsert (two labelled rows changed, one labelled row unchanged, one new row) and a delete of one labelled
    # row and one of the 5 new ones: data files and equality delete files on the key (Parquet, Flink's default, or
    # ORC: write.delete.format.default), which pyiceberg cannot read
    ledger = _labelled(settings, 10)
    first = _summaries(ledger)
    labelled = sorted(first)
    before = set(labelled)
    _append(ledger, 5, seed=2)
    source = ledger.source()
    fresh = sorted(set(source.scan().to_arrow()["ticket_id"].to_pylist()) - before)
    rows = source.scan().to_arrow().sort_by("ticket_id")
    changed = rows.filter(pa.compute.is_in(rows["ticket_id"], pa.array(labelled[:2])))
    subjects = [f"{s} (reopened)" for s in changed["subject"].to_pylist()]
    changed = changed.set_column(changed.schema.get_field_index("subject"), "subject", pa.array(subjects))
    same = rows.filter(pa.compute.equal(rows["ticket_id"], labelled[2]))
    new = pa.Table.from_pylist(generate_tickets(1, random.Random(7)), schema=source.schema().as_arrow())
    new = new.set_column(0, "ticket_id", pa.array(["T-FLINK"]))
    upsert_with_equality_deletes(
        source,
        pa.concat_tables([t.cast(rows.schema) for t in (changed, same, new)]),
        "ticket_id",
        delete_format=delete_format,
    )
    erased = [labelled[3], fresh[0]]
    upsert_with_equality_deletes(
        ledger.source(), pa.table({"ticket_id": erased}), "ticket_id", delete_format=delete_format
    )
    live = live_rows(ledger.source())
    assert live.num_rows == 10 + 5 + 1 - 2 and not set(erased) & set(live["ticket_id"].to_pylist())
    # when the launcher counts the backlog and the next run goes
    assert ledger.backlog().rows == 5 + 4  # the appended rows and the upsert's (metadata only: an upper bound)
    run = run_once(ledger)
    # then the model saw the 4 new rows left, the 2 changed rows and the upserted new one (not the unchanged row,
    # not the erased ones); each live row has one verdict, the changed ones their new content's; none is erased's
    assert run is not None and run.stats.rows == 4 + 2 + 1
    verdicts = _summaries(ledger)
    assert sorted(verdicts) == sorted(live["ticket_id"].to_pylist())
    assert len(ledger_ids(ledger)) == len(verdicts)
    assert all(verdicts[i].endswith("(reopened)") for i in labelled[:2])
    assert verdicts[labelled[2]] == first[labelled[2]]
    summary = _summary(ledger)
    assert (summary["icebatch.rows-unchanged"], summary["icebatch.verdicts-removed-deleted"]) == ("1", "1")
    assert ledger.backlog().rows == 0 and run_once(ledger) is None


@pytest.mark.parametrize("kind", ["equality", "position"])
def test_a_delete_file_in_a_format_nothing_here_reads_stops_the_job_before_any_work_in_one_line(
    settings: Settings,
    cli_environment: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    from tests.support.crafted_history import add_position_deletes, positions_of, upsert_with_equality_deletes

    # given a consumer that labelled its source's rows, then new rows, and a delete of a labelled row in an Avro
    # delete file (an equality delete on the key, or a position delete)
    _, ledger = _labelled_alone(settings, cli_environment, monkeypatch)
    before = ledger.results().metadata.current_snapshot_id  # type: ignore[union-attr]
    erased = source_ids(ledger)[:1]
    _append(ledger, 3, seed=2)
    if kind == "equality":
        upsert_with_equality_deletes(
            ledger.source(), pa.table({"ticket_id": erased}), "ticket_id", delete_format="AVRO"
        )
    else:
        add_position_deletes(ledger.source(), positions_of(ledger.source(), erased), delete_format="AVRO")
    capsys.readouterr()
    # when the job runs, then it stops before labelling or removing anything: exit 2, one line naming the file's
    # format and the way on, no traceback
    assert icebatch_main(["job", "run"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "AVRO" in line]
    assert len(err) == 1 and err[0].startswith(f"icebatch: error: {kind} delete file "), err
    assert "Parquet or ORC" in err[0] and "write.delete.format.default" in err[0] and "Traceback" not in err[0]
    assert ledger.results().metadata.current_snapshot_id == before  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------------
# maintenance under a run part way through: compaction and expiry of its range's end
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("labelled_before", [True, False], ids=["after-a-run", "first-run"])
def test_a_run_part_way_through_survives_compaction_and_expiry_of_its_range_end(
    settings: Settings, cli_environment: Path, capsys: pytest.CaptureFixture[str], labelled_before: bool
) -> None:
    from tests.support.crafted_history import compact, remove_orphan_files
    from tests.support.runs import Crash, dies_after, expire_all_but_current

    # given (labelled rows and) 30 new rows in three appends, and a run over them killed after its first chunk
    only = consumers_file(cli_environment / "consumers", {"name": "triage"})
    settings = settings.with_overrides(home=cli_environment, consumers_file=only)
    ledger = _ledger(settings)
    if labelled_before:
        _append(ledger, 10, seed=1)
        run_once(ledger)
    for seed in (2, 3, 4):
        _append(ledger, 10, seed=seed)
    with pytest.raises(Crash):
        run_once(ledger, transform=dies_after(7), chunk_rows=5)
    stale = ledger.pending()
    assert stale is not None and stale.rows_committed == 5
    first_chunk = {v["source_id"] for v in _verdicts(ledger) if v["run_id"] == stale.run_id}
    # and one of its labelled rows changed, then maintenance: a compaction, every snapshot but the current expired
    source = ledger.source()
    changed = source.scan(row_filter=In("ticket_id", sorted(first_chunk)[:1])).to_arrow()
    subject = changed.schema.get_field_index("subject")
    source.upsert(changed.set_column(subject, "subject", pa.array(["edited after the run began"])), ["ticket_id"])
    compact(ledger.source())
    expire_all_but_current(ledger.source())
    assert remove_orphan_files(ledger.source())  # the files the stale run read are gone too, as Spark leaves it
    assert ledger.source().metadata.snapshot_by_id(stale.to_snapshot_inclusive) is None
    # then the backlog says what the next run will do with it
    assert icebatch_main(["backlog", "--consumer", "triage", "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert shown["in_progress"]["run_id"] == stale.run_id and shown["in_progress"]["end_expired"] is True
    # when the launcher decides, then it launches a new run from the same watermark up to now (not the stale range)
    forced = {**json.loads((EVENTS / "manual-dry-run.json").read_text()), "force": True}
    [d] = invoke("launcher", forced, settings)["decisions"]
    assert d["decision"] == "dry_run" and d["run_id"] != stale.run_id, d["reason"]
    assert d["current_snapshot_id"] == ledger.source().metadata.current_snapshot_id
    # when the next job runs
    run = run_once(ledger, chunk_rows=5)
    # then the stale run was closed where it was (its verdicts stand, the reason recorded) and a new run labelled
    # the rest and the changed row once: no row sent twice, none lost, one verdict per live row
    assert run is not None and run.plan.run_id != stale.run_id and run.plan.resume is None
    [closed] = [r for r in ledger.runs() if r.run_id == stale.run_id]
    assert closed.closed_reason is not None and "expired" in closed.closed_reason
    assert ledger.pending() is None
    _every_live_row_once(ledger)
    mine = {v["source_id"] for v in _verdicts(ledger) if v["run_id"] == run.plan.run_id}
    untouched = first_chunk - set(sorted(first_chunk)[:1])
    assert mine.isdisjoint(untouched) and sorted(first_chunk)[0] in mine
    assert len(mine) == 30 - len(untouched) and run.stats.rows == len(mine)
    assert run_once(ledger) is None
    # and the ledger's listing says the stale run was closed, and why
    capsys.readouterr()
    assert icebatch_main(["ledger", "runs"]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if stale.run_id in x]
    assert "closed part way (rows=5)" in line and "was expired" in line


def test_a_run_part_way_through_whose_end_expired_on_a_v1_source_goes_on_without_loss(settings: Settings) -> None:
    from icebatch_job.example.tickets import ticket_schema

    from tests.support.runs import Crash, dies_after, expire_all_but_current

    # given a format-v1 source (no sequence numbers), 4 labelled rows, and a run over 12 new ones killed part way
    catalog = open_catalog(settings)
    catalog.create_namespace_if_not_exists("support")
    catalog.create_table(settings.catalog.source_table, schema=ticket_schema(), properties={"format-version": "1"})
    ledger = _labelled(settings, 4)
    _append(ledger, 12, seed=2)
    with pytest.raises(Crash):
        run_once(ledger, transform=dies_after(6), chunk_rows=5)
    stale = ledger.pending()
    assert stale is not None and stale.rows_committed == 5
    # when a row arrives and the source's history is expired but for the current snapshot
    _append(ledger, 1, seed=3)
    expire_all_but_current(ledger.source())
    # and the next job runs
    run = run_once(ledger, chunk_rows=5)
    # then the stale run was closed where it was, and the new run matched every live row by content: the 8 not
    # yet labelled went to the model once each, and no row has two verdicts
    assert run is not None and run.plan.run_id != stale.run_id
    [closed] = [r for r in ledger.runs() if r.run_id == stale.run_id]
    assert closed.closed_reason is not None and "expired" in closed.closed_reason
    assert run.stats.rows == 12 - 5 + 1 and ledger.pending() is None
    _every_live_row_once(ledger)
    assert run_once(ledger) is None


# --------------------------------------------------------------------------------------------------
# ids appended again: a writer that retried a commit
# --------------------------------------------------------------------------------------------------
def _tickets(first: int, n: int, seed: int) -> list[dict[str, Any]]:
    """Tickets whose ids grow (T-000001, T-000002, ...), as a sequence or a timestamped key gives them."""
    rows = generate_tickets(n, random.Random(seed))
    return [{**r, "ticket_id": f"T-{first + i:06d}"} for i, r in enumerate(rows)]


def test_a_writers_retry_appending_labelled_rows_again_sends_nothing_again(any_settings: Settings) -> None:
    # given a consumer that labelled its source's 10 rows (random ids: no order to tell new ones by)
    ledger = _labelled(any_settings, 10)
    labelled = _runs_of(ledger)
    # when a writer retries its commit (the same 10 rows appended again) and then appends 2 new rows, one of them
    # twice in the same range
    rows = ledger.source().scan().to_arrow()
    ledger.source().append(rows)
    new = generate_tickets(2, random.Random(2))
    append_tickets(ledger.source(), new)
    append_tickets(ledger.source(), new[:1])
    run = run_once(ledger)
    # then only the 2 new rows went to the model, once each, and the 10 keep their first verdict
    _only_new_rows_sent(ledger, run, new=2, first=labelled, unchanged=11)


def test_a_row_appended_again_with_new_content_gets_a_verdict_that_replaces_the_old(settings: Settings) -> None:
    import pyarrow.compute as pc

    # given a consumer that labelled its source's 6 rows
    ledger = _labelled(settings, 6)
    # when one of them is appended again with a new subject (an append-only writer's update)
    row = ledger.source().scan().to_arrow().sort_by("ticket_id").slice(0, 1)
    edited = row.set_column(
        row.schema.get_field_index("subject"), "subject", pc.binary_join_element_wise(row["subject"], " (reopened)", "")
    )
    ledger.source().append(edited)
    run = run_once(ledger)
    # then it alone went to the model, and its id has one verdict: the new content's
    assert run is not None and run.stats.rows == 1
    [verdict] = [v for v in _verdicts(ledger) if v["source_id"] == row["ticket_id"][0].as_py()]
    assert verdict["summary"].endswith("(reopened)")
    assert _summary(ledger)["icebatch.verdicts-removed-superseded"] == "1"


def test_a_run_over_rows_appended_again_killed_part_way_resumes_without_a_second_verdict(settings: Settings) -> None:
    from tests.support.runs import Crash, dies_after

    # given a labelled source, then 12 new rows, each appended twice (the second a retry of the first commit)
    ledger = _labelled(settings, 6)
    new = generate_tickets(12, random.Random(2))
    append_tickets(ledger.source(), new)
    append_tickets(ledger.source(), new)
    # when its run is killed after its first chunks, and the next attempt resumes it
    with pytest.raises(Crash):
        run_once(ledger, transform=dies_after(5), chunk_rows=4)
    resumed = run_once(ledger, chunk_rows=4)
    # then each of the 12 has one verdict, from this run, and nothing else was labelled
    assert resumed is not None and resumed.plan.resume is not None
    _every_live_row_once(ledger)
    mine = [v["source_id"] for v in _verdicts(ledger) if v["run_id"] == resumed.plan.run_id]
    assert sorted(mine) == sorted(r["ticket_id"] for r in new)


def test_growing_ids_are_told_new_by_their_bounds_alone(any_settings: Settings) -> None:
    from icebatch_job.plan.source import plan_range

    # given a consumer that labelled rows whose ids grow
    ledger = _ledger(any_settings)
    append_tickets(ledger.source(), _tickets(1, 8, seed=1))
    run_once(ledger)
    # then its watermark commit records the highest id
    assert json.loads(_summary(ledger)["icebatch.source-id-upper"]) == {"type": "string", "upper": "T-000008"}
    # when rows with higher ids arrive, then the range is known new from the manifests' bounds: nothing looked up
    append_tickets(ledger.source(), _tickets(9, 4, seed=2))
    plan = ledger.plan()
    assert plan is not None and plan.source_id_upper is not None
    task = ledger.consumer.task
    assert not plan_range(ledger.source(), plan, (task.id_column, *task.input_columns)).ids_may_repeat
    run = run_once(ledger)
    assert run is not None and run.stats.rows == 4
    assert json.loads(_summary(ledger)["icebatch.source-id-upper"])["upper"] == "T-000012"
    # when an earlier row is appended again beside a new one, then the range may repeat ids, and only the new row is
    # labelled
    append_tickets(ledger.source(), [*_tickets(1, 8, seed=1)[2:3], *_tickets(13, 1, seed=3)])  # T-000003 as it was
    plan = ledger.plan()
    assert plan is not None
    assert plan_range(ledger.source(), plan, (task.id_column, *task.input_columns)).ids_may_repeat
    run = run_once(ledger)
    assert run is not None and run.stats.rows == 1
    _every_live_row_once(ledger)
