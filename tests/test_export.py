"""Sharing a model in the Hugging Face Hub layout (src/sharnn/models/hub.py, the hooks of
SHARNN in src/sharnn/models/sharnn.py, src/sharnn/export.py; docs/sharing.md):
``save_pretrained`` / ``from_pretrained`` bit for bit, strict loading that refuses damaged
folders with one line, ``sharnn export`` of a trained run, and the exported folder as
an argument of ``sharnn eval``, ``generate`` and ``info``.

Nothing here may reach the network: the Hub library is put in offline mode and every
socket connection fails.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors import safe_open
from safetensors.torch import save_file

import sharnn.export as export_module
import sharnn.training.run_folder as run_folder_module
from helpers import (
    SMALL,
    SUBPROCESS_ENV,
    assert_ok,
    assert_user_error,
    cli,
    shared_run,
    single_thread,
    write_small_corpus,
)
from sharnn.config import load_config
from sharnn.data.tokenizer import WordTokenizer, save_tokenizer
from sharnn.errors import CheckpointError
from sharnn.models.build import model_sha256
from sharnn.models.config import VARIANT_DEFAULTS, SHARNNConfig
from sharnn.models.hub import weights_sha256
from sharnn.models.sharnn import SHARNN
from sharnn.training.checkpoint import load_model, read_config
from sharnn.training.metrics import read_records

EXPORTED_FILES = {"config.json", "model.safetensors", "README.md", "train_config.yaml", "training.json", "bpc.png"}


@pytest.fixture(scope="module", autouse=True)
def offline():
    """The Hub library in offline mode (it reads HF_HUB_OFFLINE once, at import), and no
    socket may connect."""
    import huggingface_hub.constants

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to reach the network")

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket, "create_connection", refuse)
        yield


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished SMALL run (read only)."""
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory) -> Path:
    """``sharnn export RUN --out DIR`` of the shared run (read only)."""
    out = tmp_path_factory.mktemp("export") / "tiny-model"
    with single_thread():
        assert_ok(cli("export", run_dir, "--out", out))
    return out


def _model(**overrides) -> SHARNN:
    """A small model with attention in eval mode, every parameter perturbed so that no
    gate sits at its initial zero."""
    torch.manual_seed(0)
    config = SHARNNConfig(d_model=32, n_layers=2, boom_dim=64, attention="all", attention_span=48, **overrides)
    model = SHARNN(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def _logits(model: SHARNN, windows: int = 3) -> torch.Tensor:
    """Logits of random tokens over several windows, carrying the state and memory."""
    tokens = torch.randint(0, 256, (windows * 16, 3), generator=torch.Generator().manual_seed(1))
    state, out = None, []
    with torch.no_grad():
        for window in tokens.split(16):
            logits, state = model(window, state)
            out.append(logits)
    return torch.cat(out)


def _assert_same_weights(a: SHARNN, b: SHARNN) -> None:
    wa, wb = a.state_dict(), b.state_dict()
    assert wa.keys() == wb.keys()
    assert all(wa[k].dtype == wb[k].dtype and torch.equal(wa[k], wb[k]) for k in wa)


# --------------------------------------------------------------------------------------
# save_pretrained / from_pretrained


@pytest.mark.parametrize("collapsed", [False, True], ids=["attention", "collapsed"])
def test_from_pretrained_reproduces_the_saved_model_bit_for_bit(tmp_path, capfd, collapsed):
    model = _model()
    if collapsed:
        model.collapse()
    model.save_pretrained(tmp_path / "saved")
    assert {p.name for p in (tmp_path / "saved").iterdir()} == {"config.json", "model.safetensors", "README.md"}
    capfd.readouterr()
    loaded = SHARNN.from_pretrained(tmp_path / "saved")
    assert capfd.readouterr() == ("", "")  # offline and silent
    assert loaded.config == model.config and loaded.config.collapsed == collapsed
    assert not loaded.training  # in eval mode
    _assert_same_weights(loaded, model)
    assert torch.equal(_logits(loaded), _logits(model))


def test_the_weights_file_records_format_and_sha256(tmp_path):
    model = _model()
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt", "sha256": weights_sha256(model.state_dict())}
    assert json.loads((tmp_path / "config.json").read_text()) == model.config.to_dict()


def test_from_pretrained_honours_map_location(tmp_path):
    _model().save_pretrained(tmp_path)
    loaded = SHARNN.from_pretrained(tmp_path, map_location="meta")  # a device move without a GPU
    assert {p.device.type for p in loaded.parameters()} == {"meta"}


def test_the_compressor_fingerprint_is_unchanged_by_the_shared_weights_digest():
    """Compressed files record model_sha256; it must stay what it was before the weights
    part moved to sharnn.models.hub, and before the variants' settings existed: the JSON of
    the config's original settings, then every tensor by name."""
    model = _model()
    original = {k: v for k, v in dataclasses.asdict(model.config).items() if k not in VARIANT_DEFAULTS}
    digest = hashlib.sha256(json.dumps(original, sort_keys=True).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode())
        digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    assert model_sha256(model) == digest.hexdigest()


def _no_config(folder: Path) -> None:
    (folder / "config.json").unlink()


def _flipped_byte(folder: Path) -> None:
    """One byte of tensor data (after the 8-byte length and the JSON header) altered."""
    file = folder / "model.safetensors"
    data = bytearray(file.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[(start + len(data)) // 2] ^= 0x10
    file.write_bytes(bytes(data))


def _truncated(folder: Path) -> None:
    file = folder / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-100])


def _no_digest(folder: Path) -> None:
    save_file(_model().state_dict(), folder / "model.safetensors")


def _config(**changes):
    def damage(folder: Path) -> None:
        fields = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(fields | changes))

    return damage


