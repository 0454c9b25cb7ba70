"""The package's layer contract, read from the source (every import, those inside functions
too): the four wings (models, data, training, coding) under a thin top, each module
importing only from lower floors or its own wing, and no import cycle. CONTRIBUTING.md
points here instead of keeping a table."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "sharnn"

# Lowest first. A module may import from a lower floor, or from its own wing (a folder);
# never from its own floor's other units nor from above.
FLOORS = [
    {"errors"},
    {"files", "config_check", "progress", "compiled"},
    {"models", "data"},  # the model library and the data streams: independent of each other
    {"config"},  # TrainConfig holds a SHARNNConfig
    {"runtime"},
    {"evaluation", "generation"},
    {"training"},
    {"coding"},  # online mode trains with the training recipe
    {"analysis", "export"},
    {"analysis_report", "arguments", "results"},
    {"commands"},  # one module per command: its work, its result and the lines it prints
    {"api"},
    {"console"},
    {"cli"},
    {"__main__"},
]
WINGS = {"models", "data", "training", "coding", "commands"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """The ``sharnn`` modules (or names in them) that ``path`` imports, anywhere in it."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "sharnn"}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module.split(".")[0] != "sharnn":
                continue
            if node.module is None or module == "sharnn":  # from . import x: x may be a module
                found |= {f"{module}.{a.name}" for a in node.names}
            else:
                found.add(module)
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(target: str) -> str:
    """The module an import names: itself, or the module a name is imported from."""
    return target if target in MODULES else target.rsplit(".", 1)[0]


GRAPH = {name: {resolve(t) for t in imported(path) if resolve(t) in MODULES} - {name} for name, path in MODULES.items()}


def unit(module: str) -> str:
    """The wing or top-level module a module belongs to (``sharnn.models.step`` -> models)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def floor(module: str) -> int:
    (number,) = [i for i, units in enumerate(FLOORS) if unit(module) in units]
    return number


def test_every_module_has_a_floor():
    units = {unit(m) for m in MODULES} - {"__init__"}
    assert units == set().union(*FLOORS), "add the new module to FLOORS, on the floor of what it imports"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_from_below_or_its_own_wing(module):
    if module == "sharnn":  # the lazy top: it names its public names' modules, importing none
        assert not GRAPH[module]
        return
    upward = [
        t
        for t in sorted(GRAPH[module])
        if t != "sharnn" and not (unit(t) == unit(module) and unit(t) in WINGS) and floor(t) >= floor(module)
    ]
    assert not upward, f"{module} imports from its own floor or above: {upward}"


def test_the_wings_keep_their_contract():
    """models/ and data/ import nothing of training, coding, the API or the command line;
    training/ nothing of coding; only __main__ imports the command line."""
    for module, targets in GRAPH.items():
        units = {unit(t) for t in targets}
        if unit(module) in ("models", "data"):
            assert not units & {"training", "coding", "api", "cli"}, module
        if unit(module) == "training":
            assert "coding" not in units, module
        if "cli" in units:
            assert module == "sharnn.__main__", f"{module} imports the command line"


def test_no_import_cycle():
    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(module) :] + [module]))
        if module in done:
            return
        for target in sorted(GRAPH.get(module, ())):
            visit(target, [*path, module])
        done.add(module)

    done: set[str] = set()
    for module in sorted(GRAPH):
        visit(module, [])


def test_the_contract_sees_the_imports_it_judges():
    """The reader finds relative, nested and lazy imports (a contract that reads nothing
    passes everything)."""
    assert "sharnn.training.recipe" in GRAPH["sharnn.coding.online"]
    assert "sharnn.training.trainer" in GRAPH["sharnn.api"]  # imported inside a function
    assert "sharnn.cli" in GRAPH["sharnn.__main__"]
    assert {"sharnn.training.checkpoint", "sharnn.training.recipe"} <= GRAPH["sharnn.training.trainer"]
