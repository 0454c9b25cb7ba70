"""Hostile models (issue 40): where a model comes from, and what a model may hold.

- every model that was ever the default stays in the package, found by the fingerprint
  its files record (``sharnn.models.shipped``): a test fails when the default's weights
  change without their old fingerprint staying resolvable, and the format-4 file written
  with the first default decodes with no ``--model``;
- a shipped name is the package's, never a folder of that name in the working folder;
- sizes are checked before anything is built: a ``config.json`` or ``config.yaml`` that
  claims another (a huge) model, extra tensors, a model past the memory limit;
- weights with NaN, infinities or huge values: one line in every command and precision;
- an unreadable shipped folder breaks only what names it.

Memory limits are real limits (``RLIMIT_AS``) in a subprocess, or a patched
:func:`sharnn.runtime.memory_limit` in process; nothing exhausts this machine's memory.
"""

from __future__ import annotations

import fnmatch
import json
import os
import pathlib
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

import sharnn
import sharnn.loading as loading
import sharnn.models.shipped as shipped_module
import sharnn.runtime as runtime
from helpers import SUBPROCESS_ENV, assert_ok, assert_user_error, cli, shared_run, single_thread, write_small_corpus
from sharnn.coding import codec
from sharnn.coding.container import read_header
from sharnn.coding.environment import cpu_features
from sharnn.errors import CheckpointError, ConfigError
from sharnn.models import build, exact, hub
from sharnn.models.build import meta_model, model_sha256, parameter_count
from sharnn.models.config import SHARNNConfig
from sharnn.models.hub import read_config_json, read_weights, write_files
from sharnn.models.integer_step import IntegerStep
from sharnn.models.shipped import DEFAULT_MODEL, DEFAULTS, SHIPPED, shipped_folder, shipped_names

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"

# Every fingerprint (model_sha256) that was ever the default's, oldest first. Append only:
# the files compressed with no --model record these, and must decode with no --model forever.
EVER_DEFAULT = (
    "5c87678a6026b22bbe0d4a29dfd7771d538be17834cf9b6d3840722ffd135b7d",  # wikipedia-2x512 until 2026-11-26
    "d708440ac85d148cc1d0b5b06a9cecf33dde4c7e79a4f59cd373093f9251e0f5",  # the enwik8-weighted 7,000 steps
)

TEXT = b"<page><title>Anarchism</title>\n<text>Anarchism is a political philosophy.</text>\n" * 3
BF16 = pytest.param(
    "bf16", marks=pytest.mark.skipif(not {"avx512_bf16", "amx_bf16"} & set(cpu_features()), reason="no bf16 CPU")
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory) -> Path:
    """The shared tiny run, exported (the Hub layout)."""
    folder = tmp_path_factory.mktemp("exported") / "tiny"
    with single_thread():
        assert_ok(cli("export", run_dir, "--out", folder))
    return folder


