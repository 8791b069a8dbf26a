"""Money as every surface shows it: one rule, so that the report, `runs`, `costs`, its page, `estimate` and the
launcher's decisions print the same figure alike."""

from __future__ import annotations


def usd(value: object) -> str:
    """``$0.0264``: four decimals (runs cost cents; a cent's tenths tell runs apart), two from $1,000 up; ``-`` for
    no figure.

    >>> usd(0.02634), usd(12.5), usd(1234.5), usd(None)
    ('$0.0263', '$12.5000', '$1,234.50', '-')
    """
    if value is None:
        return "-"
    if not isinstance(value, int | float):
        raise TypeError(f"not an amount of dollars: {value!r}")
    return f"${value:,.4f}" if abs(value) < 1000 else f"${value:,.2f}"
