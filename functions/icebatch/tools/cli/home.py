"""Where the command line's local state is: the home, found as git finds ``.git``.

``ICEBATCH_HOME`` says where, when set. Otherwise the home is the ``.icebatch`` folder of the current folder or
of the nearest folder above it that has one, so that ``icebatch backlog`` in a project's subfolder reads the
project's catalog. Where there is none, the commands that make state (``generate``, ``demo``, ``model``) make it
here; a command that reads the local catalog says in one line that there is none, instead of creating an empty
catalog and then saying the table does not exist.

The folder holding the home is the project's: its ``consumers.yaml`` (``icebatch init`` writes one) is the
consumers file unless ``ICEBATCH_CONSUMERS_FILE`` says otherwise.
"""

from __future__ import annotations

from pathlib import Path

from icebatch.core.errors import ConfigError
from icebatch.core.settings import Settings

HOME = ".icebatch"
MAKES_STATE = frozenset({"init", "generate", "demo", "model"})
NO_STATE = frozenset({"config", "contracts"})


def find_home(start: Path) -> Path | None:
    """The ``.icebatch`` folder of ``start`` or of the nearest folder above it that has one."""
    for folder in (start, *start.parents):
        if (folder / HOME).is_dir():
            return folder / HOME
    return None


def with_home(settings: Settings, command: str, cwd: Path | None = None) -> Settings:
    """``settings`` with the home found (``ICEBATCH_HOME`` set: as it says)."""
    if command in NO_STATE:
        return settings
    if "home" in settings.top.model_fields_set:
        return _project_consumers(settings, Path(settings.home).resolve())
    here = (cwd or Path.cwd()).resolve()
    found = find_home(here)
    if found is not None:
        return _project_consumers(settings, found)
    if command in MAKES_STATE:
        return _project_consumers(settings, here / HOME)
    local_catalog = settings.catalog.catalog_type == "sql" and not settings.catalog.catalog_uri
    if not local_catalog:
        return settings
    raise ConfigError(
        f"no icebatch home here: no {HOME}/ in {here} or any folder above it, so there is no local catalog to read. "
        f"Fix: `icebatch init <namespace.table>` here makes a project for your table; or run this inside your "
        f"project (where `icebatch init`, `icebatch generate` or `make demo` made {HOME}/), or set ICEBATCH_HOME"
    )


def _project_consumers(settings: Settings, home: Path) -> Settings:
    """``settings`` with ``home``, and the project's consumers file (``consumers.yaml`` beside the home) unless
    one is configured (``settings`` as read from the environment: a copy marks every field set)."""
    project = home.parent / "consumers.yaml"
    if "consumers_file" in settings.launch.model_fields_set or not project.is_file():
        return settings.with_overrides(home=home)
    return settings.with_overrides(home=home, consumers_file=project)
