"""``icebatch init``'s proposal from a table's schema (tools/scaffold.py)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import pytest
import yaml
from icebatch.core.errors import ConfigError
from icebatch.core.task import TaskSpec
from icebatch.tools.scaffold import scaffold
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

pytestmark = pytest.mark.unit


def _schema(*fields: tuple[str, object], identifier: tuple[int, ...] = ()) -> Schema:
    nested = [NestedField(i + 1, name, kind, required=i + 1 in identifier) for i, (name, kind) in enumerate(fields)]
    return Schema(*nested, identifier_field_ids=list(identifier))


def test_the_identifier_field_is_the_id_and_the_text_columns_are_the_prompts() -> None:
    # given a table whose identifier field is `sku`, with an `order_id` column too
    schema = _schema(
        ("order_id", StringType()),
        ("sku", LongType()),
        ("title", StringType()),
        ("qty", IntegerType()),
        ("note", StringType()),
        identifier=(2,),
    )
    # when a consumer is proposed for it
    made = scaffold(schema, "shop.items", "tags")
    # then its id is the identifier field, its prompt reads the text columns, and the task file is a valid task
    assert (made.id_column, made.input_columns) == ("sku", ("order_id", "title", "note"))
    task = TaskSpec.model_validate(yaml.safe_load(made.task_yaml))
    assert task.user_template == "order_id: {order_id}\ntitle: {title}\nnote: {note}\n"
    assert yaml.safe_load(made.consumers_yaml)["consumers"][0]["source_table"] == "shop.items"


@pytest.mark.parametrize(
    ("fields", "options", "message"),
    [
        ((("name", StringType()), ("text", StringType())), {}, "--id-column"),
        ((("id", LongType()), ("n", IntegerType())), {}, "--input-columns"),
        ((("id", LongType()), ("text", StringType())), {"id_column": "nope"}, "no column 'nope'"),
        ((("id", LongType()), ("text", StringType())), {"input_columns": ("body",)}, "no column 'body'"),
    ],
)
def test_what_cannot_be_proposed_is_asked_for_by_name(fields: tuple, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        scaffold(_schema(*fields), "shop.t", "c", **options)


def _schema_of(text: str, folder: Path) -> Path:
    """The file a ``# yaml-language-server: $schema=...`` line points at, read as the language server reads it."""
    ref = text.splitlines()[0].removeprefix("# yaml-language-server: $schema=")
    return Path(url2pathname(urlparse(ref).path)) if ref.startswith("file:") else (folder / ref).resolve()


@pytest.mark.parametrize("where", ["a project of the user's", "a clone of icebatch"])
def test_each_file_points_its_editor_at_the_schema_the_package_ships(tmp_path: Path, where: str) -> None:
    from icebatch.tools.scaffold import SCHEMAS

    # given a project folder outside the package (an install), or the clone the package lies in
    root = tmp_path if where == "a project of the user's" else SCHEMAS.parents[3]
    # when a consumer is proposed there
    made = scaffold(_schema(("id", LongType()), ("text", StringType())), "shop.t", "c", root=root)
    # then each file's schema line names the package's schema, as seen from the folder the file is written in
    assert _schema_of(made.consumers_yaml, root) == SCHEMAS / "consumers.schema.json"
    assert _schema_of(made.task_yaml, root / "tasks") == SCHEMAS / "task.schema.json"
    assert (SCHEMAS / "task.schema.json").is_file()
    # and inside a clone it stays relative (a committed project does not name one machine's paths)
    assert ("file:" in made.task_yaml.splitlines()[0]) == (where == "a project of the user's")
