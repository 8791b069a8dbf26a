"""Which verdicts' ids are gone from the source (plan/identity.py ``gone_ids``), as a set of texts would say."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from icebatch_job.plan.identity import gone_ids

pytestmark = pytest.mark.unit


def _expected(live: list[object], verdicts: list[str | None]) -> list[str]:
    texts = {str(v) for v in live if v is not None}
    return sorted({v for v in verdicts if v is not None and v not in texts})


def test_integer_ids_are_compared_as_integers_but_only_their_own_text_matches() -> None:
    # given a source of long ids and verdicts of live ids, of deleted ones (twice), and texts no integer has
    live = pa.chunked_array([pa.array([1, 2, 7, -3, 2**62], pa.int64()), pa.array([12], pa.int64())])
    verdicts = pa.chunked_array([["1", "2", "5", "5", "007", "+7", "-3", "12", None], [str(2**62), "-0", "9"]])
    # when the gone ids are found, then the deleted ids and the texts no live integer is written as are gone
    assert gone_ids(live, verdicts) == ["+7", "-0", "007", "5", "9"]
    # and ids that grow (1..100: looked up in a table, not joined) alike
    growing = pa.chunked_array([pa.array(range(1, 101), pa.int64())])
    assert gone_ids(growing, pa.chunked_array([["0", "1", "50", "100", "101", "0050"]])) == ["0", "0050", "101"]


def test_a_verdict_id_that_is_no_integer_falls_back_to_text() -> None:
    # given an int column and verdicts holding a text that cannot be cast (written before the column's type changed)
    live = pa.chunked_array([pa.array([1, 2], pa.int32())])
    verdicts = pa.chunked_array([["1", "ticket-2", " 2"]])
    # then they are compared as texts
    assert gone_ids(live, verdicts) == [" 2", "ticket-2"]


def test_string_and_other_ids_are_compared_by_their_text() -> None:
    # given string ids (large strings, as pyiceberg may read them), and dates
    live = pa.chunked_array([pa.array(["a", "b", "é"], pa.large_string())])
    assert gone_ids(live, pa.chunked_array([["a", "é", "c", "c", "B"]])) == ["B", "c"]
    dates = pa.chunked_array([pa.array([dt.date(2026, 1, 2)])])
    assert gone_ids(dates, pa.chunked_array([["2026-01-02", "2026-01-03"]])) == ["2026-01-03"]


def test_nothing_to_look_for_is_nothing_gone() -> None:
    empty_live = pa.chunked_array([], pa.int64())
    assert gone_ids(empty_live, pa.chunked_array([], pa.string())) == []
    assert gone_ids(empty_live, pa.chunked_array([["3", "3"]])) == ["3"]
    assert gone_ids(pa.chunked_array([[1]]), pa.chunked_array([[None]], pa.string())) == []


_ANY_LONG = st.integers(-(2**63), 2**63 - 1)
_CLOSE_IDS = st.integers(-40, 40)  # ids that span about as many values as there are (a lookup table, not a join)


@settings(max_examples=200, deadline=None)
@given(
    live=st.one_of(st.lists(st.one_of(st.none(), _ANY_LONG), max_size=30), st.lists(_CLOSE_IDS, max_size=30)),
    verdicts=st.lists(
        st.one_of(st.none(), _ANY_LONG.map(str), _CLOSE_IDS.map(str), st.text(alphabet="0123456789-+ x", max_size=4)),
        max_size=30,
    ),
)
def test_integer_sources_agree_with_sets_of_texts(live: list[int | None], verdicts: list[str | None]) -> None:
    assert gone_ids(pa.chunked_array([pa.array(live, pa.int64())]), pa.chunked_array([verdicts], pa.string())) == (
        _expected(live, verdicts)
    )


@settings(max_examples=100, deadline=None)
@given(live=st.lists(st.one_of(st.none(), st.text(max_size=3)), max_size=30), verdicts=st.lists(st.text(max_size=3)))
def test_string_sources_agree_with_sets_of_texts(live: list[str | None], verdicts: list[str]) -> None:
    assert gone_ids(pa.chunked_array([pa.array(live, pa.string())]), pa.chunked_array([verdicts], pa.string())) == (
        _expected(live, verdicts)
    )
