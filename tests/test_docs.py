"""The documentation against the repository, without running anything.

- The commands it shows still parse: every ``sharnn ...`` command (also after ``srun`` or
  torchrun's ``-m``) of a fenced ``bash`` block of README.md and docs/*.md is parsed against
  the real click command tree: the subcommands must exist, every option must be one the
  command has, and a command's arguments must be as many as it takes. ``key=value``
  overrides of ``sharnn train`` must name settings.
- What it cites exists: every local link and every result (``results/...``,
  ``benchmarks/records/...``) named by the README, the manual, benchmarks/README.md and
  results/README.md; and every file in results/ is listed in results/README.md.
- Its module lists (CONTRIBUTING.md's tree, each wing's ``__init__`` docstring) are the
  modules under src/sharnn/, read from the tree.
- The README stays a front page: at most 250 lines, no test counts, and its test command
  is the one CI runs (.ci/run).
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import click
import pytest

from sharnn.cli import main
from sharnn.config import load_config
from sharnn.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[tuple[str, str]]:
    """``(where, arguments)`` of every sharnn command in a fenced bash block (after
    ``sharnn``, ``srun sharnn`` or torchrun's ``-m sharnn``, up to a shell operator such as
    ``|``, ``;`` or ``>``), with backslash continuations joined and comments dropped."""
    found = []
    for document in DOCUMENTS:
        for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", document.read_text(), re.DOTALL | re.MULTILINE):
            for line in block.replace("\\\n", " ").splitlines():
                for words in shell_commands(line):
                    if "sharnn" in words:
                        found.append((str(document.relative_to(ROOT)), shlex.join(words[words.index("sharnn") + 1 :])))
    return found


def shell_commands(line: str) -> list[list[str]]:
    """The words of each simple command of a shell ``line`` (split at ``|``, ``;``, ``&&``,
    redirections, ...), without its comment."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, words = [], []
    for token in lexer:
        if token and all(c in lexer.punctuation_chars for c in token):
            commands, words = commands + [words], []
        else:
            words.append(token)
    return [w for w in commands + [words] if w]


def parse(arguments: list[str]) -> tuple[click.Command, dict, list[str]]:
    """The command ``arguments`` reach, its parsed parameters and the arguments left over,
    by click's own parser (no type conversion, no callback). Raises click.UsageError as
    the real command line would for an unknown command or option, or an option without
    its value."""
    command, name, parent = main, "sharnn", None
    while True:
        context = click.Context(command, info_name=name, parent=parent)
        parsed, rest, _ = command.make_parser(context).parse_args(list(arguments))
        params = {key: value for key, value in parsed.items() if isinstance(value, (str, bool, tuple, list))}  # given
        if not isinstance(command, click.Group) or not rest:
            return command, params, rest
        subcommand = command.get_command(context, rest[0])
        if subcommand is None:
            raise click.UsageError(f"no such command {rest[0]!r} in {context.command_path}")
        command, name, parent, arguments = subcommand, rest[0], context, rest[1:]


COMMANDS = documented_commands()


def test_the_documents_show_commands():
    assert len(COMMANDS) > 40 and {where for where, _ in COMMANDS} >= {"README.md", "docs/training.md"}


@pytest.mark.parametrize("where, line", COMMANDS, ids=[f"{w}: {line[:50]}" for w, line in COMMANDS])
def test_a_documented_command_parses(where, line):
    try:
        command, params, rest = parse(shlex.split(line))
    except click.UsageError as e:
        pytest.fail(f"{where}: {line}\n  {e.format_message()}")
    assert not rest, f"{where}: {line}: {command.name} takes no more arguments: {rest}"
    missing = [p.name for p in command.params if isinstance(p, click.Argument) and p.required and p.name not in params]
    assert not missing, f"{where}: {line}: missing {missing}"
    if command.name == "train":
        try:
            load_config("tiny", list(params.get("overrides") or ()))
        except ConfigError as e:
            pytest.fail(f"{where}: {line}\n  {e}")


def test_the_check_catches_drift():
    """What the check refuses: an unknown command or option, an option without its
    value, an extra or missing argument, an unknown setting."""
    for arguments in (["nocommand"], ["train", "--bogus"], ["prepare", "enwik8", "--out"], ["prepare", "nothing"]):
        with pytest.raises(click.UsageError):
            parse(arguments)
    assert parse(["export", "a", "b", "--out", "c"])[2] == ["b"]
    assert "checkpoint" not in parse(["eval"])[1]
    with pytest.raises(ConfigError):
        load_config("tiny", ["model.no_such_setting=1"])


