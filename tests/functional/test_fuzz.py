"""Fuzzing both handlers and `icebatch invoke` with generated events (Hypothesis, 2,000 examples each).

Whatever arrives — any JSON value, the real events with a field replaced by anything, or raw bytes — the
answer is a decision or a one-line error: never a traceback, a launch, a file outside ICEBATCH_HOME, or a
message that grows with the input.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from icebatch.core.catalog import open_catalog
from icebatch.core.settings import Settings
from icebatch.core.untrusted import CONSUMER_NAME, RUN_ID
from icebatch.tools.cli import main as icebatch_main
from icebatch.tools.invoke import invoke
from icebatch_job.example.tickets import ensure_source_table

pytestmark = pytest.mark.functional
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "eventbridge" / "examples" / "valid").glob("*.json")) + sorted(
    (ROOT / "sam" / "events").glob("*.json")
)
MAX_MESSAGE = 600
FUZZ = settings(
    max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(["launch", "schedule", "true", "false", "1", "../../x", "triage", "\ud800", "x" * 5000])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_events(draw: st.DrawFn) -> Any:
    """A real event (the examples the product ships) with one part replaced, removed or added to."""
    event = json.loads(draw(st.sampled_from(EXAMPLES)).read_text())
    path = draw(st.sampled_from(_paths(event)))
    if not path:
        return draw(json_values)
    parent = event
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["replace", "remove", "extra"]))
    if action == "remove" and isinstance(parent, dict):
        parent.pop(path[-1], None)
    elif action == "extra" and isinstance(parent, dict):
        parent[draw(st.text(max_size=12))] = draw(json_values)
    else:
        parent[path[-1]] = draw(json_values)
    return event


CONFUSABLE = ["true", "false", "yes", "no", "1", "0", 1, 0, 1.0, None, [], {}, "triage\n", "../x", "TRIAGE"]


@st.composite
def confused_events(draw: st.DrawFn) -> Any:
    """A real event with one field given a value of the wrong type that lenient parsing would coerce."""
    event = json.loads(draw(st.sampled_from(EXAMPLES)).read_text())
    target = event.get("detail") if isinstance(event.get("detail"), dict) and draw(st.booleans()) else event
    keys = [*sorted(target), "force", "dry_run", "consumer"]
    target[draw(st.sampled_from(keys))] = draw(st.sampled_from(CONFUSABLE))
    return event


events = json_values | mutated_events() | confused_events()


def _outside(root: Path, home: Path) -> list[Path]:
    return [p for p in root.rglob("*") if home not in (p, *p.parents)]


@pytest.fixture
def fuzz_home(tmp_path: Path) -> Settings:
    s = Settings(home=tmp_path / "home")
    ensure_source_table(open_catalog(s), s.catalog.source_table)  # an empty table: nothing to launch
    return s


def _bounded(result: dict[str, Any]) -> None:
    assert isinstance(result, dict)
    if result.get("status") in {"rejected", "error"}:
        reason = result["reason"]
        assert isinstance(reason, str) and 0 < len(reason) < MAX_MESSAGE, reason[:200]
        reason.encode("utf-8")  # printable: a log handler can always write it


def test_the_launcher_answers_any_event_with_a_decision_or_a_bounded_rejection(
    fuzz_home: Settings, tmp_path: Path
) -> None:
    @FUZZ
    @given(event=events)
    def check(event: Any) -> None:
        result = invoke("launcher", copy.deepcopy(event), fuzz_home, logs_to_stderr=True)
        assert result["status"] in {"ok", "rejected", "error"}, result
        _bounded(result)
        assert all(d["decision"] != "launch" for d in result["decisions"]), result
        if result["status"] == "ok" and isinstance(event, dict) and "action" in event:
            # accepted: then its flags were real booleans and its consumer a name (nothing was coerced)
            assert all(isinstance(event.get(f, False), bool) for f in ("force", "dry_run")), event
            assert event.get("consumer") is None or re.fullmatch(CONSUMER_NAME, event["consumer"]), event

    check()
    assert not (fuzz_home.home / "jobs").exists()
    assert _outside(tmp_path, fuzz_home.home) == []


def test_the_reporter_answers_any_event_with_a_report_or_a_bounded_rejection(
    fuzz_home: Settings, tmp_path: Path
) -> None:
    @FUZZ
    @given(event=events)
    def check(event: Any) -> None:
        result = invoke("reporter", copy.deepcopy(event), fuzz_home, logs_to_stderr=True)
        assert result["status"] in {"reported", "rejected", "error"}, result
        _bounded(result)
        if result["status"] == "reported":  # accepted: then it was consistent and its names are safe
            detail = event["detail"]
            assert detail.get("run_id") is None or re.fullmatch(RUN_ID, detail["run_id"]), detail
            assert type(detail.get("rows", 0)) is int and type(detail.get("rows_ok", 0)) is int, detail
            assert detail.get("rows_ok", 0) + detail.get("rows_error", 0) <= detail.get("rows", 10**9), detail

    check()
    assert _outside(tmp_path, fuzz_home.home) == []
    reports = fuzz_home.home / "reports"
    assert not reports.exists() or all(p.parent == reports for p in reports.rglob("*"))


def test_icebatch_invoke_answers_any_file_with_an_exit_status_and_at_most_one_line(
    fuzz_home: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ICEBATCH_HOME", str(fuzz_home.home))
    event_file = tmp_path / "event.bin"
    as_bytes = events.map(lambda e: json.dumps(e, ensure_ascii=False).encode("utf-8", "surrogatepass"))

    @FUZZ
    @given(content=st.binary(max_size=300) | as_bytes, function=st.sampled_from(["launcher", "reporter"]))
    def check(content: bytes, function: str) -> None:
        event_file.write_bytes(content)
        status = icebatch_main(
            ["invoke", function, "--event", str(event_file), "--dry-run"][: 4 + (function == "launcher")]
        )
        err = capsys.readouterr().err
        assert status in {0, 2}, err[-500:]
        errors = [line for line in err.splitlines() if line.startswith("icebatch: ")]
        assert len(errors) <= 1 and all(len(line) < MAX_MESSAGE for line in errors), err[-500:]
        assert "Traceback" not in err

    check()
    assert not (fuzz_home.home / "jobs").exists()
