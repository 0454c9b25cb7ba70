"""The tree stays as ruff's lint rules and formatter (configured in pyproject.toml) want it,
and the pre-commit hook runs the ruff that the test extra pins."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TREE = ["src", "tests", "benchmarks"]


def ruff(*arguments: str) -> subprocess.CompletedProcess:
    """``python -m ruff ARGUMENTS src tests benchmarks`` from the repository root, with the
    project's configuration only (``--config``: a user-level ruff.toml never takes part)."""
    command = [sys.executable, "-m", "ruff", *arguments, "--config", str(ROOT / "pyproject.toml"), *TREE]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("arguments", [("check",), ("format", "--check")], ids=["check", "format"])
def test_the_tree_is_clean_under_ruff(arguments):
    result = ruff(*arguments)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pre_commit_runs_the_pinned_ruff():
    (pin,) = re.findall(r'"ruff==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    (repo,) = [r for r in hooks["repos"] if r["repo"] == "https://github.com/astral-sh/ruff-pre-commit"]
    assert repo["rev"] == f"v{pin}"
    assert {hook["id"] for hook in repo["hooks"]} == {"ruff-check", "ruff-format"}


# What a reader takes in at once (CONTRIBUTING.md, "Size"): a module, a function, the CLI.
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_CLI_LINES = 600, 60, 330


def _functions(path: Path):
    """``(name, lines)`` of every function in ``path``, nested ones too: from its ``def``
    line to its last line, docstring included, decorators not."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1


def test_modules_and_functions_fit_on_a_screen():
    modules = sorted((ROOT / "src" / "sharnn").rglob("*.py"))
    assert modules, "no source found"
    long_modules = {
        str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    long_functions = {
        f"{p.relative_to(ROOT)}:{name}": n for p in modules for name, n in _functions(p) if n > MAX_FUNCTION_LINES
    }
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"
    assert len((ROOT / "src" / "sharnn" / "cli.py").read_text().splitlines()) <= MAX_CLI_LINES