# ----------------------------------------------------------------------------- what pages cite

PAGES = [*DOCUMENTS, ROOT / "benchmarks" / "README.md", ROOT / "results" / "README.md"]
RESULTS = ROOT / "results"

# A result named in the text: a path under results/ or benchmarks/records/ from the root
# (not the git-ignored benchmarks/results/, nor a placeholder such as results/<name>.json).
CITED_RESULT = re.compile(r"(?<![\w./<-])((?:results|benchmarks/records)/[\w./-]*[\w/])")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")  # [text](target#anchor): the target


def cited(page: Path) -> list[tuple[str, Path]]:
    """``(as written, the path it names)`` of every local link of ``page`` (relative to its
    folder) and every result it names in its text (relative to the repository)."""
    text = page.read_text()
    links = [(t, page.parent / t) for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    return links + [(r, ROOT / r) for r in CITED_RESULT.findall(text)]


def test_what_the_pages_cite_exists():
    assert sum(len(cited(page)) for page in PAGES) > 50
    missing = [f"{page.relative_to(ROOT)}: {name}" for page in PAGES for name, path in cited(page) if not path.exists()]
    assert not missing, "cited but absent:\n" + "\n".join(missing)


def test_the_check_of_citations_sees_links_and_results(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "See [a](other.md#part), ![f](../results/a.png), [web](https://example.org), "
        "results/b.json, (results/c.json), `benchmarks/records/d/`, and not benchmarks/results/x.json "
        "nor results/<name>.json."
    )
    named = [name for name, _ in cited(page)]
    assert named == ["other.md", "../results/a.png", "results/b.json", "results/c.json", "benchmarks/records/d/"]


def listed_results() -> set[str]:
    """The files results/README.md lists: the code spans of the first cell of each row of
    its table under "## The files", relative to results/."""
    text = (RESULTS / "README.md").read_text()
    section = text.split("## The files", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| `")]
    return {name for cell in rows for name in re.findall(r"`([^`]+)`", cell)}


def test_every_result_is_listed_with_its_command():
    files = {str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.is_file() and p.name != "README.md"}
    assert len(files) > 10
    assert files - listed_results() == set(), "results/ holds files results/README.md does not list"
    assert listed_results() - files == set(), "results/README.md lists files results/ does not hold"


# ----------------------------------------------------------------------------- module lists

PACKAGE = ROOT / "src" / "sharnn"
WINGS = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def modules(folder: Path, with_init: bool) -> set[str]:
    return {p.name for p in folder.glob("*.py") if with_init or p.name != "__init__.py"}


def contributing_tree() -> dict[str, set[str]]:
    """The modules CONTRIBUTING.md's tree lists: top-level (key "") and per wing (a line
    ``  wing/  a.py  b.py``, continued on lines indented deeper)."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    (block,) = re.findall(r"^```text\nsrc/sharnn/\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    tree, section = {}, None
    for line in block.splitlines():
        if heading := re.match(r"  (\w+)/", line):
            section = heading.group(1)
        elif re.match(r"  \S", line):
            section = ""
        tree.setdefault(section, set()).update(re.findall(r"\b\w+\.py\b", line))
    return {section: names for section, names in tree.items() if names}


def test_the_module_lists_are_the_tree():
    assert {"models", "data", "training", "coding"} <= set(WINGS)
    truth = {"": modules(PACKAGE, with_init=True)} | {wing: modules(PACKAGE / wing, with_init=False) for wing in WINGS}
    assert contributing_tree() == truth, "CONTRIBUTING.md's tree differs from src/sharnn/"
    for wing in WINGS:
        docstring = ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text()))
        named = {f"{name}.py" for name in re.findall(r":mod:`\.(\w+)`", docstring)}
        assert named == truth[wing], f"src/sharnn/{wing}/__init__.py lists {sorted(named)}"


# ----------------------------------------------------------------------------- the front page


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert not re.search(r"\b\d[\d,]* tests\b", readme), "test counts belong in docs/measurements.md"
    blocks = re.findall(r"^```bash\n(.*?)^```", readme, re.DOTALL | re.MULTILINE)
    lines = [line for block in blocks for line in block.splitlines()]
    installs = [line for line in lines if line.startswith("python3 -m pip install torch==")]
    assert len(installs) == 2 and installs[0].endswith("&& sharnn train --preset tiny")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert installs[1] in ci, "the README's test command is what CI runs"
