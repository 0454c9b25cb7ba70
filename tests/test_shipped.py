"""A model shipped inside the package (src/sharnn/models/shipped.py; docs/pretrained.md):
named wherever a checkpoint is asked for, and the default wherever a model is optional
(generate, eval, compress, decompress, ``sharnn.load()``), listed by ``sharnn info``;
``sharnn export --storage bf16`` that writes such a folder at half the size.

The mechanism is tested with a tiny exported run put where the shipped models are
(``shipped_root`` patched), so that it holds whatever the real shipped model is; the real
one's own checks (its size, fingerprint, card) are at the end.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors import safe_open

import sharnn
import sharnn.models.shipped as shipped_module
from helpers import assert_ok, assert_user_error, cli, shared_run, single_thread
from sharnn.models.build import model_sha256
from sharnn.models.shipped import DEFAULT_MODEL, shipped_folder, shipped_names
from sharnn.training.checkpoint import load_model


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def shipped_root(run_dir, tmp_path_factory):
    """A folder of shipped models holding the shared tiny run exported in bf16 under the
    default model's name, and collapsed in fp32 under another name."""
    root = tmp_path_factory.mktemp("pretrained")
    with single_thread():
        assert_ok(cli("export", run_dir, "--out", root / DEFAULT_MODEL, "--storage", "bf16"))
        assert_ok(cli("export", run_dir, "--out", root / "tiny-fp32", "--collapse"))
    return root


@pytest.fixture
def shipped(shipped_root, monkeypatch):
    monkeypatch.setattr(shipped_module, "shipped_root", lambda: shipped_root)
    return shipped_root


