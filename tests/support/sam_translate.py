"""Run SAM's own transform (samtranslator, from the SAM CLI's virtualenv) on template.yaml.

What a deploy creates is the *transformed* template: the rules, the schedule, the generated roles. The
SAM CLI's virtualenv (``make sam-venv``; it pins boto3 and pydantic, so it is not the project's) holds
samtranslator; this runs it in a subprocess and returns the CloudFormation template as JSON.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import json, sys
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

class NoManagedPolicies:
    def load(self):
        return {}

template = yaml_parse(open(sys.argv[1]).read())
# as after `sam package`: code is an S3 object
template.get("Globals", {}).get("Function", {})["CodeUri"] = "s3://packaged/code.zip"
for resource in template["Resources"].values():
    if resource["Type"] == "AWS::Serverless::Function" and "CodeUri" in resource.get("Properties", {}):
        resource["Properties"]["CodeUri"] = "s3://packaged/code.zip"
print(json.dumps(transform(template, {}, NoManagedPolicies())))
"""


def sam_python() -> str:
    """The SAM CLI venv's python: $SAM_PYTHON, or the newest under $ICEBATCH_CACHE (~/.cache/icebatch)."""
    if os.environ.get("SAM_PYTHON"):
        return os.environ["SAM_PYTHON"]
    cache = Path(os.environ.get("ICEBATCH_CACHE") or Path.home() / ".cache" / "icebatch")
    found = sorted(cache.glob("sam-*/bin/python"))
    if not found:
        raise RuntimeError("SAM CLI's virtualenv is missing: run `make sam-venv` (make test and make test-aws do)")
    return str(found[-1])


@functools.cache
def translated(template: Path = ROOT / "template.yaml") -> dict[str, Any]:
    env = {**os.environ, "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
    done = subprocess.run(
        [sam_python(), "-c", _SCRIPT, str(template)], capture_output=True, text=True, timeout=120, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"SAM could not transform {template}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result