DAMAGE = [
    (_no_config, "has no config.json"),
    (_flipped_byte, "fails its SHA-256 check"),
    (_truncated, "model.safetensors is missing or corrupt"),
    (_no_digest, "records no sha256"),
    (_config(d_model=64, boom_dim=128), "size mismatch"),  # weights of another config: shapes
    (_config(collapsed=True), "Missing key(s)"),  # and keys
    (_config(d_model="wide"), "model.d_model must be an integer"),
    (_config(heads=2), "unknown model setting 'heads'"),
]
DAMAGE_IDS = [
    "no-config",
    "flipped-byte",
    "truncated",
    "no-digest",
    "other-shapes",
    "other-keys",
    "bad-value",
    "unknown-setting",
]


@pytest.mark.parametrize("damage, fragment", DAMAGE, ids=DAMAGE_IDS)
def test_a_damaged_folder_is_refused_with_one_line(tmp_path, damage, fragment):
    folder = tmp_path / "saved"
    _model().save_pretrained(folder)
    damage(folder)
    with pytest.raises(CheckpointError) as error:
        SHARNN.from_pretrained(folder)
    message = str(error.value)
    assert "\n" not in message and str(folder) in message and fragment in message, message
    # the command line: status 1 and one `error:` line
    expected = "config.json" if damage is _no_config else fragment
    for command in (["eval", folder], ["generate", folder, "--max-bytes", "5"]):
        result = cli(*command)
        assert_user_error(result, str(folder), expected)
        assert result.exit_code == 1


# --------------------------------------------------------------------------------------
# sharnn export


def test_export_writes_the_hub_layout_and_the_run_record(run_dir, exported):
    assert {p.name for p in exported.iterdir()} == EXPORTED_FILES
    assert not list(exported.parent.glob(".*"))  # no staging folder left
    summary = json.loads((run_dir / "summary.json").read_text())
    record = json.loads((exported / "training.json").read_text())
    commands = [r["command"] for r in read_records(run_dir) if r["split"] == "run"]
    assert record == {
        "step": summary["best_step"],
        "epochs": pytest.approx(summary["epochs"]),
        "valid_bpc": summary["valid_bpc"],
        "test_bpc": summary["test_bpc"],
        "train_seconds": record["train_seconds"],
        "command": commands[0],
        "resumes": [],
        "parameters": summary["parameters"],
        "parameters_collapsed": summary["parameters_collapsed"],
    }
    assert 0 < record["train_seconds"] <= summary["train_seconds"]
    assert load_config(exported / "train_config.yaml") == load_config(run_dir / "config.yaml")
    assert (exported / "bpc.png").read_bytes() == (run_dir / "bpc.png").read_bytes()
    run_model, exported_model = load_model(run_dir)[0], SHARNN.from_pretrained(exported)
    _assert_same_weights(exported_model, run_model)
    assert model_sha256(exported_model) == model_sha256(run_model)  # what the run compressed, the export decompresses


