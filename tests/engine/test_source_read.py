"""The job's read of a range through Ray Data, on a source with a streaming writer's long history.

Ray puts each read task in its object store and, past 1 MiB, warns naming the task's function: a task
that carried the table's metadata grew with every snapshot, and a function without a name made the
warning itself fail the read (about 3,000 snapshots). The history here is crafted (seconds, not hours).
"""

from __future__ import annotations

import random

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.settings import Settings
from icebatch_job.commit.done import DoneRows
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets
from icebatch_job.plan.source import plan_range, read_dataset

from tests.engine.conftest import ledger
from tests.support.crafted_history import add_empty_appends

pytestmark = [pytest.mark.engine]


def test_the_job_reads_a_range_of_a_source_with_5000_snapshots(engine_settings: Settings, job_ray: dict) -> None:
    # given a source table whose history a streaming writer made long: rows, 5,000 checkpoints, rows
    source = ensure_source_table(open_catalog(engine_settings), engine_settings.catalog.source_table)
    append_tickets(source, generate_tickets(6, random.Random(1)))
    add_empty_appends(source, 5000)
    append_tickets(source.refresh(), generate_tickets(9, random.Random(2)))
    consumer_ledger = ledger(engine_settings)
    plan = consumer_ledger.plan()
    assert plan is not None and plan.expected_rows == 15
    # when the job reads the range as a Ray dataset, in the job's Ray
    planned = plan_range(consumer_ledger.source(), plan, ("ticket_id",))
    rows = read_dataset(planned, DoneRows()).take_all()
    # then every row of the range arrives once
    assert sorted(r["ticket_id"] for r in rows) == sorted(
        consumer_ledger.source().scan(selected_fields=("ticket_id",)).to_arrow()["ticket_id"].to_pylist()
    )