@pytest.fixture
def text(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    path.write_bytes(TEXT)
    return path


def _variant(exported: Path, folder: Path, change) -> Path:
    """A copy of ``exported`` whose weights are ``change(weights)`` (their SHA-256 recorded
    again, as a hostile writer would) or whose config.json is ``change(fields)``."""
    shutil.copytree(exported, folder)
    weights = {name: tensor.clone() for name, tensor in read_weights(exported).items()}
    fields = read_config_json(exported)
    changed = change(weights, fields)
    write_files(folder, fields if changed is None else changed, weights)
    return folder


def _set_query(value: float):
    def change(weights, fields):
        weights["blocks.0.attention.head.query.weight"][:] = value

    return change


# ----------------------------------------------------------------------------- every default stays


def test_every_fingerprint_that_was_ever_the_default_loads_from_the_package():
    """Fails when the default model's weights change without the old fingerprint staying
    resolvable: ship new weights under a new name, keep the old folder, append the new
    fingerprint to EVER_DEFAULT and the new name to DEFAULTS."""
    default = model_sha256(sharnn.load().model)
    assert default == EVER_DEFAULT[-1], (
        f"the default model's fingerprint is now {default}: keep the weights of {EVER_DEFAULT[-1]} in the "
        "package under a name of their own, and append the new fingerprint here and to shipped.DEFAULTS"
    )
    assert [SHIPPED[name] for name in DEFAULTS] == list(EVER_DEFAULT) and DEFAULTS[-1] == DEFAULT_MODEL
    for fingerprint in EVER_DEFAULT:
        assert model_sha256(loading.load_shipped(fingerprint, "a file")) == fingerprint


def test_every_shipped_folder_has_the_fingerprint_the_package_lists():
    """A shipped name stands for one set of weights: replaced weights under a kept name fail."""
    assert set(shipped_names()) == set(SHIPPED)
    for name, fingerprint in SHIPPED.items():
        assert model_sha256(loading.load_model(name)[0]) == fingerprint, name


def test_the_package_data_takes_every_file_of_every_shipped_folder():
    assert '"pretrained/*/*",' in (ROOT / "pyproject.toml").read_text()  # setuptools' glob: one folder deep
    package = ROOT / "src" / "sharnn"
    files = [p.relative_to(package) for p in (package / "pretrained").rglob("*") if p.is_file()]
    assert files and all(len(f.parts) == 3 and fnmatch.fnmatch(f.as_posix(), "pretrained/*/*") for f in files), files
    for name in SHIPPED:
        assert (package / "pretrained" / name / "model.safetensors").is_file()


@pytest.mark.slow  # five seconds of the integer step
def test_the_format_4_file_of_the_first_default_decodes_with_no_model(tmp_path):
    """tests/data/v4-shipped-v1.shz: written on an AMD EPYC (AVX2) under torch 2.13.0 with
    the first wikipedia-2x512, now wikipedia-2x512-v1, 3 streams, before adaptive mixing."""
    blob = (DATA / "v4-shipped-v1.shz").read_bytes()
    header = read_header(blob)[0]
    assert int.from_bytes(blob[8:10], "little") == 4 and header.portable and header.mixing is None
    assert header.model_sha256 == SHIPPED["wikipedia-2x512-v1"] == EVER_DEFAULT[0]
    assert_ok(cli("decompress", DATA / "v4-shipped-v1.shz", "-o", tmp_path / "back.txt", "--quiet"))
    assert (tmp_path / "back.txt").read_bytes() == (DATA / "v4-shipped-v1.txt").read_bytes()


def test_a_fingerprint_loads_only_the_model_that_has_it(monkeypatch):
    loaded = []
    real = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda name, **kw: loaded.append(name) or real(name, **kw))
    model = loading.load_shipped(SHIPPED["wikipedia-2x512-v1"], "old.shz")
    assert loaded == ["wikipedia-2x512-v1"] and model_sha256(model) == SHIPPED["wikipedia-2x512-v1"]


def test_a_file_of_no_shipped_model_is_refused_naming_the_shipped_ones():
    with pytest.raises(CheckpointError) as error:
        loading.load_shipped("0" * 64, "mine.shz")
    message = str(error.value)
    assert "mine.shz was compressed with a model that is not shipped (sha256 0000000000000000..." in message
    assert "wikipedia-2x512-v1" in message and message.endswith("give it with --model")


# ----------------------------------------------------------------------------- a shipped name is the package's


@pytest.fixture
def two_defaults(run_dir, exported, tmp_path, monkeypatch) -> tuple[Path, Path]:
    """Shipped models in a patched root (the tiny export under the default's name), and a
    folder of the default's name in the working folder holding another model (collapsed)."""
    root = tmp_path / "pretrained"
    shutil.copytree(exported, root / DEFAULT_MODEL)
    monkeypatch.setattr(shipped_module, "shipped_root", lambda: root)
    work = tmp_path / "work"
    work.mkdir()
    with single_thread():
        assert_ok(cli("export", run_dir, "--out", work / DEFAULT_MODEL, "--collapse"))
    monkeypatch.chdir(work)
    return root / DEFAULT_MODEL, work / DEFAULT_MODEL


