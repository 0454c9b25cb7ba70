"""Hostile input: configs built to hang or crash the loader (alias bombs, deep nesting,
huge values), folders whose files lie, the ablation harness's outputs and extra, and the
Python API's arguments. Each ends in one short line and a non-zero exit (an exception
naming the argument, from Python), never a traceback, a hang or a silently wrong answer."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ablations as ab  # benchmarks/ablations.py, through pyproject's pythonpath
import sharnn
from helpers import SUBPROCESS_ENV, assert_ok, assert_user_error, cli, shared_run
from sharnn.commands.arguments import check_count
from sharnn.config import TrainConfig, load_config
from sharnn.config_check import shown
from sharnn.errors import ConfigError
from sharnn.models.config import SHARNNConfig

ROOT = Path(__file__).resolve().parent.parent
SHORT = 200  # no config error line is longer than this, whatever the value given


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished SMALL run (read only)."""
    return shared_run(tmp_path_factory)


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, symlinks=True)
    return copy


# ----------------------------------------------------------------------------- configs


def billion_laughs(path: Path) -> Path:
    """A YAML file of 9 levels of 9 aliases each (9^9 leaves once expanded), under a real key."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for previous, name in zip("abcdefgh", "bcdefghi"):
        key = "lr_halve_epochs" if name == "i" else name
        lines.append(f"{key}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_yaml_alias_bomb_is_refused_not_expanded(tmp_path):
    bomb = billion_laughs(tmp_path / "bomb.yaml")
    assert_user_error(cli("info", bomb), "bomb.yaml, line 2", "YAML aliases (*name) are not allowed")
    result = cli("train", "--config", bomb, "--out", tmp_path / "run")
    assert_user_error(result, "YAML aliases (*name) are not allowed")
    assert not (tmp_path / "run").exists()
    merge = tmp_path / "merge.yaml"  # a merge key is an alias too
    merge.write_text("base: &base {d_model: 32}\nmodel:\n  <<: *base\n")
    assert_user_error(cli("info", merge), "YAML aliases")


def test_an_alias_bomb_in_an_override_is_refused():
    bomb = "betas=[&a [1,1,1,1,1,1,1,1,1], [*a,*a,*a,*a,*a,*a,*a,*a,*a], [*a,*a,*a,*a,*a,*a,*a,*a,*a]]"
    line = assert_user_error(cli("info", "tiny", bomb), "betas")
    assert len(line) < SHORT


def test_yaml_nested_20000_deep_is_refused_without_a_recursion_error(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("model: " + "[" * 20_000 + "]" * 20_000 + "\n")
    assert_user_error(cli("info", deep), "deep.yaml, line 1", "nested more than")
    with pytest.raises(ConfigError, match="nested more than"):
        load_config(deep)
    line = assert_user_error(cli("info", "tiny", "model.cell=" + "[" * 3000 + "]" * 3000), "override")
    assert len(line) < SHORT


def test_a_config_file_over_a_megabyte_is_refused_before_it_is_parsed(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"model:\n  cell: " + b"x" * (10 << 20) + b"\n")
    line = assert_user_error(cli("info", big), "big.yaml is over 1 MB")
    assert len(line) < SHORT


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("model.cell=" + "x" * (10 << 20), "model.cell must be one of lstm, ln_lstm, got 'xxxx"),
        ("model.attention=" + "y" * 100_000, "model.attention must be 'none'"),
        ("optimizer=" + "z" * 100_000, "optimizer must be one of"),
        ("precision=" + "z" * 100_000, "precision must be one of"),
        ("lr=" + "z" * 100_000, "lr must be a number"),
        ("bptt=" + "z" * 100_000, "bptt must be an integer"),
        ("bptt_jitter=" + "z" * 100_000, "bptt_jitter"),
        ("model=" + "z" * 100_000, "model must be a mapping"),
        ("q" * 100_000 + "=1", "unknown config key 'qqqq"),
        ("q" * 100_000, "must look like key=value"),
        ("seed=" + "9" * 5000, "seed"),
        ("model.d_model=" + "9" * 5000, "model.d_model"),
        ("lr_halve_epochs=[" + ",".join(["0"] * 5000) + "]", "lr_halve_epochs are 1-based"),
    ],
    ids=lambda value: value[:24],
)
def test_a_config_error_quotes_a_few_dozen_characters_of_any_value(override, fragment):
    line = assert_user_error(cli("info", "tiny", override), fragment)
    assert len(line) < SHORT, line[:300]


def test_an_error_in_python_quotes_a_few_dozen_characters_too():
    for config in (
        SHARNNConfig(cell="x" * 100_000),
        SHARNNConfig(d_model=10**5000),
        SHARNNConfig(attention=list(range(5_000))),  # thousands of characters quoted: enough to see
        TrainConfig(betas=[2.0] * 5_000),
        TrainConfig(optimizer="o" * 100_000),
    ):
        with pytest.raises(ConfigError) as raised:
            config.validate()
        assert len(str(raised.value)) < SHORT, str(raised.value)[:300]
    assert shown("abc") == "'abc'" and shown([1, 2]) == "[1, 2]"  # short values as they were
    assert shown("x" * 1000).endswith("... (1,000 characters)") and len(shown("x" * 1000)) < 80


def test_n_heads_must_be_positive_for_the_sha_rnn_too():
    assert_user_error(cli("info", "tiny", "model.n_heads=-3"), "model.n_heads must be >= 1, got -3")
    with pytest.raises(ConfigError, match=r"model\.n_heads must be >= 1"):
        SHARNNConfig(n_heads=0).validate()


def test_info_of_a_model_too_large_to_count_is_one_line():
    line = assert_user_error(
        cli("info", "tiny", "model.d_model=3000000000", "model.boom_dim=6000000000"),
        "model.d_model=3000000000",
        "too large",
    )
    assert "model.boom_dim=6000000000" in line
    with pytest.raises(ConfigError, match="too large"):
        sharnn.info("tiny", ["model.vocab_size=4611686018427387904"])


# ----------------------------------------------------------------------------- folders that lie


def test_info_of_a_run_whose_config_yaml_is_empty_refuses(run_dir, tmp_path):
    run = copy_run(run_dir, tmp_path)
    (run / "config.yaml").write_text("")
    assert_user_error(cli("info", run), "config.yaml is empty")
    (run / "config.yaml").write_text("{}\n")
    assert_user_error(cli("info", run), "config.yaml is empty")
    checkpoint = (run / "best").resolve() / "config.yaml"
    checkpoint.write_text("# nothing\n")
    assert_user_error(cli("info", run / "best"), "config.yaml is empty")
    line = assert_user_error(cli("eval", run / "best", "--device", "cpu"), "config.yaml is empty")
    assert line.count(str(checkpoint)) == 1, line  # the file named once


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "exported"
    assert_ok(cli("export", run_dir, "--out", out))
    return out


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        ("{}", "training.json has no 'step'"),
        ("[]", "training.json holds a JSON list"),
        ("[1, 2]", "holds a JSON list"),
        ('"text"', "holds a JSON str"),
        ('{"step": 4}', "has no 'epochs'"),
        ('{"step": "4", "epochs": 1.0}', "step must be an integer, got '4'"),
        ('{"step": 4, "epochs": null}', "epochs must be a number, got None"),
        ('{"step": 4, "epochs": 1.0, "test_bpc": "x"}', "test_bpc must be a number"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
    ],
    ids=lambda value: value[:24],
)
def test_info_of_an_export_whose_training_json_lies_refuses(exported, tmp_path, record, fragment):
    copy = tmp_path / "exported"
    shutil.copytree(exported, copy)
    (copy / "training.json").write_text(record)
    line = assert_user_error(cli("info", copy), "training.json", fragment)
    assert len(line) < SHORT + len(str(copy))


def test_info_of_an_export_with_a_true_record_still_shows_its_scores(exported):
    result = cli("info", exported)
    assert_ok(result)
    assert "exported model" in result.stdout and "step " in result.stdout


# ----------------------------------------------------------------------------- the ablation harness


def test_ablations_refuses_unwritable_outputs_before_any_work(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("mine\n")
    for options, fragment in (
        (["--report", "--json", str(tmp_path / "missing" / "out.json")], "no folder"),
        (["--report", "--markdown", str(tmp_path / "missing" / "t.md")], "no folder"),
        (["--report", "--plot", str(tmp_path)], "is a folder"),
        (["--out", str(a_file)], "is not a folder"),
        (["--out", str(a_file / "sub")], "is not a folder"),
        (["--report", "--out", str(a_file)], "is not a folder"),
    ):
        assert ab.main(["--grid", str(ROOT / "benchmarks" / "ablations.yaml"), *options]) == 2, options
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("error: ") and fragment in line, line
    assert a_file.read_text() == "mine\n" and not (tmp_path / "missing").exists()


@pytest.mark.slow
def test_ablations_without_scipy_names_the_extra(tmp_path):
    (tmp_path / "scipy.py").write_text("raise ModuleNotFoundError(\"No module named 'scipy'\", name='scipy')\n")
    env = {**SUBPROCESS_ENV, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ablations.py"), "--help"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: scipy is missing") and 'pip install -e ".[bench]"' in line


def test_the_bench_extra_lists_what_benchmarks_import():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    bench = {r.split(">")[0].split("=")[0] for r in extras["bench"]}
    assert {"scipy", "zstandard"} <= bench
    assert "sharnn[bench]" in extras["test"]
    assert '".[bench]"' in (ROOT / "benchmarks" / "README.md").read_text()


# ----------------------------------------------------------------------------- the Python API


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_tokens": -1}, "max_tokens must be an integer >= 0, got -1"),
        ({"max_tokens": 2.5}, "max_tokens must be an integer >= 0, got 2.5"),
        ({"max_tokens": True}, "max_tokens must be an integer"),
        ({"temperature": "hot"}, "temperature must be a number, got 'hot'"),
        ({"top_k": 1.5}, "top_k must be an integer"),
        ({"top_p": "all"}, "top_p must be a number"),
        ({"seed": 2**64}, "seed must be an integer"),
        ({"seed": "7"}, "seed must be an integer"),
        ({"prompt": 42}, "prompt must be text (str) or bytes, got 42"),
        ({"prompt": ["a"]}, "prompt must be text"),
        ({"device": "nonsense"}, "unknown device 'nonsense'"),
        ({"device": 3}, "device must be"),
        ({"fast_path": "maybe"}, "fast_path must be one of"),
    ],
)
def test_generate_text_checks_its_arguments_at_the_call(run_dir, kwargs, fragment):
    with pytest.raises(ConfigError) as raised:
        sharnn.generate_text(run_dir, **kwargs)
    assert fragment in str(raised.value)


def test_generate_text_with_zero_tokens_gives_the_prompt_alone(run_dir):
    assert list(sharnn.generate_text(run_dir, "Hi", max_tokens=0, device="cpu")) == []


def test_load_refuses_an_unknown_device(run_dir):
    with pytest.raises(ConfigError, match="unknown device 'nonsense'"):
        sharnn.load(run_dir, device="nonsense")
    with pytest.raises(ConfigError, match="device must be"):
        sharnn.load(run_dir, device=None)
    assert sharnn.load(run_dir, device="auto").model is not None


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"streams": -1}, "streams must be an integer >= 1 or None, got -1"),
        ({"streams": 0}, "streams must be an integer >= 1"),
        ({"streams": True}, "streams must be an integer >= 1"),
        ({"streams": "4"}, "streams must be an integer >= 1"),
        ({"bptt": 2.5}, "bptt must be an integer >= 1"),
        ({"device": "nonsense"}, "unknown device"),
        ({"fast_path": 1}, "fast_path must be one of"),
    ],
)
def test_evaluate_checkpoint_checks_its_arguments_before_loading(run_dir, kwargs, fragment):
    with pytest.raises(ConfigError) as raised:
        sharnn.evaluate_checkpoint(run_dir, quiet=True, **kwargs)
    assert fragment in str(raised.value)


def test_info_and_train_run_refuse_overrides_given_as_one_string(tmp_path):
    with pytest.raises(ConfigError, match="overrides must be a list"):
        sharnn.info("tiny", "model.d_model=64")
    with pytest.raises(ConfigError, match="overrides must be a list"):
        sharnn.train_run("tiny", overrides="max_steps=1", out=tmp_path / "run")
    with pytest.raises(ConfigError, match="out must be a path"):
        sharnn.train_run("tiny", out=3)
    assert not (tmp_path / "run").exists()


def test_check_count_is_the_one_check_of_counts():
    assert check_count("threads", 2, 1) == 2
    assert check_count("streams", None, 1, optional=True) is None
    for value in ("4", 2.5, True, None, 0):
        with pytest.raises(ConfigError, match=r"must be an integer >= 1"):
            check_count("threads", value, 1)
    with pytest.raises(ConfigError, match="threads must be an integer >= 1 and <= 1024, got 2000"):
        check_count("threads", 2000, 1, 1024)