def test_eval_generate_and_info_take_an_exported_folder(run_dir, exported):
    for args in (["generate", "--max-bytes", "20", "--seed", "1"], ["eval"], ["eval", "--split", "valid"]):
        from_run, from_export = cli(args[0], run_dir, *args[1:]), cli(args[0], exported, *args[1:])
        assert_ok(from_run)
        assert_ok(from_export)
        assert from_export.stdout == from_run.stdout  # same bytes; same data, protocol and BPC
    result = cli("info", exported)
    assert_ok(result)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "d_model: 32" in result.stdout and f"data: {load_config(run_dir).data}" in result.stdout
    assert f"{summary['parameters']:,} trainable" in result.stdout
    assert result.stdout.splitlines()[-1] == (
        f"exported model {exported}: step {summary['best_step']}, epoch {summary['epochs']:.2f}, "
        f"valid {summary['valid_bpc']:.4f} BPC, test {summary['test_bpc']:.4f} BPC"
    )


def test_the_model_card_states_scores_protocol_command_and_licence(run_dir, exported):
    card = ModelCard.load(exported / "README.md")  # the metadata parses
    assert card.data.library_name == "sharnn" and card.data.pipeline_tag == "text-generation"
    record = json.loads((exported / "training.json").read_text())
    assert card.data.model_name == exported.name
    assert [(r.dataset_name, r.dataset_split, r.metric_type, r.metric_value) for r in card.data.eval_results] == [
        ("small.txt", "validation", "bpc", round(record["valid_bpc"], 4)),
        ("small.txt", "test", "bpc", round(record["test_bpc"], 4)),
    ]
    assert {"sha-rnn", "byte-level", "arxiv:1911.11423"} <= set(card.data.tags)
    assert card.data.license == "unknown"  # the shared run trains on a plain file
    record = json.loads((exported / "training.json").read_text())
    config = load_config(run_dir)
    for text in (
        f"{record['valid_bpc']:.4f}",
        f"{record['test_bpc']:.4f}",
        record["command"],
        "unknown: state it before sharing",
        "![Training curve",
        "(bpc.png)",
        f"windows of {config.bptt} bytes",
        f"({config.valid_streams} for valid, {config.test_streams} for test)",
        f'SHARNN.from_pretrained("{exported}")',
        f"sharnn eval {exported}",
        "| width `d_model` | 32 |",
        f"| trainable | {record['parameters']:,} |",
        "no tokenizer file",
        "§3",
        "§4.1",
    ):
        assert text in card.text, text


def test_the_card_of_a_wikitext2_model_carries_its_licence_and_split(tmp_path, run_dir):
    """A corpus made by ``sharnn prepare wikitext-2`` records its name in meta.json."""
    (tmp_path / "wt2").mkdir()
    (tmp_path / "wt2" / "meta.json").write_text(json.dumps({"name": "wikitext-2", "tokenizer": "words"}))
    config = dataclasses.replace(load_config(run_dir), data=str(tmp_path / "wt2"))
    record = {"step": 12, "epochs": 0.5, "valid_bpc": 1.23456, "test_bpc": 1.2, "resumes": []}
    fields = export_module.card_fields(config, record, tmp_path / "out", False)
    _model().save_pretrained(tmp_path / "saved", model_card_kwargs=fields)
    card = ModelCard.load(tmp_path / "saved" / "README.md")
    assert card.data.license == "cc-by-sa-3.0" and card.data.datasets == ["Salesforce/wikitext"]
    assert [
        (r.dataset_type, r.dataset_config, r.dataset_name, r.dataset_split, r.metric_value)
        for r in card.data.eval_results
    ] == [
        ("Salesforce/wikitext", "wikitext-2-v1", "WikiText-2", "validation", 1.2346),
        ("Salesforce/wikitext", "wikitext-2-v1", "WikiText-2", "test", 1.2),
    ]
    for text in ("CC BY-SA 3.0", "Pointer Sentinel Mixture Models", "its own train, valid and test files"):
        assert text in card.text, text
    assert "then valid (the next" not in card.text and "unknown" not in card.text