def _fingerprint(path: Path) -> str:
    return read_header(path.read_bytes())[0].model_sha256


def test_a_folder_of_the_default_s_name_in_the_working_folder_does_not_hide_it(two_defaults, text):
    shipped, own = two_defaults
    expected, theirs = (model_sha256(loading.load_model(p.absolute())[0]) for p in (shipped, own))
    assert expected != theirs
    with single_thread():
        assert_ok(cli("compress", text, "-o", "default.shz", "--quiet"))
        assert_ok(cli("compress", text, "-o", "named.shz", "--model", DEFAULT_MODEL, "--quiet"))
        assert_ok(cli("compress", text, "-o", "own.shz", "--model", f"./{DEFAULT_MODEL}", "--quiet"))
    assert _fingerprint(Path("default.shz")) == _fingerprint(Path("named.shz")) == expected
    assert _fingerprint(Path("own.shz")) == theirs
    assert model_sha256(sharnn.load().model) == model_sha256(sharnn.load(Path(DEFAULT_MODEL)).model) == expected
    assert model_sha256(sharnn.load(f"./{DEFAULT_MODEL}").model) == theirs


def test_decompress_finds_the_shipped_model_and_not_the_working_folder_s(two_defaults, text):
    with single_thread():
        assert_ok(cli("compress", text, "-o", "default.shz", "--quiet"))
        assert_ok(cli("decompress", "default.shz", "-o", "back.txt", "--quiet"))
        line = assert_user_error(cli("decompress", "default.shz", "-o", "no.txt", "--model", f"./{DEFAULT_MODEL}"))
    assert Path("back.txt").read_bytes() == TEXT
    assert "this is not the model it was compressed with" in line and not Path("no.txt").exists()


def test_info_of_a_shipped_name_describes_the_package_s_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT_MODEL).mkdir()  # a user's own (empty) folder of that name
    result = cli("info", DEFAULT_MODEL)
    assert_ok(result)
    assert f"exported model {shipped_folder(DEFAULT_MODEL)}" in result.stdout
    assert_user_error(cli("info", f"./{DEFAULT_MODEL}"), f"{DEFAULT_MODEL} is a folder without config.yaml")


# ----------------------------------------------------------------------------- sizes before anything is built


def _huge(weights, fields):
    return fields | {"d_model": 50_000, "boom_dim": 50_000}


@pytest.mark.parametrize("command", ["compress", "generate", "eval"])
def test_a_config_json_claiming_a_huge_model_is_refused_before_it_is_built(exported, tmp_path, text, command):
    huge = _variant(exported, tmp_path / "huge", _huge)
    args = {
        "compress": ["compress", text, "-o", tmp_path / "out.shz", "--model", huge],
        "generate": ["generate", huge, "--max-bytes", "4"],
        "eval": ["eval", huge, "--file", text],
    }[command]
    assert_user_error(cli(*args), f"{huge} does not match its config: size mismatch for", "[256, 50000]")
    assert not (tmp_path / "out.shz").exists()


def test_a_checkpoint_whose_config_yaml_claims_other_sizes_is_refused(run_dir, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(run_dir / "best", checkpoint)
    config = (checkpoint / "config.yaml").read_text()
    wider = config.replace("d_model: 32", "d_model: 64").replace("boom_dim: 64", "boom_dim: 128")
    (checkpoint / "config.yaml").write_text(wider)
    assert_user_error(cli("generate", checkpoint, "--max-bytes", "4"), "does not match its config: size mismatch")


def test_weights_with_an_extra_tensor_are_refused(exported, tmp_path):
    def extra(weights, fields):
        weights["smuggled.weight"] = torch.zeros(4, 4)

    folder = _variant(exported, tmp_path / "extra", extra)
    assert_user_error(cli("generate", folder, "--max-bytes", "4"), "Unexpected key(s): smuggled.weight")


@pytest.mark.parametrize(
    "change",
    [{"n_layers": 1_000_000}, {"n_layers": 10**30}, {"d_model": 10**30, "boom_dim": 10**30}, {"boom_dim": 10**30},
     {"vocab_size": 10**30}, {"architecture": "transformer", "attention_span": 10**30, "n_heads": 1}],
    ids=["a-million-layers", "n_layers", "d_model", "boom_dim", "vocab_size", "attention_span"],
)  # fmt: skip
def test_a_config_json_claiming_a_huge_model_is_refused_in_one_line(exported, tmp_path, change):
    huge = _variant(exported, tmp_path / "huge", lambda weights, fields: fields | change)
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(huge))}") as error:
        loading.load_model(huge)
    assert "does not match its config" in str(error.value) or "is too large" in str(error.value)
    assert len(str(error.value).splitlines()) == 1


