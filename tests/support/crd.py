"""Validating manifests against a CRD's openAPIV3Schema, strictly: unknown fields are errors.

Kubernetes prunes unknown fields by default and rejects them with ``fieldValidation=Strict`` (what the
launcher sends, and what ``kubectl apply --validate=strict`` does). Here every object schema that lists
``properties`` and does not preserve unknown fields gets ``additionalProperties: false``;
``x-kubernetes-int-or-string`` becomes ``integer or string``. CEL rules (``x-kubernetes-validations``)
are not evaluated: tests check the ones that matter to icebatch by hand.

The CRDs are vendored (gzipped) from ../shared/schemas so that a bare clone can test:
KubeRay RayJob v1.6.1 and v1.7.0, Karpenter NodePool/EC2NodeClass v1.14.1, prometheus-operator PodMonitor
v0.93.0.
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import Any

import jsonschema
import yaml

DATA = Path(__file__).resolve().parents[1] / "data"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "schemas"
CRD_DIR = DATA / "kuberay"
SHARED_DIR = SHARED / "kuberay"
VERSIONS = ("v1.6.1", "v1.7.0")

# kind -> (folder, file stem, served version): the CRDs the manifests in jobimage/k8s/ are checked against
CRDS = {
    "RayJob": ("kuberay", "ray.io_rayjobs", "v1"),
    "NodePool": ("karpenter", "karpenter.sh_nodepools.v1.14.1", "v1"),
    "EC2NodeClass": ("karpenter", "karpenter.k8s.aws_ec2nodeclasses.v1.14.1", "v1"),
    "PodMonitor": ("prometheus-operator", "monitoring.coreos.com_podmonitors.v0.93.0", "v1"),
}


def vendored(folder: str, name: str) -> bytes:
    return gzip.decompress((DATA / folder / f"{name}.yaml.gz").read_bytes())


def crd_text(version: str) -> str:
    return vendored("kuberay", f"ray.io_rayjobs.{version}").decode()


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
def _validator(folder: str, name: str, served: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(vendored(folder, name))
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == served)["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(_strict(schema))


def rayjob_validator(version: str) -> jsonschema.Draft7Validator:
    return _validator("kuberay", f"ray.io_rayjobs.{version}", "v1")


def _messages(validator: jsonschema.Draft7Validator, manifest: dict[str, Any]) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in validator.iter_errors(manifest)
    ]


def errors(manifest: dict[str, Any], version: str) -> list[str]:
    """Problems of a RayJob manifest against KubeRay ``version``'s CRD."""
    return _messages(rayjob_validator(version), manifest)


def manifest_errors(manifest: dict[str, Any]) -> list[str]:
    """Problems of a NodePool, EC2NodeClass or PodMonitor manifest against its vendored CRD."""
    folder, name, served = CRDS[manifest["kind"]]
    if manifest.get("apiVersion", "").rsplit("/", 1)[-1] != served:
        return [f"apiVersion {manifest.get('apiVersion')!r} is not the served version {served}"]
    return _messages(_validator(folder, name, served), manifest)
