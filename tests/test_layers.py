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
    {"files", "config_check", "progress", "compiled", "tables", "address_space"},
    {"models", "data"},  # the model library and the data streams: independent of each other
    {"config"},  # TrainConfig holds a SHARNNConfig
    {"runtime"},
    {"evaluation", "generation", "loading"},  # loading: every command's model, with none of training
    {"training"},
    {"coding"},  # online mode trains with the training recipe
    {"analysis", "export"},
    {"analysis_report"},
    {"commands"},  # one module per command: its work, its result and the lines it prints
    {"api"},  # the public names of commands/, re-exported
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


def upward(module: str, targets) -> list[str]:
    """The imports of ``targets`` by ``module`` that the floors refuse."""
    return [
        t
        for t in sorted(targets)
        if t != "sharnn" and not (unit(t) == unit(module) and unit(t) in WINGS) and floor(t) >= floor(module)
    ]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_from_below_or_its_own_wing(module):
    if module == "sharnn":  # the lazy top: it names its public names' modules, importing none
        assert not GRAPH[module]
        return
    assert not upward(module, GRAPH[module]), (
        f"{module} imports from its own floor or above: {upward(module, GRAPH[module])}"
    )


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


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import cycle of ``graph`` (its modules in order, the first repeated last), or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        for target in sorted(graph.get(module, ())):
            if found := visit(target, [*path, module]):
                return found
        done.add(module)
        return None

    return next((found for module in sorted(graph) if (found := visit(module, []))), None)


def test_no_import_cycle():
    found = cycle(GRAPH)
    assert found is None, "import cycle: " + " -> ".join(found or [])


def test_the_contract_sees_the_imports_it_judges():
    """The reader finds relative, nested and lazy imports (a contract that reads nothing
    passes everything)."""
    assert "sharnn.training.recipe" in GRAPH["sharnn.coding.online"]
    assert "sharnn.training.trainer" in GRAPH["sharnn.commands.train"]  # imported inside a function
    assert "sharnn.cli" in GRAPH["sharnn.__main__"]
    assert {"sharnn.training.checkpoint", "sharnn.training.recipe"} <= GRAPH["sharnn.training.trainer"]


COMMANDS = {m for m in MODULES if m.startswith("sharnn.commands.")}


def test_the_contract_covers_one_module_per_command():
    """Every command of the CLI has its module in commands/, on the floor below the API,
    judged by the same tests: a new command module cannot slip past them."""
    for command in ("prepare", "train", "evaluate", "generate", "analyze", "compress", "decompress", "info", "export"):
        module = f"sharnn.commands.{command}"
        assert module in COMMANDS and floor(module) == floor("sharnn.api") - 1, module
        assert GRAPH[module], f"the contract reads no import of {module}"
    assert "sharnn.commands.compress" in GRAPH["sharnn.commands.decompress"]  # inside the wing: allowed
    assert {"sharnn.commands.compress", "sharnn.commands.train"} <= GRAPH["sharnn.api"]


def test_an_upward_import_or_a_cycle_among_the_commands_would_be_caught():
    """The checks themselves, on imports the commands must never have."""
    assert upward("sharnn.commands.compress", {"sharnn.console"}) == ["sharnn.console"]
    assert upward("sharnn.commands.compress", {"sharnn.api", "sharnn.cli"}) == ["sharnn.api", "sharnn.cli"]
    assert upward("sharnn.commands.compress", {"sharnn.commands.listing", "sharnn.coding.codec"}) == []
    assert upward("sharnn.coding.codec", {"sharnn.commands.compress"}) == ["sharnn.commands.compress"]
    graph = GRAPH | {"sharnn.commands.compress": GRAPH["sharnn.commands.compress"] | {"sharnn.commands.decompress"}}
    assert cycle(graph) in (
        ["sharnn.commands.compress", "sharnn.commands.decompress", "sharnn.commands.compress"],
        ["sharnn.commands.decompress", "sharnn.commands.compress", "sharnn.commands.decompress"],
    )


def test_the_api_only_re_exports_and_no_command_module_imports_click():
    """click lives in the command line (cli.py, console.py), so that `sharnn --help` loads
    no torch; the API names what the command modules define."""
    tree = ast.parse(MODULES["sharnn.api"].read_text())
    assert not [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    for module in sorted(COMMANDS | {"sharnn.commands"}):
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(name.split(".")[0] == "click" for name in names), f"{module} imports click"