@pytest.mark.parametrize("data", ["enwik8-head", "prepared-enwik8"])
def test_the_card_of_a_wikipedia_model_carries_its_licence(tmp_path, run_dir, data):
    if data == "prepared-enwik8":
        (tmp_path / "enwik8").mkdir()
        (tmp_path / "enwik8" / "meta.json").write_text(json.dumps({"name": "enwik8", "size": 100_000_000}))
        data = str(tmp_path / "enwik8")
    config = dataclasses.replace(load_config(run_dir), data=data)
    fields = export_module.card_fields(config, {"step": 12, "epochs": 0.5, "resumes": []}, tmp_path / "out", False)
    _model().save_pretrained(tmp_path / "saved", model_card_kwargs=fields)
    card = ModelCard.load(tmp_path / "saved" / "README.md")
    assert card.data.license == "cc-by-sa-3.0" and card.data.datasets == ["LTCB/enwik8"]
    assert "CC BY-SA 3.0 and GFDL" in card.text
    split = (
        "the standard enwik8 split" if data != "enwik8-head" else "then valid (the next 5%), then test (the last 5%)"
    )
    assert split in card.text and ("not comparable with published enwik8 figures" in card.text) == (
        data == "enwik8-head"
    )


def test_export_collapse_gives_the_same_logits_with_fewer_parameters(tmp_path, run_dir, exported):
    """The collapsed model computes the value gate once instead of at every call: the same
    arithmetic, so the logits agree to fp32 rounding (asserted with torch's default fp32
    tolerances, rtol 1.3e-6 and atol 1e-5; in practice they are equal)."""
    out = tmp_path / "collapsed"
    assert_ok(cli("export", run_dir, "--out", out, "--collapse"))
    collapsed, full = SHARNN.from_pretrained(out), SHARNN.from_pretrained(exported)
    assert collapsed.config == dataclasses.replace(full.config, collapsed=True)
    record = json.loads((out / "training.json").read_text())
    assert collapsed.num_parameters() == record["parameters_collapsed"] < full.num_parameters() == record["parameters"]
    torch.testing.assert_close(_logits(collapsed), _logits(full), rtol=1.3e-6, atol=1e-5)
    assert read_config(out).model.collapsed and not load_config(out / "train_config.yaml").model.collapsed
    assert "collapsed: each head's value-gate network folded" in (out / "README.md").read_text()


def test_export_refuses_an_existing_folder_and_leaves_it_untouched(tmp_path, run_dir, exported):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    assert_user_error(cli("export", run_dir, "--out", out), str(out), "exists")
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "precious"
    assert_user_error(cli("export", exported, "--out", tmp_path / "again"), "exported model already")
    assert_user_error(cli("export", tmp_path / "nowhere", "--out", tmp_path / "x"), "no checkpoint")
    assert not (tmp_path / "again").exists() and not (tmp_path / "x").exists()


