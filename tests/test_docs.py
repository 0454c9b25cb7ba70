"""The commands the documentation shows still parse: every ``sharnn ...`` command (also
after ``srun`` or torchrun's ``-m``) of a fenced ``bash`` block of README.md and docs/*.md is
parsed against the real click command tree, without running anything: the subcommands
must exist, every option must be one the command has, and a command's arguments must be
as many as it takes. ``key=value`` overrides of ``sharnn train`` must name settings.
"""

from __future__ import annotations

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
