"""bastion's packages import downward only: the layers below are the architecture, checked.

Each node is a package under `bastion` (`bastion.stores`, `bastion.chat`, …) or a top-level module
(`bastion.agent`). A node may import only nodes of a lower layer, so no package imports upward and
no two import each other. Every import counts: at module level, inside functions, under
`TYPE_CHECKING`, and `importlib.import_module("bastion…")` with a literal name. The old import paths
kept for compatibility (`bastion._moved` shims) import nothing and are not part of the graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src"

# Lowest first. A node imports only from the layers before its own.
LAYERS: list[set[str]] = [
    {
        "bastion._cancel",
        "bastion._client_json",
        "bastion._extraction_names",
        "bastion._extras",
        "bastion._moved",
        "bastion._ui_chunks",
        "bastion.auth",
        "bastion.errors",
        "bastion.request_log",
        "bastion.tools",
        "bastion.versioning",
    },
    {
        "bastion._partial_json",
        "bastion._telemetry",
        "bastion.approvals",
        "bastion.credentials",
        "bastion.policies",
        "bastion.skills",
        "bastion.worker",
    },
    {
        "bastion._ui_assembly",
        "bastion._ui_messages",
        "bastion.api",
        "bastion.history",
        "bastion.persistence",
    },
    # Storage (conversations, runs and their SQL) and the durable engine: nothing of agents or HTTP turns.
    # MCP servers for a turn, with their sign-in routes: above the typed API and the worker, below the
    # stores that keep their pending sign-ins and approved tools.
    # A worker's drain (new turns refused while it stops), over the typed API and the worker too.
    {"bastion.mcp", "bastion.drain"},
    {"bastion.stores", "bastion.durable", "bastion._turn_plan"},
    {"bastion._loop"},
    {"bastion.agent", "bastion.memory", "bastion.sqlalchemy", "bastion.hooks"},
    # A turn over HTTP and its orchestration (with the one lifecycle every turn runs); the public facade.
    {"bastion.chat", "bastion"},
    # The support inbox, whose bot turns run through the chat package's turn lifecycle.
    {"bastion.inbox"},
    {"bastion.client", "bastion.draining_server", "bastion.retention"},
    {"bastion.assistant"},
    {"bastion.cli"},
]

# Old paths kept as deprecated re-exports (see tests/test_moved_imports.py).
SHIMS = {
    "bastion.chat_request",
    "bastion.stream",
    "bastion.durable.turns",
    "bastion.inbox.turns",
    "bastion.stores.chat",
    "bastion.stores.routes",
    "bastion.stores.run",
}

MAX_MODULE_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in (SOURCE / "bastion").rglob("*.py")}


def node(module: str) -> str:
    return ".".join(module.split(".")[:2])


def imports(path: Path) -> set[str]:
    """Every `bastion` module the file imports, wherever the import stands."""
    found: set[str] = set()
    for statement in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
            if statement.module.split(".")[0] != "bastion":
                continue
            submodules = {f"{statement.module}.{alias.name}" for alias in statement.names}
            found |= submodules & MODULES.keys()
            if statement.module != "bastion" or not submodules <= MODULES.keys():
                found.add(statement.module)
        elif isinstance(statement, ast.Import):
            found |= {alias.name for alias in statement.names if alias.name.split(".")[0] == "bastion"}
        elif (
            isinstance(statement, ast.Call)
            and isinstance(statement.func, ast.Attribute)
            and statement.func.attr == "import_module"
            and statement.args
            and isinstance(statement.args[0], ast.Constant)
            and str(statement.args[0].value).startswith("bastion")
        ):
            found.add(str(statement.args[0].value))
    return found


def layer(name: str) -> int:
    for index, nodes in enumerate(LAYERS):
        if name in nodes:
            return index
    raise AssertionError(f"{name} is in no layer of tests/test_import_graph.py: place it")


EDGES = sorted(
    {
        (node(module), node(imported))
        for module, path in MODULES.items()
        if module not in SHIMS
        for imported in imports(path)
        if node(imported) != node(module)
    }
)


def test_every_package_has_a_layer() -> None:
    for module in MODULES.keys() - SHIMS:
        layer(node(module))


@pytest.mark.parametrize(("importer", "imported"), EDGES, ids=[f"{a}->{b}" for a, b in EDGES])
def test_a_package_imports_only_packages_below_it(importer: str, imported: str) -> None:
    assert layer(imported) < layer(importer), f"{importer} imports {imported}, which is not below it"


def test_storage_sits_below_the_agent_and_knows_nothing_of_turns_over_http() -> None:
    assert layer("bastion.stores") < layer("bastion.agent")
    below = {imported for importer, imported in EDGES if importer == "bastion.stores"}
    assert not below & {"bastion.agent", "bastion._loop", "bastion.worker", "bastion.chat", "bastion.durable"}


def test_the_graph_has_edges_to_check() -> None:
    """The scan finds imports at all (a scan that found none would pass every check above)."""
    assert ("bastion.chat", "bastion.stores") in EDGES
    assert ("bastion.stores", "bastion.persistence") in EDGES


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_600_lines(module: str) -> None:
    lines = MODULES[module].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_MODULE_LINES, f"{module} has {lines} lines"