def test_bf16_storage_halves_the_file_and_loads_as_the_rounded_fp32_model(shipped, run_dir):
    bf16, fp32 = shipped / DEFAULT_MODEL / "model.safetensors", shipped / "tiny-fp32" / "model.safetensors"
    with safe_open(bf16, "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118 (not iterable)
    assert bf16.stat().st_size < 0.55 * fp32.stat().st_size  # that one is collapsed: smaller still
    rounded, _ = load_model(shipped / DEFAULT_MODEL)
    full, _ = load_model(run_dir)
    for (name, a), b in zip(rounded.state_dict().items(), full.state_dict().values()):
        assert a.dtype == torch.float32, name
        assert torch.equal(a, b.to(torch.bfloat16).float()), name  # the fp32 weights, rounded once
    assert "stored in bfloat16" in (shipped / DEFAULT_MODEL / "README.md").read_text()


def test_export_refuses_an_unknown_storage(run_dir, tmp_path):
    assert_user_error(cli("export", run_dir, "--out", tmp_path / "m", "--storage", "int4"), "--storage")
    with pytest.raises(sharnn.errors.ConfigError, match="storage must be one of fp32, bf16"):
        sharnn.export.export(run_dir, tmp_path / "m", storage="fp16")
    assert not (tmp_path / "m").exists()


def test_info_lists_the_shipped_models_and_describes_one_by_name(shipped):
    result = cli("info")
    assert_ok(result)
    assert f"shipped models: tiny-fp32, {DEFAULT_MODEL} (default)" in result.stdout
    result = cli("info", DEFAULT_MODEL)
    assert_ok(result)
    assert "exported model" in result.stdout and "step 12" in result.stdout


def test_generate_and_load_use_the_default_model_when_none_is_named(shipped):
    named = cli("generate", DEFAULT_MODEL, "--prompt", "The ", "--max-bytes", "24", "--seed", "3")
    default = cli("generate", "--prompt", "The ", "--max-bytes", "24", "--seed", "3")
    assert_ok(default)
    assert default.stdout == named.stdout and default.stdout.startswith("The ")
    model, config, tokenizer = sharnn.load()
    assert model_sha256(model) == model_sha256(load_model(shipped / DEFAULT_MODEL)[0])
    assert config.data.endswith("small.txt") and tokenizer.name == "bytes"  # the run it was exported from


def test_eval_of_a_file_uses_the_default_model(shipped, tmp_path):
    file = tmp_path / "text.txt"
    file.write_bytes(b"The quick brown fox jumps over the lazy dog. " * 40)
    default, named = cli("eval", "--file", file), cli("eval", shipped / DEFAULT_MODEL, "--file", file)
    assert_ok(default)
    assert default.stdout.splitlines()[1:] == named.stdout.splitlines()[1:]  # the same scores
    assert "bits per byte" in default.stdout


@pytest.mark.slow  # a few seconds: out of the working loop
def test_compress_with_no_model_round_trips_and_decodes_with_no_model(shipped, tmp_path):
    source = tmp_path / "text.txt"
    source.write_bytes(bytes(range(256)) + b"Wikipedia is a free online encyclopedia.\r\n" * 30)
    assert_ok(cli("compress", source, "-o", tmp_path / "text.shr"))
    assert_ok(cli("decompress", tmp_path / "text.shr", "-o", tmp_path / "back.txt"))
    assert (tmp_path / "back.txt").read_bytes() == source.read_bytes()
    # the file names the default model by its fingerprint, as one made with it named does
    assert_ok(cli("compress", source, "-o", tmp_path / "named.shr", "--model", DEFAULT_MODEL))
    assert (tmp_path / "named.shr").read_bytes() == (tmp_path / "text.shr").read_bytes()


@pytest.mark.slow  # a few seconds: out of the working loop
def test_a_file_of_another_shipped_model_decodes_with_no_model(shipped, tmp_path):
    source = tmp_path / "text.txt"
    source.write_bytes(b"<page><title>Anarchism</title>\n" * 20)
    assert_ok(cli("compress", source, "-o", tmp_path / "fp32.shr", "--model", "tiny-fp32"))
    assert_ok(cli("decompress", tmp_path / "fp32.shr", "-o", tmp_path / "back.txt"))
    assert (tmp_path / "back.txt").read_bytes() == source.read_bytes()


@pytest.mark.slow  # a few seconds: out of the working loop
def test_a_file_of_a_model_not_shipped_needs_it_named(shipped, run_dir, tmp_path):
    source = tmp_path / "text.txt"
    source.write_bytes(b"<page><title>Anarchism</title>\n" * 20)
    assert_ok(
        cli("compress", source, "-o", tmp_path / "run.shr", "--model", run_dir)
    )  # fp32, not collapsed: not shipped
    line = assert_user_error(
        cli("decompress", tmp_path / "run.shr", "-o", tmp_path / "back.txt"), "give it with --model"
    )
    assert "not shipped" in line and not (tmp_path / "back.txt").exists()
    assert_ok(cli("decompress", tmp_path / "run.shr", "-o", tmp_path / "back.txt", "--model", run_dir))
    assert (tmp_path / "back.txt").read_bytes() == source.read_bytes()


def test_a_shipped_name_is_the_package_s_and_a_path_the_working_folder_s(shipped, run_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT_MODEL).mkdir()  # a user's own (empty) folder of that name
    assert_ok(cli("generate", DEFAULT_MODEL, "--max-bytes", "4"))  # the shipped one
    assert_user_error(cli("generate", f"./{DEFAULT_MODEL}", "--max-bytes", "4"), f"no checkpoint at ./{DEFAULT_MODEL}")


def test_with_nothing_shipped_the_default_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(shipped_module, "shipped_root", lambda: tmp_path / "none")
    assert shipped_names() == [] and shipped_folder(DEFAULT_MODEL) is None
    assert_user_error(cli("generate", "--max-bytes", "4"), f"no checkpoint at {DEFAULT_MODEL}", "shipped model: none")
    assert_user_error(cli("compress", __file__, "-o", tmp_path / "out.shr"), "shipped model: none")
    assert not (tmp_path / "out.shr").exists()


def test_online_and_a_model_together_are_refused(shipped, tmp_path):
    assert_user_error(
        cli("compress", __file__, "-o", tmp_path / "out.shr", "--online", "--model", DEFAULT_MODEL), "not both"
    )


# ----------------------------------------------------------------------------- the real one


def test_the_default_model_ships_inside_the_package():
    """The weights are in the package (at most 16 MB), match the SHA-256 their model card
    and docs/pretrained.md state, and their card names the data, licence and command."""
    folder = shipped_folder(DEFAULT_MODEL)
    assert folder is not None, f"{DEFAULT_MODEL} is not in {shipped_module.shipped_root()}"
    weights = folder / "model.safetensors"
    assert weights.stat().st_size <= 16 * 2**20
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    card = (folder / "README.md").read_text()
    assert digest in card
    record = json.loads((folder / "training.json").read_text())
    assert record["command"].startswith("sharnn train --preset wikipedia-2x512")
    assert "CC BY-SA 3.0" in card and "enwik8-head*3+wikitext-2" in card