def test_a_config_of_more_blocks_than_the_weights_is_refused_on_the_counts(exported, run_dir, tmp_path, monkeypatch):
    """Counted by arithmetic, nothing built: a million blocks took 90 s on the meta device, then std::bad_alloc."""
    monkeypatch.setattr(loading, "meta_model", lambda config: pytest.fail(f"built {config.n_layers:,} blocks"))
    more = _variant(exported, tmp_path / "more", lambda weights, fields: fields | {"n_layers": 1_000_000})
    line = assert_user_error(cli("generate", more, "--max-bytes", "4"), f"{more} does not match its config: it makes ")
    held = read_weights(exported)
    assert "12,000,015 tensors of" in line  # the shared run's 2 blocks, one with attention, times 500,000
    assert f"model.safetensors holds {len(held)} of {sum(t.numel() for t in held.values()):,}" in line
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(run_dir / "best", checkpoint)
    config = (checkpoint / "config.yaml").read_text()
    (checkpoint / "config.yaml").write_text(config.replace("n_layers: 2", "n_layers: 1000000"))
    assert_user_error(cli("generate", checkpoint, "--max-bytes", "4"), f"{checkpoint} does not match its config")


def test_training_a_million_layers_is_refused_by_arithmetic(monkeypatch):
    monkeypatch.setattr(build, "meta_model", lambda config: pytest.fail("built on the meta device"))
    with pytest.raises(ConfigError, match=r"training a model of .* parameters needs at least"):
        runtime.check_model_memory(SHARNNConfig(n_layers=1_000_000), runtime.TRAINING_BYTES_PER_PARAMETER, "training")


