"""The documentation says what the code does: the README is a front page, docs/ a site whose generated pages
(the CLI and settings references, the performance figures) are the code's and the results' own, and every
command it shows parses (the tutorial's also run: tests/e2e/test_tutorial.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from icebatch.tools.cli import build_parser
from icebatch.tools.docs import cli_markdown, with_config

pytestmark = pytest.mark.contract
ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
EXAMPLES = sorted((ROOT / "examples").glob("*/README.md"))
DOCUMENTS = [README, *PAGES, *EXAMPLES]


def test_the_readme_is_a_front_page_whose_links_lead_somewhere() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 200, "the README is the front page: move detail to docs/"
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 10 and [link for link in links if not (ROOT / link).exists()] == []


def test_every_page_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [p for p in PAGES if str(p.relative_to(ROOT / "docs")) not in nav] == []


def test_the_generated_pages_are_the_codes() -> None:
    settings = ROOT / "docs" / "reference" / "settings.md"
    assert settings.read_text() == with_config(settings.read_text()), "run `python -m icebatch.tools.docs`"
    assert (ROOT / "docs" / "reference" / "cli.md").read_text() == cli_markdown(), "run `python -m icebatch.tools.docs`"


def _documented_commands() -> list[tuple[str, str]]:
    found = []
    for doc in DOCUMENTS:
        blocks = re.findall(r"```bash\n(.*?)```", doc.read_text(), flags=re.S)
        lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
        found += [(str(doc.relative_to(ROOT)), line) for line in lines if line.startswith("icebatch ")]
    return found


def test_the_documents_show_commands() -> None:
    where = {doc for doc, _ in _documented_commands()}
    assert where == {"README.md", "docs/tutorial.md", "docs/operating.md", "examples/product-reviews/README.md"}, (
        "a page's commands need a test that runs them"
    )


def test_the_readmes_commands_are_the_tutorials_which_run_in_a_test() -> None:
    # tests/e2e/test_tutorial.py runs the tutorial's; tests/functional/test_operating_commands.py the operating page's;
    # tests/e2e/test_reviews_example.py the product-reviews example's
    commands = _documented_commands()
    readme = {" ".join(shlex.split(line)) for doc, line in commands if doc == "README.md"}
    tutorial = {" ".join(shlex.split(line)) for doc, line in commands if doc == "docs/tutorial.md"}
    assert readme <= tutorial, readme - tutorial


@pytest.mark.parametrize(("doc", "line"), _documented_commands())
def test_documented_commands_parse(doc: str, line: str) -> None:
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
    needs_value = {
        "--tickets": "10",
        "--batches": "2",
        "--seed": "1",
        "--limit": "5",
        "--to-snapshot": "1",
        "--reason": "r",
        "--event": "f.json",
        "--trigger": "manual",
        "--consumer": "triage",
        "--where": "status = 'ok'",
    }
    out: list[str] = []
    for i, a in enumerate(args):
        out.append(a)
        if a in needs_value and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(needs_value[a])
    return out


def test_make_targets_in_the_documents_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for doc in DOCUMENTS:
        for target in set(re.findall(r"(?:^|`)make ([a-z][\w-]*)", doc.read_text(), flags=re.M)):
            assert re.search(rf"^{target}:", makefile, flags=re.M), f"{doc.name}: make {target}"
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_performance_page_matches_the_latest_benchmark_results() -> None:
    from bench.report import PAGE, render, section

    assert section(PAGE.read_text()) == render(), "run `python -m bench.report` (make bench does) and commit it"


SETTING = re.compile(r"\bICEBATCH_[A-Z0-9_]+\b")


def test_every_setting_the_documents_name_is_one() -> None:
    from icebatch.core.settings import SECTIONS, Settings

    settings = Settings()
    known = {f"ICEBATCH_{f.upper()}" for s in SECTIONS for f in type(getattr(settings, s)).model_fields}
    named = {
        (doc.relative_to(ROOT), n)
        for doc in (*DOCUMENTS, *(ROOT / "docs").rglob("*.md"))
        for n in SETTING.findall(doc.read_text())
    }
    assert sorted((str(d), n) for d, n in named if n not in known) == []


def test_the_exit_statuses_the_operating_page_gives_are_the_codes() -> None:
    from icebatch.core import errors

    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    page = (ROOT / "docs" / "operating.md").read_text()
    paragraph = page[page.index("Exit status:") :].split("\n\n", 1)[0]
    listed = {int(n) for n in re.findall(r"(?:^|[:,] )(\d+) ", paragraph.replace("\n", " "))}
    assert listed == codes, (sorted(listed), sorted(codes))


def test_every_path_of_the_repository_the_documents_name_is_there() -> None:
    tops = (
        "functions/",
        "jobimage/",
        "eventbridge/",
        "sam/",
        "tests/",
        "bench/",
        "docs/",
        "examples/",
        "requirements/",
    )
    named = {
        (str(doc.relative_to(ROOT)), path.rstrip("/"))
        for doc in (*DOCUMENTS, *(ROOT / "docs").rglob("*.md"))
        for path in re.findall(r"`([\w./-]+)`", doc.read_text())
        if path.startswith(tops) and "*" not in path and "<" not in path
    }
    assert sorted((d, p) for d, p in named if not (ROOT / p).exists()) == []


def test_every_extra_the_documents_and_messages_name_is_one_and_the_local_one_says_its_index() -> None:
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    sources = [*DOCUMENTS, *sorted((ROOT / "functions").rglob("*.py")), *sorted((ROOT / "jobimage").rglob("*.py"))]
    named = {
        (str(path.relative_to(ROOT)), extra)
        for path in sources
        for group in re.findall(r"icebatch\[([a-z,]+)\]", path.read_text())
        for extra in group.split(",")
    }
    assert named and [n for n in named if n[1] not in extras] == []
    # an install of the local extra names PyTorch's CPU index (torch's CPU build is not on PyPI), wherever it is shown
    installs = [
        (str(path.relative_to(ROOT)), line)
        for path in DOCUMENTS
        for line in path.read_text().splitlines()
        if re.search(r"pip install ['\"]?[^ ]*\[local\]", line)
    ]
    index = "--extra-index-url https://download.pytorch.org/whl/cpu"
    assert installs and [i for i in installs if index not in i[1]] == []
