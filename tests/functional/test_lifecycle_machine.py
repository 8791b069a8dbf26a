"""Exactly once through random lifecycles: table operations interleaved with runs, kills and resumes.

A Hypothesis ``RuleBasedStateMachine`` appends (and appends rows again, as a writer that retried a commit
does), deletes (copy-on-write as pyiceberg writes them, and merge-on-read position deletes as Spark writes them),
overwrites with the same rows, upserts changed rows,
truncates, compacts (a ``replace`` as Spark's ``rewrite_data_files`` leaves it) and expires the source's history
(all of it but the current snapshot, or chosen snapshots anywhere in it, as pyiceberg or Iceberg Java leaves them),
deleting the files no snapshot lists any more (under a run part way through too: its range's end is then gone),
and runs the consumer the way the job does (``tests.support.runs``: its planning, reading, chunked commits,
content identity; a rule-based labeller stands in for the model, which is not what this is about), killed
after a chosen number of rows or to the end. After each drained run it checks, with an independent count
(plain scans and its own model of what was labelled, not the ledger's code):

- every live source row has exactly one verdict of the task version, and no deleted row has one;
- the rows the runs since the last check labelled are exactly the live rows whose content changed or is new
  (nothing unchanged is sent again);
- the watermark never goes back.

``make test`` runs 200 sequences in a fixed order; ``make test-lifecycle-soak`` runs more, at random
(``LIFECYCLE_EXAMPLES``, default 2,000).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test
from icebatch.core.catalog import open_catalog
from icebatch.core.ledger import open_ledger
from icebatch.core.settings import Settings
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets
from pyiceberg.expressions import AlwaysTrue, In

from tests.support.consumers import triage
from tests.support.crafted_history import (
    add_position_deletes,
    compact,
    expire_as_iceberg_java,
    positions_of,
    remove_orphan_files,
    upsert_with_equality_deletes,
)
from tests.support.live_rows import has_equality_deletes, live_rows
from tests.support.runs import Crash, dies_after, expire_all_but_current, run_once

pytestmark = pytest.mark.functional
SOAK = os.environ.get("LIFECYCLE_SOAK") == "1"
EXAMPLES = int(os.environ.get("LIFECYCLE_EXAMPLES", "2000")) if SOAK else 200


class Lifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="icebatch-lifecycle-"))
        s = Settings(home=self.tmp / "home")
        ensure_source_table(open_catalog(s), s.catalog.source_table)
        self.ledger = open_ledger(s, triage(s))
        self.task = self.ledger.consumer.task
        self.labelled: dict[str, tuple[Any, ...]] = {}  # the model: id -> the content its verdict is of
        self.runs: set[str] = set()  # runs completed since the last check
        self.sequence = 0  # the watermark's sequence number at the last check
        self.seed = 0

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- what the source's writers and maintenance do ----------------------------------------------
    def _rows(self) -> pa.Table:  # independent of pyiceberg's scan, which reads no equality delete
        return live_rows(self.ledger.source()).sort_by("ticket_id")

    def _live(self) -> dict[str, tuple[Any, ...]]:
        columns = (self.task.id_column, *self.task.input_columns)
        rows = self._rows().select(list(columns)).to_pylist()
        return {str(r[self.task.id_column]): tuple(r[c] for c in columns) for r in rows}

    def _distinct(self) -> pa.Table:  # a row per id (a retried append leaves copies of rows)
        rows, seen, first = self._rows(), set(), []
        for i, ticket in enumerate(rows["ticket_id"].to_pylist()):
            if ticket not in seen:
                seen.add(ticket)
                first.append(i)
        return rows.take(pa.array(first, pa.int64()))

    def _has_rows(self) -> bool:
        return self._rows().num_rows > 0

    def _pyiceberg_writes(self) -> bool:  # pyiceberg deletes, overwrites and upserts by scanning: none past Flink's
        return self._has_rows() and not has_equality_deletes(self.ledger.source())

    @rule(n=st.integers(1, 8))
    def append(self, n: int) -> None:
        self.seed += 1
        append_tickets(self.ledger.source(), generate_tickets(n, random.Random(self.seed)))

    @precondition(_has_rows)
    @rule(data=st.data())
    def retry_an_append(self, data: st.DataObject) -> None:
        """A writer that retried a commit that had landed: rows already in the table appended again, as they are."""
        rows = self._distinct()
        picked = data.draw(st.lists(st.integers(0, rows.num_rows - 1), min_size=1, max_size=3, unique=True))
        self.ledger.source().append(rows.take(pa.array(picked)))

    @precondition(_pyiceberg_writes)
    @rule(data=st.data())
    def delete_some(self, data: st.DataObject) -> None:
        ids = sorted(self._live())
        gone = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))
        self.ledger.source().delete(In("ticket_id", gone))

    @precondition(_pyiceberg_writes)
    @rule(data=st.data())
    def delete_merge_on_read(self, data: st.DataObject) -> None:
        gone = data.draw(st.lists(st.sampled_from(sorted(self._live())), min_size=1, max_size=2, unique=True))
        add_position_deletes(self.ledger.source(), positions_of(self.ledger.source(), gone))

    @precondition(_pyiceberg_writes)
    @rule()
    def overwrite_with_the_same_rows(self) -> None:
        self.ledger.source().overwrite(self._rows())

    def _pyiceberg_upserts(self) -> bool:  # pyiceberg's upsert refuses a table with two rows of one id
        return self._pyiceberg_writes() and self._distinct().num_rows == self._rows().num_rows

    @precondition(_pyiceberg_upserts)
    @rule(data=st.data())
    def upsert_changed_rows(self, data: st.DataObject) -> None:
        rows = self._distinct()
        picked = data.draw(st.lists(st.integers(0, rows.num_rows - 1), min_size=1, max_size=2, unique=True))
        changed = rows.take(pa.array(picked))
        self.seed += 1
        subject = changed.schema.get_field_index("subject")
        edited = pc.binary_join_element_wise(pc.fill_null(changed["subject"], ""), f" (edit {self.seed})", "")
        self.ledger.source().upsert(changed.set_column(subject, "subject", edited), ["ticket_id"])

    @precondition(_pyiceberg_writes)
    @rule()
    def truncate(self) -> None:
        self.ledger.source().delete(AlwaysTrue())

    @precondition(_has_rows)
    @rule(data=st.data(), new=st.integers(0, 2), erase=st.booleans())
    def upsert_like_flink(self, data: st.DataObject, new: int, erase: bool) -> None:
        """Flink's upsert mode: changed, unchanged and new rows in a data file beside an equality delete of their
        keys; or a delete of keys alone."""
        rows = self._distinct()
        picked = data.draw(st.lists(st.integers(0, rows.num_rows - 1), min_size=1, max_size=3, unique=True))
        chosen = rows.take(pa.array(picked))
        if erase:
            upsert_with_equality_deletes(self.ledger.source(), chosen.select(["ticket_id"]), "ticket_id")
            return
        self.seed += 1
        subject = chosen.schema.get_field_index("subject")
        edited = pc.binary_join_element_wise(pc.fill_null(chosen["subject"], ""), f" (flink {self.seed})", "")
        edited = pc.if_else(pa.array([i % 2 == 0 for i in range(chosen.num_rows)]), edited, chosen["subject"])
        added = pa.Table.from_pylist(generate_tickets(new, random.Random(self.seed)), schema=rows.schema)
        upserted = pa.concat_tables([chosen.set_column(subject, "subject", edited), added])
        upsert_with_equality_deletes(self.ledger.source(), upserted, "ticket_id")

    def _expirable(self) -> bool:  # a run part way through may lose its range's end: it is closed, not stuck
        return len(self.ledger.source().metadata.snapshots) > 1

    @precondition(_expirable)
    @rule()
    def expire_history(self) -> None:
        expire_all_but_current(self.ledger.source())
        remove_orphan_files(self.ledger.source())  # as Spark's expire_snapshots leaves the bucket

    @precondition(_expirable)
    @rule(data=st.data(), java=st.booleans())
    def expire_out_of_order(self, data: st.DataObject, java: bool) -> None:
        """Spark's ``expire_snapshots(snapshot_ids => ...)``: some snapshots but the current one, wherever they are in
        the history (the watermark's, one after it, one before), as pyiceberg or Iceberg Java leaves the metadata."""
        source = self.ledger.source()
        current = source.metadata.current_snapshot_id
        others = sorted(s.snapshot_id for s in source.metadata.snapshots if s.snapshot_id != current)
        watermark = self.ledger.watermark().source_snapshot_id
        after = [s for s in others if source.metadata.snapshot_by_id(s).parent_snapshot_id == watermark]
        anywhere = st.lists(st.sampled_from(others), min_size=1, unique=True)
        chosen = data.draw(st.one_of(st.just(after), anywhere) if after else anywhere)  # the one after it: a cut
        if java:
            expire_as_iceberg_java(source, chosen)
        else:
            source.maintenance.expire_snapshots().by_ids(chosen).commit()
        remove_orphan_files(self.ledger.source())

    def _compactable(self) -> bool:  # the crafted compaction rewrites data files only
        source = self.ledger.source()
        if source.current_snapshot() is None or has_equality_deletes(source):
            return False
        files = list(source.scan().plan_files())
        return bool(files) and not any(t.delete_files for t in files)

    @precondition(_compactable)
    @rule()
    def compact(self) -> None:
        """Spark's ``rewrite_data_files``: a ``replace`` snapshot, every live row in one new file."""
        compact(self.ledger.source())

    def _part_way(self) -> bool:
        return self.ledger.pending() is not None

    @precondition(_part_way)
    @rule(n=st.integers(1, 3), compacting=st.booleans())
    def maintenance_under_a_run(self, n: int, compacting: bool) -> None:
        """Rows arrive while a run is part way through, then the nightly maintenance compacts (where it can) and
        expires every snapshot but the current one: the run's range's end is gone."""
        self.append(n)
        if compacting and self._compactable():
            compact(self.ledger.source())
        expire_all_but_current(self.ledger.source())
        remove_orphan_files(self.ledger.source())

    # --- runs -----------------------------------------------------------------------------------
    @rule(rows=st.integers(0, 12))
    def killed_run(self, rows: int) -> None:
        try:
            done = run_once(self.ledger, transform=dies_after(rows), chunk_rows=3)
        except Crash:
            if (p := self.ledger.pending()) is not None:  # its verdicts stand, whether it is resumed or closed
                self.runs.add(p.run_id)
            return
        if done is not None:
            self.runs.add(done.plan.run_id)

    @rule()
    def run_to_the_end(self) -> None:
        while (done := run_once(self.ledger, chunk_rows=4)) is not None:
            self.runs.add(done.plan.run_id)
        self._check()

    def _check(self) -> None:
        live = self._live()
        table = self.ledger.results()
        verdicts = [] if table is None else table.scan(selected_fields=("source_id", "run_id")).to_arrow().to_pylist()
        per_id = Counter(v["source_id"] for v in verdicts)
        # every live row has one verdict, no deleted row has one
        assert {i: n for i, n in per_id.items() if n > 1} == {}
        assert set(per_id) == set(live), (sorted(set(live) - set(per_id)), sorted(set(per_id) - set(live)))
        # the runs since the last check labelled exactly the new and the changed rows
        new = {i for i, content in live.items() if self.labelled.get(i) != content}
        assert {v["source_id"] for v in verdicts if v["run_id"] in self.runs} == new
        # the watermark never goes back
        sequence = self.ledger.watermark().source_sequence_number or 0
        assert sequence >= self.sequence
        self.labelled, self.runs, self.sequence = live, set(), sequence


def test_random_lifecycles_keep_one_verdict_per_live_row() -> None:
    run_state_machine_as_test(
        Lifecycle,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=10,
            deadline=None,
            database=None,
            derandomize=not SOAK,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
