"""Writing and checking the contract files under ``eventbridge/`` from the models and rules in code.

    eventbridge/schemas/<detail-type>.v<N>.json   JSON Schema of each event's detail (from pydantic)
    eventbridge/patterns/<rule>.json              rule patterns (from icebatch.core.rules)
    eventbridge/schedules/<name>.json             schedules (from icebatch.core.rules)
    functions/icebatch/consumers/schemas/         JSON Schemas of the consumers file and of a task file
                                                  (from icebatch.core.consumers and icebatch.core.task), for editors

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

REPO = Path(__file__).resolve().parents[3]
EVENTBRIDGE = REPO / "eventbridge"
CONFIG_SCHEMAS = REPO / "functions" / "icebatch" / "consumers" / "schemas"


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


def config_file_schemas() -> dict[str, dict[str, Any]]:
    """File name -> JSON Schema of the files a user writes: the consumers file and a task file."""
    from icebatch.core.consumers import consumers_file_schema
    from icebatch.core.task import TaskSpec

    schemas = {
        "task": (TaskSpec.model_json_schema(), "icebatch task"),
        "consumers": (consumers_file_schema(), "icebatch consumers file"),
    }
    for name, (schema, title) in schemas.items():
        schema.update(
            {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "$id": f"https://icebatch.dev/schemas/{name}.schema.json",
                "title": title,
            }
        )
    task, consumers = schemas["task"][0], schemas["consumers"][0]
    return {"task.schema.json": task, "consumers.schema.json": consumers}


def _every_file() -> dict[Path, str]:
    files = {EVENTBRIDGE / rel: content for rel, content in expected_files().items()}
    files.update({CONFIG_SCHEMAS / name: _dump(schema) for name, schema in config_file_schemas().items()})
    return files


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def write() -> list[str]:
    """Regenerate every contract file; those changed, relative to the repository."""
    changed = []
    for path, content in _every_file().items():
        if not path.exists() or path.read_text() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            changed.append(str(path.relative_to(REPO)))
    return changed


def check() -> list[str]:
    """Files that are missing or differ from what the code generates, relative to the repository."""
    return [
        str(p.relative_to(REPO)) for p, content in _every_file().items() if not p.exists() or p.read_text() != content
    ]
