"""Reading template.yaml with CloudFormation's short-form tags (!Ref, !Sub, !GetAtt, ...)."""

from __future__ import annotations

import re
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


for _name in (
    "Ref",
    "Sub",
    "GetAtt",
    "Join",
    "If",
    "Equals",
    "Not",
    "And",
    "Or",
    "Select",
    "Split",
    "FindInMap",
    "ImportValue",
    "Base64",
    "Condition",
    "GetAZs",
    "Cidr",
):
    _Loader.add_constructor(f"!{_name}", _tag(_name))


def load_template(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=_Loader)


def refs_as_placeholders(value: Any) -> Any:
    """``{"Ref": "X"}`` -> ``"${X}"``, ``{"Fn::Sub": "a${X}"}`` -> ``"a${X}"`` (as eventbridge/ patterns write them)."""
    if isinstance(value, dict):
        if set(value) == {"Ref"}:
            return "${" + value["Ref"] + "}"
        if set(value) == {"Fn::Sub"} and isinstance(value["Fn::Sub"], str):
            return value["Fn::Sub"]
        return {k: refs_as_placeholders(v) for k, v in value.items()}
    if isinstance(value, list):
        return [refs_as_placeholders(v) for v in value]
    return value


class Stack:
    """A (SAM-transformed) template as one stack would instantiate it: conditions and intrinsics resolved.

    ``physical`` maps a logical id to what ``Ref`` gives (a queue URL, a topic ARN, a table name) and
    ``attributes`` maps ``(logical id, attribute)`` to what ``Fn::GetAtt`` gives; whoever creates the
    resources (tests/aws/deploy.py) fills both.
    """

    def __init__(
        self,
        template: dict[str, Any],
        name: str,
        parameters: dict[str, str],
        *,
        region: str = "us-east-1",
        account: str = "123456789012",
    ) -> None:
        self.template = template
        self.name = name
        self.region = region
        self.account = account
        declared = template.get("Parameters", {})
        missing = [k for k, v in declared.items() if "Default" not in v and k not in parameters]
        if missing:
            raise ValueError(f"parameters without a default need a value: {missing}")
        self.parameters = {k: parameters.get(k, v.get("Default")) for k, v in declared.items()}
        self.physical: dict[str, str] = {}
        self.attributes: dict[tuple[str, str], str] = {}

    # --- what exists ------------------------------------------------------------------------------
    def condition(self, name: str) -> bool:
        return bool(self.resolve(self.template["Conditions"][name]))

    def resources(self, kind: str | None = None) -> dict[str, dict[str, Any]]:
        return {
            logical: resource
            for logical, resource in self.template["Resources"].items()
            if (kind is None or resource["Type"] == kind)
            and ("Condition" not in resource or self.condition(resource["Condition"]))
        }

    def properties(self, logical: str) -> dict[str, Any]:
        resolved: dict[str, Any] = self.resolve(self.template["Resources"][logical].get("Properties", {}))
        return resolved

    # --- intrinsics --------------------------------------------------------------------------------
    def _pseudo(self, name: str) -> Any:
        return {
            "AWS::StackName": self.name,
            "AWS::Region": self.region,
            "AWS::AccountId": self.account,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": f"arn:aws:cloudformation:{self.region}:{self.account}:stack/{self.name}/0",
        }[name]

    def _ref(self, name: str) -> Any:
        if name.startswith("AWS::"):
            return self._pseudo(name)
        if name in self.parameters:
            value = self.parameters[name]
            kind = self.template["Parameters"][name].get("Type", "String")
            if kind == "CommaDelimitedList":
                return [] if value in ("", None) else (value if isinstance(value, list) else str(value).split(","))
            return value
        if name in self.physical:
            return self.physical[name]
        raise KeyError(f"Ref {name}: no such parameter, or the resource was not created")

    def _sub(self, text: str, variables: dict[str, Any]) -> str:
        def one(m: re.Match[str]) -> str:
            key = m.group(1)
            if key in variables:
                return str(variables[key])
            if "." in key:
                logical, attribute = key.split(".", 1)
                return str(self.attributes[(logical, attribute)])
            return str(self._ref(key))

        return re.sub(r"\$\{([A-Za-z0-9:.]+)\}", one, text)

    def resolve(self, node: Any) -> Any:
        if isinstance(node, list):
            out = [self.resolve(n) for n in node]
            return [v for v in out if v is not _NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, arg),) = node.items()
            if key == "Ref":
                return _NO_VALUE if arg == "AWS::NoValue" else self._ref(arg)
            if key == "Fn::Sub":
                text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], self.resolve(arg[1]))
                return self._sub(text, variables)
            if key == "Fn::GetAtt":
                logical, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
                return self.attributes[(logical, attribute)]
            if key == "Fn::If":
                return self.resolve(arg[1] if self.condition(arg[0]) else arg[2])
            if key == "Fn::Join":
                return str(self.resolve(arg[0])).join(str(v) for v in self.resolve(arg[1]))
            if key == "Fn::Select":
                return self.resolve(arg[1])[int(self.resolve(arg[0]))]
            if key == "Fn::Split":
                return str(self.resolve(arg[1])).split(self.resolve(arg[0]))
            if key == "Fn::Equals":
                return self.resolve(arg[0]) == self.resolve(arg[1])
            if key == "Fn::Not":
                return not self.resolve(arg[0])
            if key == "Fn::And":
                return all(self.resolve(a) for a in arg)
            if key == "Fn::Or":
                return any(self.resolve(a) for a in arg)
            if key == "Condition":
                return self.condition(arg)
        out = {k: self.resolve(v) for k, v in node.items()}
        return {k: v for k, v in out.items() if v is not _NO_VALUE}


class _NoValue:
    def __repr__(self) -> str:
        return "AWS::NoValue"


_NO_VALUE = _NoValue()
