"""Results keep the source's id: a table of its own, ``news.articles(article_id long, ...)``, labelled as the job
does (``tests.support.runs``: its planning, chunks and commits, with a rule-based labeller), then looked at with
``icebatch results`` as a user would. A results table made before ids kept their type (text) still works.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from icebatch.core.catalog import open_catalog
from icebatch.core.consumers import consumer_named, load_consumers
from icebatch.core.ledger import ResultsLedger, open_ledger
from icebatch.core.ledger.results_table import SOURCE_ID_COLUMN
from icebatch.core.settings import Settings
from pyiceberg.expressions import In
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from tests.support.runs import run_once

pytestmark = pytest.mark.functional

TASK = {
    "name": "topics",
    "version": 1,
    "id_column": "article_id",
    "input_columns": ["headline", "body"],
    "system_prompt": "Say what the article is about.",
    "user_template": "{headline}\n{body}",
    "output_schema": {
        "type": "object",
        "properties": {"topic": {"type": "string", "enum": ["politics", "sport", "other"]}},
        "required": ["topic"],
        "additionalProperties": False,
    },
    "sampling": {"temperature": 0.0, "max_tokens": 16},
}
SOURCE = Schema(
    NestedField(1, "article_id", LongType(), required=True),
    NestedField(2, "headline", StringType(), required=False),
    NestedField(3, "body", StringType(), required=False),
    NestedField(4, "lang", StringType(), required=False),
)


def _project(folder: Path, source: Schema) -> Path:
    """A project whose one consumer labels ``news.articles`` (of this schema) by ``article_id``."""
    (folder / "topics.json").write_text(json.dumps(TASK))
    consumers = {"consumers": [{"name": "topics", "task": "topics.json", "source_table": "news.articles"}]}
    (folder / "consumers.yaml").write_text(yaml.safe_dump(consumers))
    catalog = open_catalog(_settings(folder))
    catalog.create_namespace_if_not_exists("news")
    catalog.create_table("news.articles", source)
    return folder


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The project, ``article_id`` a long that is never null."""
    return _project(tmp_path, SOURCE)


def _settings(home: Path) -> Settings:
    return Settings(home=home).with_overrides(consumers_file=home / "consumers.yaml")


def _ledger(home: Path) -> ResultsLedger:
    settings = _settings(home)
    return open_ledger(settings, consumer_named(load_consumers(settings), "topics"))


def _append(home: Path, ids: range | list[int], headline: str = "news") -> None:
    rows = [{"article_id": i, "headline": f"{headline} {i}", "body": "text", "lang": "en"} for i in ids]
    table = open_catalog(_settings(home)).load_table("news.articles")
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))


