"""Writing and checking the contract files under ``eventbridge/`` from the models and rules in code.

    eventbridge/schemas/<detail-type>.v<N>.json   JSON Schema of each event's detail (from pydantic)
    eventbridge/patterns/<rule>.json              rule patterns (from icebatch.core.rules)
    eventbridge/schedules/<name>.json             schedules (from icebatch.core.rules)

``icebatch contracts write`` regenerates them; ``icebatch contracts check`` (and the contract tests)
fail when the checked-in files differ from the code. A schema whose version already exists is never
rewritten silently: an incompatible change needs a new version (``SCHEMA_VERSION``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from icebatch.core.events import DETAIL_MODELS, SCHEMA_VERSION
from icebatch.core.rules import PATTERNS, SCHEDULES

EVENTBRIDGE = Path(__file__).resolve().parents[3] / "eventbridge"


def slug(detail_type: str) -> str:
    return detail_type.lower().replace(" ", "-")


def detail_schema(detail_type: str) -> dict[str, Any]:
    model = DETAIL_MODELS[detail_type]
    schema = model.model_json_schema(mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://icebatch.dev/schemas/{slug(detail_type)}.v{SCHEMA_VERSION}.json"
    schema["title"] = detail_type
    schema["x-event-source"] = "icebatch"
    schema["x-detail-type"] = detail_type
    return schema


def expected_files() -> dict[str, str]:
    """Relative path -> content of every generated contract file."""
    files: dict[str, str] = {}
    for detail_type in DETAIL_MODELS:
        files[f"schemas/{slug(detail_type)}.v{SCHEMA_VERSION}.json"] = _dump(detail_schema(detail_type))
    for name, pattern in PATTERNS.items():
        files[f"patterns/{name}.json"] = _dump(pattern)
    for name, schedule in SCHEDULES.items():
        files[f"schedules/{name}.json"] = _dump(schedule)
    return files


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def write(root: Path = EVENTBRIDGE) -> list[str]:
    changed = []
    for rel, content in expected_files().items():
        path = root / rel
        if not path.exists() or path.read_text() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            changed.append(rel)
    return changed


def check(root: Path = EVENTBRIDGE) -> list[str]:
    """Files that are missing or differ from what the code generates."""
    return [
        rel
        for rel, content in expected_files().items()
        if not (root / rel).exists() or (root / rel).read_text() != content
    ]
