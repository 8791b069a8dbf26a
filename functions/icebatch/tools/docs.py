"""The documentation's generated parts, from the code: the CLI reference (every command's ``--help``) and the
settings tables. ``python -m icebatch.tools.docs`` rewrites them in a clone's ``docs/``; a test keeps them equal.

    python -m icebatch.tools.docs [--check]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

WIDTH = 100  # the help's line width in the reference, whatever the terminal that generates it
CONFIG_START, CONFIG_END = "<!-- config:start -->", "<!-- config:end -->"


def _commands(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from _commands(sub, f"{path} {name}")


def _help(parser: argparse.ArgumentParser) -> str:
    cls = parser.formatter_class
    parser.formatter_class = lambda prog: cls(prog, width=WIDTH)  # type: ignore[call-arg]
    try:
        return parser.format_help().rstrip()
    finally:
        parser.formatter_class = cls


def cli_markdown() -> str:
    """docs/reference/cli.md: each command's help, as ``icebatch COMMAND --help`` prints it."""
    from icebatch.tools.cli import build_parser

    out = [
        "# Command line reference",
        "",
        "Generated from the code (`python -m icebatch.tools.docs`): what `icebatch <command> --help` prints.",
        "",
    ]
    for path, parser in _commands(build_parser(), "icebatch"):
        out += [f"## `{path}`", "", "```text", _help(parser), "```", ""]
    return "\n".join(out)


def with_config(text: str) -> str:
    """``text`` with the settings tables between its config markers made from the code."""
    from icebatch.tools.cli.meta import config_markdown

    before, rest = text.split(f"{CONFIG_START}\n", 1)
    after = rest.split(f"\n{CONFIG_END}", 1)[1]
    return f"{before}{CONFIG_START}\n{config_markdown()}\n{CONFIG_END}{after}"


def main(root: Path | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated page is not up to date")
    args = parser.parse_args()
    docs = (root or Path.cwd()) / "docs" / "reference"
    pages = {docs / "cli.md": cli_markdown(), docs / "settings.md": with_config((docs / "settings.md").read_text())}
    stale = [p for p, text in pages.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        print("\n".join(f"stale: {p}" for p in stale) or "up to date")
        return 1 if stale else 0
    for page in stale:
        page.write_text(pages[page])
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
