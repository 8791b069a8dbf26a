"""`icebatch costs --html FILE`: a page with charts of spend, rows labelled and backlog per consumer, made from a
real history (SQL catalog, the launcher's own decisions) and looked at in a real browser (headless Chromium)."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.ledger import open_ledger
from icebatch.core.settings import Settings
from icebatch.tools.cli import main as icebatch_main
from icebatch.tools.costs_page import PALETTE
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets

from tests.support.browser import screenshot
from tests.support.consumers import consumer, consumers_file
from tests.support.runs import run_once

pytestmark = pytest.mark.functional


@pytest.fixture
def home(settings: Settings, cli_environment: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    two = consumers_file(
        cli_environment / "consumers",
        {"name": "triage", "budget": {"max_usd_per_day": 0.01}},
        {"name": "privacy", "task": "privacy", "backlog_threshold": 5},
    )
    monkeypatch.setenv("ICEBATCH_CONSUMERS_FILE", str(two))
    return settings.with_overrides(home=cli_environment, consumers_file=two)


def _bands(ys: list[int]) -> int:
    """How many separate vertical bands these rows of pixels make (a gap of 40 px or more splits them)."""
    ys = sorted(set(ys))
    return 0 if not ys else 1 + sum(1 for a, b in itertools.pairwise(ys) if b - a >= 40)


def test_the_costs_page_charts_spend_rows_and_backlog_per_consumer_in_a_browser(
    home: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    # given two consumers of one table, each with a completed run, and two launcher decisions around an append
    ensure_source_table(open_catalog(home), home.catalog.source_table)
    ledgers = [open_ledger(home, consumer(home, name)) for name in ("triage", "privacy")]
    append_tickets(ledgers[0].source(), generate_tickets(8, random.Random(1)))
    for ledger in ledgers:
        assert run_once(ledger) is not None
    assert icebatch_main(["launch", "--dry-run", "--json"]) == 0
    append_tickets(ledgers[0].source(), generate_tickets(12, random.Random(2)))
    assert icebatch_main(["launch", "--dry-run", "--json"]) == 0
    decisions = [json.loads(line) for line in (home.home / "decisions.jsonl").read_text().splitlines()]
    assert sorted((d["consumer"], d["backlog_rows"]) for d in decisions) == [
        ("privacy", 0),
        ("privacy", 12),
        ("triage", 0),
        ("triage", 12),
    ]
    capsys.readouterr()
    # when the page is asked for
    page = tmp_path / "costs.html"
    assert icebatch_main(["costs", "--since", "7d", "--html", str(page)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"charts: {page} (open it in a browser)"
    # then it is one file that fetches nothing, and names what it charts
    html = page.read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html
    for title in ("Spend per day (USD)", "Rows labelled per day", "Backlog (rows not yet labelled)"):
        assert title in html
    # and in a browser each consumer's colour shows in each of the three charts (bars, bars, line), and the
    # triage budget's dashed line too
    shot = Image.open(screenshot(page, tmp_path / "costs.png")).convert("RGB")
    pixels = shot.load()
    for name, hexa in (("triage", PALETTE[0]), ("privacy", PALETTE[1])):
        rgb = tuple(int(hexa[i : i + 2], 16) for i in (1, 3, 5))
        ys = [y for y in range(shot.height) for x in range(shot.width) if pixels[x, y] == rgb]
        assert _bands(ys) >= 3 + (name == "triage"), f"{name}'s colour shows in {_bands(ys)} bands of the page"


def test_a_page_without_history_says_so_and_a_bad_path_is_a_clear_error(
    home: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a home with no run and no decision
    page = tmp_path / "empty.html"
    # when the page is asked for, then it is written and says there is nothing to chart yet
    assert icebatch_main(["costs", "--html", str(page)]) == 0
    html = page.read_text()
    assert "Nothing spent in this window" in html and "No launcher decisions in this window" in html
    # when it is asked for in a folder that does not exist, then the error says what to do, and nothing is written
    assert icebatch_main(["costs", "--html", str(tmp_path / "nowhere" / "x.html")]) == 2
    assert "give --html a file in a folder that exists" in capsys.readouterr().err


def test_a_decision_log_line_that_does_not_parse_is_skipped_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from datetime import UTC, datetime, timedelta

    from icebatch.tools.decision_log import backlog_points, record_decisions

    # given a decision log with a good decision, a torn line and a decision without a time zone
    at = datetime.now(UTC)
    good = {
        "consumer": "triage",
        "decided_at": at.isoformat(),
        "backlog_rows": 7,
        "threshold": 5,
        "decision": "launched",
    }
    record_decisions(tmp_path, {"decisions": [good, {**good, "decided_at": at.replace(tzinfo=None).isoformat()}]})
    with (tmp_path / "decisions.jsonl").open("a") as f:
        f.write('{"consumer": "tri\n')
    # when the backlog is read, then the good one is there and each other line is named in a warning
    [point] = backlog_points(tmp_path, ["triage"], at - timedelta(hours=1))
    assert (point.rows, point.threshold, point.decision) == (7, 5, "launched")
    assert [r.getMessage().split(":")[0][-6:] for r in caplog.records] == ["line 2", "line 3"]
