"""The house, read as a newcomer would: imports point down, no cycles, thin handlers, code as the formatter writes it.

    tooling (icebatch.tools: CLI, demo, local backend, local bus, invoke)
        -> control plane (icebatch.control: triggers, gate, launcher, RayJob builder, reconciliation,
           backends, Lambda handlers)  and  data plane (icebatch_job: the job image)
            -> core (icebatch.core: settings, consumers, the incremental protocol, contracts, costs, reports)

The data plane has rooms, each a folder (its ``__init__`` says what lives there), and they too import one way:

    the job (icebatch_job.job, .cli, .progress)
        -> stages (the pipeline: prompts, engine or endpoint, parse)
            -> plan (what a run reads) -> commit (what a run writes and what is done)
            -> process (the job's process life: its environment, Ray's start, signals, stall)
                -> local (a Ray instance of the job's own on this machine, and every process of it ending with
                   the job: what only a job without a cluster needs, entered only where the job starts Ray
                   without one; a RayJob's pod loads none of it)
            -> example (support tickets, the tiny model)
    ``icebatch_job.columns``: the column names every stage agrees on, imported from anywhere.

Every import counts, those inside functions too. Adapters loaded by name from configuration (the local
backend, the local bus, the local reports: ``icebatch.core.bus.load_adapter``) are not imports.

A function is as long as what it says needs: one that no longer reads at a glance (about a screen) is a question
for its review, not a number for a test to meet, and never a reason to pack lines past the formatter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.contract
ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"icebatch": ROOT / "functions" / "icebatch", "icebatch_job": ROOT / "jobimage" / "icebatch_job"}
LAYERS = {  # a module may import its own layer and those listed
    "icebatch.core": {"icebatch.core"},
    "icebatch.control": {"icebatch.control", "icebatch.core"},
    "icebatch_job": {"icebatch_job", "icebatch.core"},
    "icebatch.tools": {"icebatch.tools", "icebatch.control", "icebatch.core", "icebatch_job"},
}
ROOMS = {  # a data-plane room may import itself and those listed (and icebatch_job.columns)
    "icebatch_job.local": set(),
    "icebatch_job.process": {"icebatch_job.local"},
    "icebatch_job.example": set(),
    "icebatch_job.commit": set(),
    "icebatch_job.plan": {"icebatch_job.commit"},
    "icebatch_job.stages": {"icebatch_job.plan", "icebatch_job.commit", "icebatch_job.process", "icebatch_job.example"},
}
TOP_OF_THE_DATA_PLANE = {
    "icebatch_job",
    "icebatch_job.__main__",
    "icebatch_job.cli",
    "icebatch_job.job",
    "icebatch_job.linger",
    "icebatch_job.shared",
    "icebatch_job.progress",
    "icebatch_job.columns",
}
MAX_HANDLER_LINES = 40


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            out[name] = path
    return out


MODULES = _modules()


def _layer(module: str) -> str | None:
    return next((layer for layer in LAYERS if module == layer or module.startswith(layer + ".")), None)


def _imports(path: Path, module: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else ".".join([*module.split(".")[: -node.level], node.module])
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES}
    return {name for name in found if name.split(".")[0] in SOURCES}


GRAPH = {module: {m for m in _imports(path, module) if m in MODULES} for module, path in MODULES.items()}


def test_every_module_is_in_a_layer() -> None:
    stray = [m for m in MODULES if _layer(m) is None and m not in {"icebatch", "icebatch.__main__"}]
    assert stray == [], "put each module in core, control, tools or the data plane"
    # `python -m icebatch` is the command line's entry point: it reaches the tooling alone
    assert GRAPH["icebatch.__main__"] and all(m.startswith("icebatch.tools") for m in GRAPH["icebatch.__main__"])


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _layer(m)))
def test_imports_point_down(module: str) -> None:
    allowed = LAYERS[str(_layer(module))]
    upward = sorted(
        m for m in GRAPH[module] if not any(m == a or m.startswith(a + ".") for a in allowed) and m != "icebatch"
    )
    assert upward == [], f"{module} imports {upward}"


def _room(module: str) -> str | None:
    return next((room for room in ROOMS if module == room or module.startswith(room + ".")), None)


def test_every_data_plane_module_is_in_a_room() -> None:
    stray = [m for m in MODULES if m.startswith("icebatch_job") and not _room(m) and m not in TOP_OF_THE_DATA_PLANE]
    assert stray == [], "put each data-plane module in a room (stages, plan, commit, process, local, example)"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _room(m)))
def test_rooms_import_one_way(module: str) -> None:
    room = str(_room(module))
    allowed = {room, *ROOMS[room], "icebatch_job.columns"}
    inside = [m for m in GRAPH[module] if m.startswith("icebatch_job.")]
    wrong = sorted(m for m in inside if not any(m == a or m.startswith(a + ".") for a in allowed))
    assert wrong == [], f"{module} ({room}) imports {wrong}"


def test_there_is_no_import_cycle() -> None:
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(GRAPH[m]):
            if n == m or n.startswith(m + "."):
                continue  # a package and its own submodules
            if state.get(n) == 1 and not m.startswith(n + "."):
                return [*stack[stack.index(n) :], n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for module in sorted(GRAPH):
        if module not in state and (cycle := visit(module)):
            pytest.fail(" -> ".join(cycle))


def _functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((module, node))
    return out


def _length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def test_the_code_is_as_the_formatter_writes_it() -> None:
    """No line the formatter is told to skip: hand-packed lines hide what a function says (``ruff format --check``
    runs in make lint)."""
    skip = "# fmt" + ": skip"  # (spelt apart so that this file does not carry the marker itself)
    packed = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in (ROOT / "functions", ROOT / "jobimage", ROOT / "tests", ROOT / "bench")
        for path in folder.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if line.rstrip().endswith(skip)
    ]
    assert packed == []


def test_every_lambda_handler_is_thin() -> None:
    handlers = [(m, f) for m, f in _functions() if f.name == "lambda_handler"]
    assert {m for m, _ in handlers} >= {
        "icebatch.control.handlers.launcher",
        "icebatch.control.handlers.reporter",
        "icebatch.control.handlers.bucket_events",
    }
    fat = [f"{m}: {_length(f)}" for m, f in handlers if _length(f) > MAX_HANDLER_LINES]
    assert fat == []


LOCAL = "icebatch_job.local"
# the one door to the local room: the job's Ray start, when there is no cluster to connect to
DOOR = ("process/runtime.py", "init_ray")

MAIN_PATH = """
import sys
import icebatch_job.__main__, icebatch_job.cli, icebatch_job.job
import icebatch_job.stages.pipeline, icebatch_job.stages.parse, icebatch_job.stages.prompts, icebatch_job.stages.model
import icebatch_job.stages.endpoint, icebatch_job.commit.chunks, icebatch_job.commit.done, icebatch_job.commit.window
import icebatch_job.plan.work, icebatch_job.plan.source, icebatch_job.process.runtime, icebatch_job.process.warm_imports
print(sorted(m for m in sys.modules if m == "icebatch_job.local" or m.startswith("icebatch_job.local.")))
"""


def _imports_of_local(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of every import of the local room in ``path``."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            modules = []
            if isinstance(child, ast.Import):
                modules = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module:
                modules = [child.module]
            if any(m == LOCAL or m.startswith(f"{LOCAL}.") for m in modules):
                found.append((function, child.lineno))
            visit(child, name)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def test_the_job_imports_the_local_room_only_where_it_starts_a_ray_of_its_own() -> None:
    # given every module of the data plane outside the local room
    job = SOURCES["icebatch_job"]
    modules = [p for p in job.rglob("*.py") if p.relative_to(job).parts[0] != "local"]
    assert len(modules) > 20
    # then the local room is imported in one place: the job's Ray start, when it has no cluster to connect to
    doors = {(str(p.relative_to(job)), function) for p in modules for function, _ in _imports_of_local(p)}
    assert doors == {DOOR}, doors


def test_the_jobs_main_path_loads_no_local_module() -> None:
    # given a fresh interpreter; when it imports what a RayJob's pod runs (the entry point, plan, stages, commit)
    done = subprocess.run([sys.executable, "-c", MAIN_PATH], capture_output=True, text=True, timeout=300)
    # then no module of the local room is loaded
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def _private_imports(path: Path) -> list[str]:
    """Imports of Ray's or vLLM's private modules (``_internal``, ``_private``, any ``_name``) in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] in ("ray", "vllm") and any(p.startswith("_") for p in parts[1:]):
                found.append(f"{path.name}:{node.lineno} {name}")
    return found


def test_the_product_imports_no_private_module_of_ray_or_vllm() -> None:
    # given the job image's and the functions' code
    code = [*SOURCES["icebatch_job"].rglob("*.py"), *SOURCES["icebatch"].rglob("*.py")]
    # then every Ray and vLLM module it imports is a public one
    assert [hit for p in code for hit in _private_imports(p)] == []
