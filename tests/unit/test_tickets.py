from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime

import pytest
from icebatch_job.example.tickets import SCENARIOS, generate_tickets

pytestmark = pytest.mark.unit


def test_scenarios_cover_the_categories() -> None:
    assert len(SCENARIOS) >= 30
    assert {s.category for s in SCENARIOS} == {
        "billing",
        "account_access",
        "performance",
        "bug",
        "data_loss",
        "feature_request",
        "praise",
        "cancellation",
    }


def test_seeded_generation_is_reproducible() -> None:
    now = datetime(2026, 11, 29, tzinfo=UTC)
    a = generate_tickets(50, random.Random(7), now=now)
    b = generate_tickets(50, random.Random(7), now=now)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "ingested_ms"} for r in rows]  # noqa: E731
    assert strip(a) == strip(b)
    assert len({r["ticket_id"] for r in a}) == 50


def test_hard_cases_appear_at_a_few_percent() -> None:
    rows = generate_tickets(4000, random.Random(1))
    bodies = [r["body"] for r in rows]
    empty = sum(1 for b in bodies if not b)
    huge = sum(1 for b in bodies if b and len(b) >= 19_000)
    injection = sum(1 for b in bodies if (b and "Ignore all previous instructions" in b) or (b and "SYSTEM:" in b))
    non_ascii = sum(1 for b in bodies if b and any(ord(c) > 0x2000 for c in b))
    for count in (empty, huge, injection, non_ascii):
        assert 10 <= count <= 200, (empty, huge, injection, non_ascii)


def test_tier_follows_the_scenario() -> None:
    rows = generate_tickets(3000, random.Random(2))
    sso = Counter(r["customer_tier"] for r in rows if r["subject"] == "SSO broken after IdP change")
    assert sso["free"] == 0 and sso["enterprise"] > sso["pro"]
