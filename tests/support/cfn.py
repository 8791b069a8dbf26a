"""Reading template.yaml with CloudFormation's short-form tags (!Ref, !Sub, !GetAtt, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    pass


def _tag(name: str) -> Any:
    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        if isinstance(node, yaml.ScalarNode):
            value: Any = loader.construct_scalar(node)
            if name == "GetAtt" and isinstance(value, str):
                value = value.split(".", 1)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)
        return {"Ref": value} if name == "Ref" else {f"Fn::{name}": value}

    return construct


for _name in ("Ref", "Sub", "GetAtt", "Join", "If", "Equals", "Not", "And", "Or", "Select", "Split", "FindInMap",
              "ImportValue", "Base64", "Condition", "GetAZs", "Cidr"):  # fmt: skip
    _Loader.add_constructor(f"!{_name}", _tag(_name))


def load_template(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=_Loader)


def refs_as_placeholders(value: Any) -> Any:
    """``{"Ref": "X"}`` -> ``"${X}"`` (how eventbridge/ patterns write template parameters)."""
    if isinstance(value, dict):
        if set(value) == {"Ref"}:
            return "${" + value["Ref"] + "}"
        return {k: refs_as_placeholders(v) for k, v in value.items()}
    if isinstance(value, list):
        return [refs_as_placeholders(v) for v in value]
    return value