def _results(home: Path, *args: str) -> list[dict[str, str]]:
    """``icebatch results --format csv``, as a user runs it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ICEBATCH_")}
    env = {**base, "ICEBATCH_HOME": str(home), "ICEBATCH_CONSUMERS_FILE": str(home / "consumers.yaml")}
    out = subprocess.run(
        [sys.executable, "-m", "icebatch.tools.cli", "results", "--limit", "100", "--format", "csv", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    return list(csv.DictReader(io.StringIO(out.stdout)))


def test_a_long_id_is_kept_as_a_long_so_results_sort_and_filter_numerically(home: Path) -> None:
    # given articles 1..12 of a table whose id is a long, labelled
    _append(home, range(1, 13))
    assert run_once(_ledger(home)) is not None
    # then the results table holds the id as a long, and says which source column it is
    results = _ledger(home).results()
    assert results is not None
    assert isinstance(results.schema().find_field("source_id").field_type, LongType)
    assert results.properties[SOURCE_ID_COLUMN] == "article_id"
    ids = results.scan(selected_fields=("source_id",)).to_arrow().column(0)
    assert ids.type == pa.int64() and sorted(ids.to_pylist()) == list(range(1, 13))
    # when a user lists the verdicts, then they come in the ids' order (1, 2, ... 10, not 1, 10, 11, 2)
    assert [r["source_id"] for r in _results(home)] == [str(i) for i in range(1, 13)]
    # and a filter by the source's name for the id, or by source_id, compares numbers
    assert [r["source_id"] for r in _results(home, "--where", "article_id < 5")] == ["1", "2", "3", "4"]
    assert [r["source_id"] for r in _results(home, "--where", "source_id in (7, 11)")] == ["7", "11"]
    both = _results(home, "--where", "article_id >= 10 and headline = 'news 11'")  # with a prompt column
    assert [r["source_id"] for r in both] == ["11"] and both[0]["headline"] == "news 11"


def test_deleted_and_changed_rows_of_a_long_id_are_matched_by_their_id(home: Path) -> None:
    # given articles 1..12 labelled
    _append(home, range(1, 13))
    assert run_once(_ledger(home)) is not None
    # when three are deleted, one is rewritten with a new headline, and two are added
    table = open_catalog(_settings(home)).load_table("news.articles")
    table.delete(In("article_id", [2, 3, 4]))
    table = open_catalog(_settings(home)).load_table("news.articles")
    table.overwrite(
        pa.Table.from_pylist(
            [{"article_id": 5, "headline": "changed 5", "body": "text", "lang": "en"}], schema=SOURCE.as_arrow()
        ),
        overwrite_filter=In("article_id", [5]),
    )
    _append(home, [13, 14])
    done = run_once(_ledger(home))
    # then the next run labels the changed and the new rows only, and removes the verdicts of the deleted ones
    assert done is not None and done.stats.rows == 3
    verdicts = _ledger(home).results()
    assert verdicts is not None
    rows = verdicts.scan(selected_fields=("source_id", "run_id")).to_arrow().to_pylist()
    assert sorted(r["source_id"] for r in rows) == [1, *range(5, 15)]
    assert [r["source_id"] for r in rows if r["run_id"] == done.plan.run_id] in ([5, 13, 14], [13, 14, 5])


def test_a_results_table_made_with_text_ids_keeps_them_and_still_works(home: Path) -> None:
    # given a results table made before ids kept their type (text ids)
    _append(home, range(1, 4))
    assert run_once(_ledger(home), typed_ids=False) is not None
    # when more rows land and are labelled as the job labels them now, and one is deleted
    _append(home, range(4, 7))
    assert run_once(_ledger(home)) is not None
    open_catalog(_settings(home)).load_table("news.articles").delete(In("article_id", [2]))
    assert run_once(_ledger(home)) is not None
    # then the table keeps text ids, every live row once, the deleted one's verdict gone
    results = _ledger(home).results()
    assert results is not None
    assert isinstance(results.schema().find_field("source_id").field_type, StringType)
    ids = results.scan(selected_fields=("source_id",)).to_arrow().column(0).to_pylist()
    assert sorted(ids) == ["1", "3", "4", "5", "6"]
    # and `results` reads it, a filter by the source's name for the id included
    assert [r["source_id"] for r in _results(home, "--where", "article_id = 5")] == ["5"]


def test_an_id_column_that_may_be_null_keeps_its_rows_and_text_ids(tmp_path: Path) -> None:
    # given a table whose long id may be null, with a row that has none
    _project(tmp_path, Schema(*(f.model_copy(update={"required": False}) for f in SOURCE.fields)))
    table = open_catalog(_settings(tmp_path)).load_table("news.articles")
    rows = [{"article_id": None, "headline": "no id", "body": "text", "lang": "en"}]
    rows += [{"article_id": 2, "headline": "news 2", "body": "text", "lang": "en"}]
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))
    # when it is labelled
    done = run_once(_ledger(tmp_path))
    # then every row has its verdict (none lost to a type), with the ids as text as before ids kept their type
    assert done is not None and done.stats.rows == 2
    results = _ledger(tmp_path).results()
    assert results is not None
    assert isinstance(results.schema().find_field("source_id").field_type, StringType)
    assert sorted(results.scan(selected_fields=("source_id",)).to_arrow().column(0).to_pylist()) == ["2", "None"]
