"""Untrusted input, handled the same way everywhere: parsed strictly, echoed only in summary.

- ``loads_strict`` parses JSON text or bytes as the contracts expect it: UTF-8 only, no duplicate keys
  (``{"force": false, "force": true}`` is ambiguous, not "the last one wins"), no ``NaN``/``Infinity``,
  bounded nesting; anything else is an ``InvalidEventError`` with one line that says where.
- ``summarize`` renders a value for an error message or a log line: printable ASCII (control characters,
  lone surrogates and non-ASCII escaped, so that a log handler can always encode it) and at most
  ``limit`` characters, with the original length said.
- ``RUN_ID``, ``CONSUMER_NAME``, ``DEPLOYMENT``: the patterns of the identifiers that become file names,
  object keys, labels or Kubernetes names, checked where they enter (the event contracts, the CLI,
  consumers.yaml): no path separators, no dots, no control characters, bounded length.
"""

from __future__ import annotations

import json
from typing import Any

from icebatch.core.errors import InvalidEventError

MAX_ECHO = 120  # characters of an untrusted value an error message may quote
MAX_DEPTH = 64  # JSON nesting: events are a few levels deep
MAX_EVENT_BYTES = 256 * 1024  # EventBridge's and Lambda's async payload limit

# Run ids (``triage-20261129T073000-3fa9c2``; ``--run-id``): letters, digits and '-', at most 100.
RUN_ID = r"^[A-Za-z0-9][A-Za-z0-9-]{0,99}$"
# Consumer names: part of Kubernetes names, table names, metric dimensions and SNS attributes.
CONSUMER_NAME = r"^[a-z][a-z0-9-]{0,19}$"
# Deployments (stacks): part of rule names, metric namespaces and event filters.
DEPLOYMENT = r"^[A-Za-z][A-Za-z0-9-]{0,63}$"


INT64_MAX = 2**63 - 1  # Iceberg's snapshot ids and sequence numbers are longs, never negative
# Kubernetes object names (RFC 1123 subdomain): a RayJob's name, recorded in events
K8S_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"


def whole_number(text: str, low: int = 0, high: int = INT64_MAX) -> int | None:
    """``text`` as a whole number from ``low`` to ``high`` if written plainly, else None.

    Plainly: ASCII digits only. ``int()`` also takes a sign, spaces, underscores and other scripts' digits
    (``int("\u0663") == 3``), and ``str.isdigit()`` takes superscripts ``int()`` then refuses.
    """
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(high))):
        return None
    value = int(text)
    return value if low <= value <= high else None


def summarize(value: Any, limit: int = MAX_ECHO) -> str:
    """``value`` made safe to print: escaped to printable ASCII and cut to ``limit`` characters."""
    if not isinstance(value, str):
        if isinstance(value, (int, float, bool)) or value is None:
            value = json.dumps(value) if not isinstance(value, float) else repr(value)
        else:
            size = f" of {len(value)}" if isinstance(value, (list, dict, tuple)) else ""
            return f"<{type(value).__name__}{size}>"
    escaped = ascii(value)[1:-1]
    if len(escaped) <= limit:
        return escaped
    return f"{escaped[:limit]}... ({len(value):,} characters)"


def one_line(text: str, limit: int = 1000) -> str:
    """An error's text as one bounded line: a traceback (Ray's errors carry their worker's) becomes its first
    line and its last, the exception that started it; the whole text stays in the log it came from."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        text = f"{lines[0]} ... {lines[-1]}"
    return summarize(text, limit)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidEventError(f"duplicate key {summarize(key)!r} in a JSON object (ambiguous: which one?)")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise InvalidEventError(f"{name} is not JSON (numbers must be finite)")


def _depth(text: str) -> int:
    """Deepest nesting of brackets outside strings (a cheap pre-check: json recurses per level)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def loads_strict(data: str | bytes, *, what: str = "event", max_bytes: int = MAX_EVENT_BYTES) -> Any:
    """Parse untrusted JSON strictly (see the module docstring); InvalidEventError with one line otherwise."""
    if isinstance(data, bytes):
        if len(data) > max_bytes:
            raise InvalidEventError(f"{what} is {len(data):,} bytes; at most {max_bytes:,} are accepted")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidEventError(
                f"{what} is not UTF-8 text (byte {e.start}: {data[e.start : e.start + 1]!r})"
            ) from e
    if len(data) > max_bytes:
        raise InvalidEventError(f"{what} is {len(data):,} characters; at most {max_bytes:,} bytes are accepted")
    depth = _depth(data)
    if depth > MAX_DEPTH:
        raise InvalidEventError(f"{what} is nested {depth:,} levels deep; at most {MAX_DEPTH} are accepted")
    try:
        return json.loads(data, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise InvalidEventError(f"{what} is not JSON: {e.msg} (line {e.lineno}, column {e.colno})") from e
    except RecursionError as e:  # not reached after the depth check; kept as the last line of defence
        raise InvalidEventError(f"{what} is nested too deeply") from e


def validation_summary(e: Any) -> str:
    """The first problem of a pydantic ValidationError, where and what, quoting the input only in summary."""
    errors = e.errors() if hasattr(e, "errors") else []
    if not errors:
        return summarize(str(e))
    first = errors[0]
    where = ".".join(summarize(p, 40) for p in first.get("loc", ())) or "event"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {summarize(first.get('msg', ''), 200)}{more}"
