"""The README says what the code does: its settings table is generated, its commands parse."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from icebatch.tools.cli import build_parser
from icebatch.tools.cli.meta import config_markdown

pytestmark = pytest.mark.contract
ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_configuration_tables_are_the_generated_ones() -> None:
    section = README.split("<!-- config:start -->\n", 1)[1].split("\n<!-- config:end -->", 1)[0]
    assert section == config_markdown(), "regenerate it with `icebatch config --markdown`"


def _documented_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("icebatch ")]


@pytest.mark.parametrize("line", _documented_commands())
def test_documented_commands_parse(line: str) -> None:
    words = shlex.split(line)[1:]
    # expand the documentation's alternatives: [--json|--markdown] -> --json, a|b -> a
    args = []
    for w in words:
        w = w.strip("[]")
        if not w or w.isupper() or w in {"ID", "N", "TEXT", "RUN_ID", "FILE"}:
            continue
        args.append(w.split("|")[0])
    cleaned = [a for a in args if a not in {"...", "--force]"}]
    build_parser().parse_args(_with_values(cleaned))


def _with_values(args: list[str]) -> list[str]:
    needs_value = {"--tickets": "10", "--batches": "2", "--seed": "1", "--limit": "5", "--to-snapshot": "1",
                   "--reason": "r", "--event": "f.json", "--trigger": "manual", "--consumer": "triage"}  # fmt: skip
    out: list[str] = []
    for i, a in enumerate(args):
        out.append(a)
        if a in needs_value and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(needs_value[a])
    return out


def test_make_targets_in_the_readme_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in set(re.findall(r"^make (\w+)", README, flags=re.M)):
        assert re.search(rf"^{target}:", makefile, flags=re.M), target
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_performance_section_matches_the_latest_benchmark_results() -> None:
    from bench.report import render, section

    assert section(README) == render(), "run `python -m bench.report` (make bench does) and commit README.md"
