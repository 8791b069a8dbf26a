"""``icebatch init``'s proposal from a table's schema (tools/scaffold.py)."""

from __future__ import annotations

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
    schema = _schema(("order_id", StringType()), ("sku", LongType()), ("title", StringType()),
                     ("qty", IntegerType()), ("note", StringType()), identifier=(2,))  # fmt: skip
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
