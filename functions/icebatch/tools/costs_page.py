"""``icebatch costs --html FILE``: one self-contained page (inline SVG and CSS, no script, nothing fetched) with a
chart per measure, a series per consumer: spend per day against the daily budget, rows labelled per day, and the
backlog each launcher decision saw. Under the charts, the same figures as a table.

Pure: it takes the figures (``icebatch.tools.runs.spend_per_day``, ``icebatch.tools.decision_log``) and returns
the page's text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from html import escape

from icebatch.core.costs.money import usd
from icebatch.tools.decision_log import BacklogPoint
from icebatch.tools.runs import DaySpend

# one colour per consumer, in the order the consumers are declared (distinct for colour-blind readers too)
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000")
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 880, 260, 70, 20, 16, 34


@dataclass(frozen=True)
class Page:
    title: str
    since: datetime
    now: datetime
    consumers: Sequence[str]
    days: Sequence[DaySpend]
    backlog: Sequence[BacklogPoint]


def colour(consumers: Sequence[str], name: str) -> str:
    return PALETTE[list(consumers).index(name) % len(PALETTE)]


def render(page: Page) -> str:
    """The page's HTML."""
    day_list = _days(page.since.date(), page.now.date())
    charts = [
        _section(
            "Spend per day (USD)",
            "dashed lines: each consumer's max_usd_per_day",
            _bars(page, day_list, lambda d: d.cost_usd, money=True, budgets=True),
        ),
        _section(
            "Rows labelled per day",
            "rows of completed and closed runs, by the day they ended",
            _bars(page, day_list, lambda d: float(d.rows), money=False, budgets=False),
        ),
        _section(
            "Backlog (rows not yet labelled)",
            "as each launcher decision saw it; dashed: the launch threshold",
            _backlog(page),
        ),
    ]
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:{colour(page.consumers, c)}"></span>'
        f"{escape(c)}</span>"
        for c in page.consumers
    )
    return _TEMPLATE.format(
        title=escape(page.title),
        subtitle=escape(f"{page.since:%Y-%m-%d %H:%M} to {page.now:%Y-%m-%d %H:%M} UTC"),
        legend=legend,
        charts="\n".join(charts),
        table=_table(page),
    )


def _days(first: date, last: date) -> list[date]:
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def _section(title: str, note: str, svg: str) -> str:
    return f'<section><h2>{escape(title)}</h2><p class="note">{escape(note)}</p>{svg}</section>'


def _scale(top: float) -> tuple[float, list[float]]:
    """A round axis maximum at or above ``top`` (four steps of 1, 2, 2.5 or 5 times a power of ten) and its ticks."""
    raw = top / 4 if top > 0 else 0.25
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return step * 4, [step * i for i in range(1, 5)]


def _y(value: float, axis_max: float) -> float:
    return TOP + (HEIGHT - TOP - BOTTOM) * (1 - value / axis_max)


def _label(value: float, money: bool) -> str:
    if money:
        return f"${value:,.2f}" if value >= 0.01 else f"${value:.2g}"
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"


def _frame(axis_max: float, ticks: list[float], money: bool) -> list[str]:
    parts = [f'<line class="axis" x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" y2="{HEIGHT - BOTTOM}"/>']
    for t in ticks:
        y = _y(t, axis_max)
        parts.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_label(t, money)}</text>')
    return parts


