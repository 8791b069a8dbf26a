"""Every command docs/operating.md lists runs: each line of its synopsis in its plain form (the options in brackets
left out, the placeholders filled in from the project), in a project made as the tutorial makes one and labelled
by the rule-based job (the engine is not what is tested here: tests/e2e/test_tutorial.py runs it, and the
tutorial's commands with it)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.consumers import consumer_named, load_consumers
from icebatch.core.ledger import open_ledger
from icebatch.core.settings import Settings
from icebatch.tools.cli import main
from icebatch.tools.cli.home import with_home

from tests.support.runs import run_once

ROOT = Path(__file__).resolve().parents[2]
OPERATING = ROOT / "docs" / "operating.md"
TUTORIAL = ROOT / "docs" / "tutorial.md"
EXAMPLE_RUN = re.compile(r"\btriage-\d{8}T\d{6}-[0-9a-f]{6}\b")
NOT_HERE = {"icebatch demo": "runs the engine on the example: tests/e2e/test_demo.py runs it"}


def synopsis() -> list[str]:
    """The command lines of the page's first block, comments cut."""
    block = re.search(r"```bash\n(.*?)```", OPERATING.read_text(), flags=re.S)
    assert block is not None
    return [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines() if line.startswith("icebatch ")]


def plain(line: str, values: dict[str, str]) -> list[str]:
    """The line without its options in brackets, its placeholders (C, ID, TEXT, an example run id, the repository's
    event files) filled in."""
    line = EXAMPLE_RUN.sub(values["RUN"], re.sub(r"\s*\[[^\]]*\]", "", line))
    words = [values.get(w, w) for w in shlex.split(line)[1:]]
    return [str(ROOT / w) if w.startswith("sam/events/") else w for w in words]


def make_reviews() -> None:
    """The tutorial's script, run here."""
    script = re.search(r"```python\n(.*?)```", TUTORIAL.read_text(), flags=re.S)
    assert script is not None
    exec(compile(script.group(1), "make_reviews.py", "exec"), {"__name__": "__main__"})


def recreate_reviews(settings: Settings) -> None:
    """What the --new-source line is for: the source dropped and made again (a new table, its own UUID)."""
    catalog = open_catalog(settings)
    rows = catalog.load_table("shop.reviews").scan().to_arrow()
    catalog.drop_table("shop.reviews")
    catalog.create_table("shop.reviews", schema=rows.schema).append(rows)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The tutorial's project (its table made by its script, its consumer by `icebatch init`), labelled once."""
    folder = tmp_path / "shop"
    folder.mkdir()
    for name in [n for n in os.environ if n.startswith(("ICEBATCH_", "PYICEBERG_"))]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(folder)
    make_reviews()
    assert main(["init", "shop.reviews", "--consumer", "sentiment"]) == 0
    settings = with_home(Settings.from_env(), "runs")
    assert run_once(open_ledger(settings, consumer_named(load_consumers(settings), "sentiment"))) is not None
    return settings


def test_every_command_of_the_operating_page_runs_as_shown(
    project: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # given the tutorial's project, its reviews labelled once
    ledger = open_ledger(project, consumer_named(load_consumers(project), "sentiment"))
    [run] = [r for r in ledger.runs() if not r.is_reset]
    snapshot = open_catalog(project).load_table("shop.reviews").metadata.current_snapshot_id
    values = {"C": "sentiment", "ID": str(snapshot), "TEXT": "the docs' example", "RUN": run.run_id}
    lines = synopsis()
    assert len(lines) >= 20 and set(NOT_HERE) <= set(lines), lines
    capsys.readouterr()
    for line in lines:
        if line in NOT_HERE:
            continue
        argv = plain(line, values)
        if "--new-source" in argv:
            recreate_reviews(project)
        # when each runs, as the page shows it
        status = main(argv)
        out, err = capsys.readouterr()
        if argv[:2] == ["init", "shop.reviews"]:
            # then `init` over a project it made says how to make it again
            assert status == 2 and "--force" in err, (argv, out, err)
            continue
        # then each succeeds
        assert status == 0, (argv, out[-2000:], err[-2000:])
        assert out.strip(), (argv, "printed nothing")
    # and what the last lines did is so: the consumer follows the recreated source, from its start
    after = open_ledger(project, consumer_named(load_consumers(project), "sentiment"))
    assert after.backlog().rows == 3