def test_a_failed_export_leaves_nothing(tmp_path, run_dir, monkeypatch):
    def full_disk(config):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export_module, "to_yaml", full_disk)  # after the weights and the card are written
    assert_user_error(cli("export", run_dir, "--out", tmp_path / "out"), "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_a_plain_save_pretrained_folder_works_with_eval_generate_and_info(tmp_path, run_dir):
    plain = tmp_path / "plain"
    load_model(run_dir)[0].save_pretrained(plain)
    assert_user_error(cli("eval", plain), "no train_config.yaml", "--file")
    text = run_dir.parent / "small.txt"
    from_plain = cli("eval", plain, "--file", text, "--bptt", "16")  # the paper's 8 test streams
    from_run = cli("eval", run_dir, "--file", text, "--bptt", "16", "--streams", "8")
    assert_ok(from_plain)
    assert from_plain.stdout == from_run.stdout
    generated = cli("generate", plain, "--max-bytes", "20", "--seed", "1")
    assert_ok(generated)
    assert generated.stdout == cli("generate", run_dir, "--max-bytes", "20", "--seed", "1").stdout
    result = cli("info", plain)
    assert_ok(result)
    assert re.search(r"^model:\n  vocab_size: 256\n  d_model: 32$", result.stdout, re.M)
    assert "data:" not in result.stdout and "trainable" in result.stdout
    assert result.stdout.splitlines()[-1] == f"{plain}: no training record (saved with save_pretrained)"


def test_a_name_that_is_neither_a_folder_nor_on_the_hub_is_refused_with_one_line(tmp_path):
    """A mistyped folder is taken for a repo id by the Hub library; in offline mode here,
    its errors come out as one CheckpointError line."""
    for name in (str(tmp_path / "missing"), "user/no-such-model"):
        with pytest.raises(
            CheckpointError, match="is not a folder, and the Hugging Face Hub does not give it"
        ) as caught:
            SHARNN.from_pretrained(name)
        assert "\n" not in str(caught.value)


def test_saving_again_into_a_folder_writes_the_new_models_card(tmp_path):
    model = _model()
    model.save_pretrained(tmp_path)
    assert "as trained: each head's value-gate network" in (tmp_path / "README.md").read_text()
    model.collapse()
    model.save_pretrained(tmp_path)
    assert "collapsed: each head's value-gate network folded" in (tmp_path / "README.md").read_text()
    assert json.loads((tmp_path / "config.json").read_text())["collapsed"] is True


def _run_card_snippet(folder: Path, cwd: Path) -> subprocess.CompletedProcess:
    """The Python block of ``folder``'s model card, run as written in a fresh offline process."""
    (snippet,) = re.findall(r"```python\n(.*?)```", (folder / "README.md").read_text(), re.DOTALL)
    env = {**SUBPROCESS_ENV, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", snippet], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.slow
def test_the_cards_usage_example_runs_as_written(tmp_path, exported):
    result = _run_card_snippet(exported, tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.encode()) in (2, 3, 4)  # one byte's text (U+FFFD for a lone byte) and a newline


@pytest.mark.slow
def test_the_card_of_a_words_model_says_so_and_its_example_runs(tmp_path, run_dir):
    """A words model's card names its tokenizer, and its example encodes a word of it."""
    tokenizer = WordTokenizer(["<eos>", "=", "the", "cat"])
    folder = tmp_path / "words"
    config = load_config(run_dir)
    record = {"step": 12, "epochs": 0.5, "valid_bpc": 1.5, "resumes": []}
    _model(vocab_size=tokenizer.vocab_size).save_pretrained(
        folder, model_card_kwargs=export_module.card_fields(config, record, folder, False, tokenizer)
    )
    save_tokenizer(tokenizer, folder)
    text = (folder / "README.md").read_text()
    assert "language model on words tokens" in text and "no tokenizer file" not in text and 'encode("the")' in text
    result = _run_card_snippet(folder, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in ("<eos>", "=", "the", "cat", "")


@pytest.mark.slow
def test_a_torchrun_run_records_the_launcher_command_as_typed(tmp_path):
    """``python -m torch.distributed.run --standalone --nproc_per_node=1 -m sharnn train``:
    the run record and the card quote it as ``torchrun --standalone ...``."""
    data = write_small_corpus(tmp_path / "small.txt")
    run = tmp_path / "run"
    args = [
        "--standalone",
        "--nproc_per_node=1",
        "-m",
        "sharnn",
        "train",
        "--preset",
        "tiny",
        "--out",
        str(run),
        *SMALL,
        f"data={data}",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *args],
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (command,) = [r["command"] for r in read_records(run) if r["split"] == "run"]
    assert command == shlex.join(["torchrun", *args])
    assert_ok(cli("export", run, "--out", tmp_path / "out"))
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"```bash\n{command}\n```" in card and "the `tiny` preset" in card


def test_a_torchrun_command_that_cannot_be_read_says_so(monkeypatch):
    """Where the parent process is not torchrun (or /proc cannot be read), the command is
    rebuilt from torchrun's environment and marked as missing the launcher's options."""
    for name, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "localhost"),
        ("MASTER_PORT", "29500"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["/somewhere/sharnn/__main__.py", "train", "--preset", "tiny"])
    assert run_folder_module.command_line() == (
        "torchrun --nproc_per_node=2 -m sharnn train --preset tiny  # torchrun's own options (such as --standalone) "
        "not recorded"
    )