def _bars(page: Page, day_list: list[date], value: Callable[[DaySpend], float], *, money: bool, budgets: bool) -> str:
    by_key = {(d.day, d.consumer): value(d) for d in page.days}
    budget = {d.consumer: d.budget_usd for d in page.days if d.budget_usd is not None} if budgets else {}
    axis_max, ticks = _scale(max([*by_key.values(), *budget.values(), 0.0]))
    slot = (WIDTH - LEFT - RIGHT) / len(day_list)
    bar = max(1.0, slot * 0.8 / max(1, len(page.consumers)))
    parts = _frame(axis_max, ticks, money)
    for i, day in enumerate(day_list):
        x0 = LEFT + i * slot + slot * 0.1
        if len(day_list) <= 10 or i % max(1, len(day_list) // 8) == 0 or i == len(day_list) - 1:
            parts.append(
                f'<text class="tick" x="{LEFT + (i + 0.5) * slot:.1f}" y="{HEIGHT - BOTTOM + 16}" '
                f'text-anchor="middle">{day:%m-%d}</text>'
            )
        for j, name in enumerate(page.consumers):
            v = by_key.get((day.isoformat(), name), 0.0)
            if v <= 0:
                continue
            y = min(_y(v, axis_max), HEIGHT - BOTTOM - 2)  # a day that spent something shows, however little
            parts.append(
                f'<rect x="{x0 + j * bar:.1f}" y="{y:.1f}" width="{bar:.1f}" '
                f'height="{HEIGHT - BOTTOM - y:.1f}" fill="{colour(page.consumers, name)}">'
                f"<title>{escape(name)} {day}: {usd(v) if money else _label(v, money)}</title></rect>"
            )
    for name, b in budget.items():
        y = _y(b, axis_max)
        parts.append(
            f'<line class="limit" x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
            f'stroke="{colour(page.consumers, name)}"><title>{escape(name)} budget per day: '
            f"{_label(b, True)}</title></line>"
        )
    return _svg(parts)


def _backlog(page: Page) -> str:
    points = [p for p in page.backlog if p.consumer in page.consumers]
    if not points:
        return (
            '<p class="empty">No launcher decisions in this window (they are kept in decisions.jsonl under the '
            "home; on AWS the dashboard's BacklogRows panel charts them).</p>"
        )
    axis_max, ticks = _scale(max(max(p.rows, p.threshold) for p in points))
    start, span = page.since, max(1.0, (page.now - page.since).total_seconds())
    parts = _frame(axis_max, ticks, False)
    for label_at, anchor in ((start, "start"), (start + (page.now - start) / 2, "middle"), (page.now, "end")):
        x = LEFT + (WIDTH - LEFT - RIGHT) * (label_at - start).total_seconds() / span
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="{anchor}">'
            f"{label_at:%m-%d %H:%M}</text>"
        )
    for name in page.consumers:
        mine = [p for p in points if p.consumer == name]
        if not mine:
            continue
        c = colour(page.consumers, name)
        xy = [
            (LEFT + (WIDTH - LEFT - RIGHT) * (p.at - start).total_seconds() / span, _y(p.rows, axis_max)) for p in mine
        ]
        parts.append(
            f'<polyline fill="none" stroke="{c}" stroke-width="2.5" '
            f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in xy)}"/>'
        )
        for (x, y), p in zip(xy, mine, strict=True):
            parts.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{c}"><title>{escape(name)} '
                f"{p.at:%Y-%m-%d %H:%M}: {p.rows:,} rows, {escape(p.decision)}</title></circle>"
            )
        y = _y(mine[-1].threshold, axis_max)
        parts.append(f'<line class="limit" x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="{c}"/>')
    return _svg(parts)


def _svg(parts: list[str]) -> str:
    body = "\n".join(parts)
    return f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img">{body}</svg>'


def _table(page: Page) -> str:
    if not page.days:
        return '<p class="empty">Nothing spent in this window.</p>'
    rows = "".join(
        f"<tr><td>{d.day}</td><td>{escape(d.consumer)}</td><td>{d.runs}</td><td>{d.failed_attempts}</td>"
        f"<td>{d.rows:,}</td><td>{usd(d.cost_usd)}</td>"
        f"<td>{usd(d.budget_usd)}</td></tr>"
        for d in page.days
    )
    return (
        "<table><thead><tr><th>day (UTC)</th><th>consumer</th><th>runs</th><th>failed attempts</th><th>rows</th>"
        f"<th>spent</th><th>budget per day</th></tr></thead><tbody>{rows}</tbody></table>"
    )


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }}
h1 {{ font-size: 20px; margin: 0; }} h2 {{ font-size: 16px; margin: 20px 0 0; }}
.note, .sub {{ color: #666; margin: 2px 0 6px; }}
.key {{ margin-right: 16px; }} .swatch {{ display: inline-block; width: 12px; height: 12px; margin-right: 4px; }}
.axis {{ stroke: #444; }} .grid {{ stroke: #e3e3e3; }} .tick {{ font-size: 11px; fill: #555; }}
.limit {{ stroke-dasharray: 6 4; stroke-width: 2; }}
.empty {{ color: #666; font-style: italic; }}
table {{ border-collapse: collapse; margin-top: 16px; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: right; }}
</style></head>
<body><h1>{title}</h1><p class="sub">{subtitle}</p><p>{legend}</p>
{charts}
<h2>Spend per day</h2>{table}
</body></html>
"""
