"""Validating manifests against a CRD's openAPIV3Schema, strictly: unknown fields are errors.

Kubernetes prunes unknown fields by default and rejects them with ``fieldValidation=Strict`` (what the
launcher sends). Here every object schema that lists ``properties`` and does not preserve unknown fields
gets ``additionalProperties: false``; ``x-kubernetes-int-or-string`` becomes ``integer or string``.
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import Any

import jsonschema
import yaml

# KubeRay's RayJob CRDs, vendored (gzipped) from ../shared/schemas/kuberay so that a bare clone can test.
CRD_DIR = Path(__file__).resolve().parents[1] / "data" / "kuberay"
SHARED_DIR = Path(__file__).resolve().parents[3] / "shared" / "schemas" / "kuberay"
VERSIONS = ("v1.6.1", "v1.7.0")


def crd_text(version: str) -> str:
    return gzip.decompress((CRD_DIR / f"ray.io_rayjobs.{version}.yaml.gz").read_bytes()).decode()


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def rayjob_validator(version: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(crd_text(version))
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(_strict(schema))


def errors(manifest: dict[str, Any], version: str) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in rayjob_validator(version).iter_errors(manifest)
    ]