VARIANTS = [
    {},
    {"cell": "ln_lstm"},
    {"value_gate": "vector"},
    {"feed_forward": "mlp"},
    {"collapsed": True},
    {"attention": "all"},
    {"attention": "none"},
    {"attention": [0, 2], "cell": "ln_lstm", "feed_forward": "mlp", "value_gate": "vector"},
    {"architecture": "transformer", "n_heads": 2},
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{k}={v[k]}" for k in v) or "paper")
def test_the_arithmetic_counts_the_tensors_the_model_makes(variant):
    config = SHARNNConfig(vocab_size=300, d_model=8, boom_dim=16, n_layers=3, attention_span=10, **variant)
    weights = meta_model(config).state_dict()
    assert config.weight_sizes() == (len(weights), sum(t.numel() for t in weights.values()))
    assert parameter_count(config) == meta_model(config).num_parameters()


def test_a_model_past_the_memory_limit_is_refused_before_it_is_built(exported, monkeypatch):
    built = []
    monkeypatch.setattr(runtime, "memory_limit", lambda: (100_000, "a test's limit"))
    monkeypatch.setattr(loading, "load_pretrained", lambda *a, **k: built.append(a))
    line = assert_user_error(cli("generate", exported, "--max-bytes", "4"), f"loading {exported} (", "a test's limit")
    assert "needs at least" in line and not built


def test_an_allocation_that_fails_all_the_same_is_one_line(exported, monkeypatch):
    def allocate(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: 4 GB")

    monkeypatch.setattr(loading, "load_pretrained", allocate)
    assert_user_error(cli("generate", exported, "--max-bytes", "4"), f"loading {exported} ran out of memory")


def test_another_runtime_error_while_loading_is_not_taken_for_memory(exported, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(loading, "load_pretrained", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        loading.load_model(exported)


def _limited(gib: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))

    return limit


@pytest.mark.slow  # real processes under a memory limit
def test_under_a_memory_limit_a_huge_model_is_one_line_and_nothing_is_left(exported, tmp_path, text):
    huge = _variant(exported, tmp_path / "huge", _huge)
    data = write_small_corpus(tmp_path / "small.txt", 20_000)
    commands = {
        "compress": (["compress", text, "-o", tmp_path / "out.shz", "--model", huge], "does not match its config"),
        "train": (
            ["train", "--preset", "tiny", "--out", tmp_path / "run", "model.d_model=50000", "model.boom_dim=50000",
             f"data={data}"],
            "needs at least",
        ),
    }  # fmt: skip
    for args, fragment in commands.values():
        done = subprocess.run(
            [sys.executable, "-m", "sharnn", *map(str, args)],
            capture_output=True,
            text=True,
            env=SUBPROCESS_ENV,
            preexec_fn=_limited(4),
            timeout=300,
        )
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1 and fragment in done.stderr, done.stderr
    assert "address-space limit (ulimit -v) (4.0 GiB)" in done.stderr  # the train line names the limit
    assert not (tmp_path / "out.shz").exists() and not (tmp_path / "run").exists()


def test_the_memory_limit_is_the_smallest_of_the_machine_s_and_the_process_s():
    limit, what = runtime.memory_limit()
    assert 0 < limit <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") and what
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    assert soft == resource.RLIM_INFINITY or limit <= soft


# ----------------------------------------------------------------------------- weights that are not numbers


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("command", ["integer", "fp32", BF16, "generate", "eval"])
def test_weights_that_are_not_finite_are_refused_in_one_line(exported, tmp_path, text, value, command):
    broken = _variant(exported, tmp_path / "broken", _set_query(value))
    if command in ("generate", "eval"):
        args = [command, broken, *(["--max-bytes", "4"] if command == "generate" else ["--file", text])]
    else:
        args = ["compress", text, "-o", tmp_path / "out.shz", "--model", broken, "--precision", command, "--quiet"]
    assert_user_error(cli(*args), "the weight blocks.0.attention.head.query.weight holds NaN or infinite values")
    assert not (tmp_path / "out.shz").exists()


@pytest.mark.parametrize("precision", ["fp32", BF16])
def test_weights_too_large_for_float_arithmetic_are_one_line(exported, tmp_path, text, precision):
    huge = _variant(exported, tmp_path / "huge", _set_query(1e30))
    line = assert_user_error(
        cli("compress", text, "-o", tmp_path / "out.shz", "--model", huge, "--precision", precision, "--quiet"),
        "the model's predictions are not numbers (NaN or infinity)",
    )
    assert "nothing was written" in line and not (tmp_path / "out.shz").exists()
    assert_user_error(cli("generate", huge, "--max-bytes", "8"), "the model's predictions are not numbers")


def test_the_codec_refuses_a_model_built_in_python_with_nan_weights(exported):
    model = loading.load_model(exported)[0]
    with torch.no_grad():
        model.blocks[0].attention.head.query.weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"the model: the weight blocks\.0\.attention\.head\.query\.weight"):
        codec.compress(TEXT, model)


def _scaled(factor: float):
    def change(weights, fields):
        for tensor in weights.values():
            tensor *= factor

    return change


@pytest.mark.parametrize("factor", [1e37, 1e30, 1e20])
def test_weights_out_of_the_integer_step_s_range_are_refused_at_load(exported, tmp_path, text, factor):
    """Every weight times 1e37: finite, but decimal.Overflow in the value gate's constants;
    past that, infinities in the kernels, then NaN turned to table indices (a crash)."""
    huge = _variant(exported, tmp_path / "huge", _scaled(factor))
    line = assert_user_error(
        cli("compress", text, "-o", tmp_path / "out.shz", "--model", huge, "--quiet"),
        f"{huge / 'model.safetensors'}: the weights are out of the range the integer step represents: ",
        "could reach",
    )
    assert "unforeseen" not in line and not (tmp_path / "out.shz").exists()


@pytest.mark.parametrize("change", ["query-1e30", "all-1e10"])
def test_the_integer_step_codes_with_weights_too_large_for_floats(exported, tmp_path, text, change):
    """The right result: the integer step scales every row of weights, so a query of 1e30
    codes, and every weight times 1e10 (the shared tiny model's bounds allow about 1e12)."""
    large = _variant(exported, tmp_path / "large", _set_query(1e30) if change == "query-1e30" else _scaled(1e10))
    with single_thread():
        assert_ok(cli("compress", text, "-o", tmp_path / "out.shz", "--model", large, "--quiet"))
        assert_ok(cli("decompress", tmp_path / "out.shz", "-o", tmp_path / "back.txt", "--model", large, "--quiet"))
    assert (tmp_path / "back.txt").read_bytes() == TEXT


def test_the_integer_step_refuses_a_model_built_in_python_out_of_its_range(exported):
    model = loading.load_model(exported)[0]
    with torch.no_grad():
        model.blocks[0].feed_forward.ln_xff.weight.mul_(1e37)
    with pytest.raises(CheckpointError, match=r"^the model: the weights are out of the range the integer step"):
        IntegerStep(model, streams=1)


def test_the_exact_sigmoid_and_tanh_of_any_float_are_their_limits_far_out():
    assert exact.scalar_sigmoid(-1e37) == 0.0 and exact.scalar_sigmoid(3e38) == 1.0
    assert exact.scalar_tanh(-1e37) == -1.0 and exact.scalar_tanh(1e30) == 1.0
    assert exact.scalar_sigmoid(-744.0) == 1e-323 and exact.scalar_sigmoid(36.0) == 0.9999999999999998  # unclamped


# ----------------------------------------------------------------------------- an unreadable shipped folder


@pytest.fixture
def locked_root(exported, tmp_path, monkeypatch) -> Path:
    """Shipped models in a patched root: ``tiny`` readable, ``locked`` not (mode 000; as
    root, whom permissions do not stop, its paths' stat raises what they would raise)."""
    root = tmp_path / "pretrained"
    shutil.copytree(exported, root / "tiny")
    shutil.copytree(exported, root / "locked")
    monkeypatch.setattr(shipped_module, "shipped_root", lambda: root)
    (root / "locked").chmod(0)
    if os.geteuid() == 0:
        real = pathlib.Path.stat

        def stat(self, *args, **kwargs):
            if (root / "locked") in self.parents:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(pathlib.Path, "stat", stat)
    yield root
    (root / "locked").chmod(0o755)


def test_an_unreadable_shipped_folder_breaks_only_what_names_it(locked_root):
    assert shipped_names() == ["tiny"]
    result = cli("info")
    assert_ok(result)
    assert "shipped models: tiny" in result.stdout
    assert_ok(cli("info", "tiny"))  # the shipped tiny: only its folder is looked at
    assert_ok(cli("generate", "tiny", "--max-bytes", "4"))
    assert_user_error(cli("generate", "locked", "--max-bytes", "4"), f"cannot read {locked_root / 'locked'}", "denied")


def test_an_unreadable_root_of_shipped_models_leaves_the_presets(monkeypatch, tmp_path):
    root = tmp_path / "pretrained"
    root.mkdir()
    monkeypatch.setattr(shipped_module, "shipped_root", lambda: root)
    real = pathlib.Path.iterdir

    def iterdir(self):
        if self == root:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "iterdir", iterdir)
    assert shipped_names() == []
    result = cli("info", "tiny")
    assert_ok(result)
    assert "d_model" in result.stdout


def test_a_name_with_a_folder_separator_is_never_a_shipped_model():
    assert shipped_folder(f"./{DEFAULT_MODEL}") is None and shipped_folder("..") is None
    assert shipped_folder(DEFAULT_MODEL) is not None and shipped_folder(f"{DEFAULT_MODEL}/") is None


def test_model_loading_needs_nothing_of_the_training_wing_s_checkpoints():
    """`sharnn.api` loads every command's model through sharnn.loading; the old names of
    sharnn.training.checkpoint are the same functions."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys, sharnn.api; print('sharnn.training.checkpoint' in sys.modules)"],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=300,
    )
    assert done.stdout.split() == ["False"], done.stderr
    from sharnn.training import checkpoint

    assert checkpoint.load_model is loading.load_model and checkpoint.resolve is loading.resolve
    assert json.loads(json.dumps(SHIPPED)) == SHIPPED  # plain names and hex digests


# ----------------------------------------------------------------------------- a weights file the system will not give


def _refused(file, *args, **kwargs):
    raise RuntimeError(f"unable to open file <{file}> in read-only mode: Too many open files (24)")


@pytest.mark.parametrize("where", ["check_sizes", "read_weights", "load_weights"])
def test_a_weights_file_the_system_refuses_is_one_line_naming_it(exported, run_dir, monkeypatch, where):
    """What safetensors raises when torch cannot map the file (as with ulimit -n 5)."""
    module, name, folder = {
        "check_sizes": (loading, "safe_open", exported),
        "read_weights": (hub, "safe_open", exported),
        "load_weights": (loading, "load_file", (run_dir / "best").resolve()),
    }[where]
    monkeypatch.setattr(module, name, _refused)
    with pytest.raises(CheckpointError, match=f"^cannot read {re.escape(str(folder / 'model.safetensors'))}: Too many"):
        loading.load_model(folder)
    line = assert_user_error(cli("generate", folder, "--max-bytes", "4"), "model.safetensors: Too many open files")
    assert "unforeseen" not in line


@pytest.mark.parametrize(
    "error",
    [SafetensorError("Error while deserializing header: header too large"), OSError(5, "Input/output error")],
    ids=["corrupt", "io"],
)
def test_what_else_safetensors_raises_reading_weights_is_one_line(exported, monkeypatch, error):
    def raising(*args, **kwargs):
        raise error

    monkeypatch.setattr(loading, "safe_open", raising)
    expected = "is missing or corrupt (Error while deserializing" if "header" in str(error) else ": Input/output error"
    assert_user_error(cli("generate", exported, "--max-bytes", "4"), "model.safetensors", expected)


# After its imports, a process left one free file descriptor (what ulimit -n 5 leaves here):
# safetensors opens the weights with it, and torch's mapping of the file finds none.
ONE_DESCRIPTOR_LEFT = """
import os, resource, sys
import sharnn.api
from sharnn.cli import main
free = os.dup(0)
os.close(free)
resource.setrlimit(resource.RLIMIT_NOFILE, (free + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
main(sys.argv[1:], prog_name="sharnn")
"""


@pytest.mark.slow  # real processes
def test_with_too_few_file_descriptors_loading_is_one_line(exported, run_dir):
    """The limit is set after the imports: set before (preexec_fn, ulimit -n), the window
    between a Python that cannot start and one that reads the weights is one descriptor
    wide, where the interpreter's own descriptors put it (5 here)."""
    for model, file in ((exported, exported), (run_dir, (run_dir / "best").resolve()), (DEFAULT_MODEL, None)):
        file = (file or shipped_folder(DEFAULT_MODEL)) / "model.safetensors"
        done = subprocess.run(
            [sys.executable, "-c", ONE_DESCRIPTOR_LEFT, "generate", str(model), "--max-bytes", "4"],
            capture_output=True,
            text=True,
            env=SUBPROCESS_ENV,
            timeout=300,
        )
        assert done.returncode == 1 and done.stderr.splitlines() == [f"error: cannot read {file}: Too many open files"]
