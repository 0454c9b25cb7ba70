"""``sharnn export``: a run's best checkpoint (or any checkpoint) as a folder to share, in
the Hugging Face Hub layout (docs/sharing.md)::

    config.json          the model config (``collapsed: true`` with --collapse)
    model.safetensors    the weights, with their SHA-256 (:mod:`sharnn.models.hub`)
    README.md            the model card (template ``sharnn/model_card.md``)
    train_config.yaml    the run's full TrainConfig: ``sharnn train --config`` re-runs it,
                         ``sharnn eval DIR`` evaluates with its data and protocol
    training.json        the record of the run (:func:`training_record`)
    bpc.png              the training curve (absent for a checkpoint outside a run folder)

The folder is written into a staging folder of a unique name beside it, flushed and
renamed: an error, Ctrl-C or SIGTERM leaves nothing behind, and nothing but that staging
folder is ever removed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import torch
from huggingface_hub import EvalResult
from omegaconf import OmegaConf

from .config import TrainConfig, to_yaml
from .config_check import shown
from .data.corpus import wikipedia_mix_weight
from .data.tokenizer import ByteTokenizer, Tokenizer, save_tokenizer
from .errors import CheckpointError, ConfigError
from .files import check_new, output_lock, publish, staging_folder
from .models.config import SHARNNConfig
from .models.sharnn import SHARNN
from .training import checkpoint
from .training.metrics import plot_bpc, read_records
from .training.run_folder import read_summary

TRAINING_FILE, CURVE_FILE = checkpoint.TRAINING_FILE, "bpc.png"

# What the card says about the data a model learned from, and the licence its weights
# inherit (src/sharnn/corpora/README.md for the bundled head).
_WIKIPEDIA = {
    "licence": "CC BY-SA 3.0 and GFDL, as the Wikipedia text it was trained on (attribution: Wikipedia "
    "contributors; enwik8 by Matt Mahoney, for the Hutter Prize)",
    "license": "cc-by-sa-3.0",
    "datasets": ["LTCB/enwik8"],
}
_ENWIK8_HEAD = (
    "`enwik8-head`, bundled with sharnn: the first 4,154,064 bytes of enwik8 (491 whole pages of the "
    "English Wikipedia XML dump of 2006-03-03). It is a prefix of enwik8, not the enwik8 benchmark: its "
    "scores are not comparable with published enwik8 figures (§4.1, Table 1)."
)
_ENWIK8 = (
    "enwik8: the first 100,000,000 bytes of the English Wikipedia XML dump of 2006-03-03, the byte-level "
    "benchmark of §4.1."
)
_ENWIK8_SPLIT = (
    "the standard enwik8 split: the first 90,000,000 bytes train, the next 5,000,000 valid, the last 5,000,000 test"
)
# Hub dataset ids (model-index ``dataset.type``), and the config of the Hub's copy
_ENWIK8_DATASET, _WIKITEXT2_DATASET = ("LTCB/enwik8", None), ("Salesforce/wikitext", "wikitext-2-v1")
_WIKITEXT2 = {
    "licence": "CC BY-SA 3.0, as the WikiText-2 text it was trained on (Stephen Merity, Caiming Xiong, James "
    'Bradbury, Richard Socher, "Pointer Sentinel Mixture Models", 2016, arXiv:1609.07843; '
    "drawn from Wikipedia's Good and Featured articles)",
    "license": "cc-by-sa-3.0",
    "datasets": ["Salesforce/wikitext"],
    "description": "WikiText-2 (v1, tokenized; Merity et al. 2016), as prepared by `sharnn prepare wikitext-2`: "
    "2,088,628 train, 217,646 valid and 245,569 test words (each line ending in `<eos>`).",
}
_WIKITEXT2_BYTES = (
    "`wikitext-2-bytes`, bundled with sharnn: WikiText-2 (v1, tokenized; Merity et al. 2016) read as raw "
    "bytes, its own train, valid and test files (10,797,148, 1,121,681 and 1,256,449 bytes)."
)
_MIX = (
    "each split is the enwik8 head's (its first 4,154,064 bytes, 491 pages of the English Wikipedia XML dump "
    "of 2006-03-03, split 90/5/5 by position) followed by WikiText-2's (v1, tokenized, read as raw bytes): "
    "14,535,806 bytes of train text. The valid and test splits of both are held out."
)
_WEIGHTED = " In the train split the enwik8 head's 3,738,658 bytes come {weight} times over ({size:,} bytes in all)."
_WIKITEXT2_SPLIT = "as WikiText-2 is: its own train, valid and test files (wiki.*.tokens)"


STORAGE = {"fp32": torch.float32, "bf16": torch.bfloat16}


def export(
    source: str | Path, out: str | Path, collapse: bool = False, force: bool = False, storage: str = "fp32"
) -> Path:
    """Write the checkpoint at ``source`` (a run folder: its best checkpoint) into the new
    folder ``out``; with ``collapse``, the model after :meth:`SHARNN.collapse`. This
    process alone writes ``out`` meanwhile (:func:`sharnn.files.output_lock`).
    ``storage``: the weights' dtype in ``model.safetensors``, ``fp32`` or ``bf16`` (half
    the size; loading widens them back to fp32, so the model computes in fp32 from
    weights rounded to bf16: measure what that costs, docs/pretrained.md).

    Returns:
        ``out``.

    Raises:
        ConfigError: a ``storage`` other than fp32 or bf16.
        CheckpointError: no checkpoint at ``source``, an already exported one, a
            checkpoint without a training record, or ``out`` exists or (without
            ``force``) is a symbolic link, dangling or not (left untouched; with
            ``force`` the link is replaced by the folder, its target left as it is), or
            is inside the run folder or checkpoint exported, or is one of them (its
            ``latest`` or ``best`` link say, which a resume needs): refused before any work.
        LockError: another process is writing ``out``.
        OSError: the file system refused; nothing is left behind.
    """
    if storage not in STORAGE:
        raise ConfigError(f"storage must be one of {', '.join(STORAGE)}, got {shown(storage)}")
    out = Path(out)
    with output_lock(out):
        return _export(source, out, collapse, force, storage)


def _export(source: str | Path, out: Path, collapse: bool, force: bool, storage: str) -> Path:
    """:func:`export`, with ``out`` locked."""
    folder = checkpoint.resolve(source)
    if checkpoint.is_pretrained(folder):
        raise CheckpointError(f"{folder} is an exported model already: export takes a run or a checkpoint")
    run = folder.parent.parent if folder.parent.name == "checkpoints" else None  # checkpoints/step-N of a run
    _check_outside(out, [Path(source), folder, *([run] if run else [])])
    check_new(out, force, CheckpointError, f"{out} exists: export writes a new folder")
    model, config = checkpoint.load_model(folder)
    records = read_records(run) if run else []
    record = training_record(folder, model, records, read_summary(run) if run else None)
    if collapse:
        model.collapse()
    fields = card_fields(config, record, out, False, checkpoint.read_tokenizer(folder)) | {"storage": storage}
    model.to(STORAGE[storage])
    out.parent.mkdir(parents=True, exist_ok=True)
    with staging_folder(out) as staging:
        fields["curve"] = _write_curve(run, records, staging / CURVE_FILE)
        tokenizer = checkpoint.read_tokenizer(folder)
        model.save_pretrained(staging, model_card_kwargs=fields)
        (staging / checkpoint.TRAIN_CONFIG_FILE).write_text(to_yaml(config))
        (staging / TRAINING_FILE).write_text(json.dumps(record, indent=2) + "\n")
        save_tokenizer(tokenizer, staging)  # words and wordpieces travel with the model
        for file in staging.iterdir():
            with open(file, "rb") as f:
                os.fsync(f.fileno())
        publish(staging, out)
    return out


def _check_outside(out: Path, sources: list[Path]) -> None:
    """Refuse an ``out`` that is one of the folders ``sources`` (the run and checkpoint
    exported) or lies inside one: where ``out`` itself is (its folder's symbolic links
    resolved, not ``out``, which may be a link such as the run's ``latest``)."""
    where = Path(os.path.realpath(out.absolute().parent)) / out.name
    for source in sources:
        inside = Path(os.path.realpath(source))
        if where == inside or inside in where.parents:
            what = "is" if where == inside else "is inside"
            raise CheckpointError(f"{out} {what} {source}, which export reads: give --out a folder outside it")


def training_record(folder: Path, model: SHARNN, records: list[dict], summary: dict | None) -> dict:
    """What ``training.json`` holds about the checkpoint in ``folder`` (with the model it
    holds, its run's metrics ``records`` and ``summary.json``; empty and None outside a run):

    - ``step``, ``epochs``: the optimizer steps and epochs done at the checkpoint;
    - ``valid_bpc``: its valid BPC, when it was validated at its step (the best checkpoint is);
    - ``test_bpc``: the run's test BPC, when this is the checkpoint the run tested;
    - ``valid_prefix_bytes``, ``test_prefix_bytes``: the bytes of text those scores cover
      when they are of a prefix of the split (``valid_max_bytes``, ``test_max_bytes``);
    - ``train_seconds``: training seconds up to its step (wall clock, validations included;
      for the run's last checkpoint, the summary's, which counts its last validation and save);
    - ``command``, ``resumes``: the command that started the run and those that resumed
      it before this step (the ``run`` records of metrics.jsonl);
    - ``parameters``, ``parameters_collapsed``: trainable and collapsed parameter counts.

    Raises:
        CheckpointError: the checkpoint records no step (not written by ``sharnn train``).
    """
    info = checkpoint.read_info(folder)
    if "step" not in info:
        raise CheckpointError(f"{folder} records no training step: export takes a checkpoint written by sharnn train")
    step = int(info["step"])
    record = {"step": step, "epochs": float(info["epochs"])}
    if "valid_bpc" in info:
        record["valid_bpc"] = float(info["valid_bpc"])
        prefix = [
            r["prefix_bytes"] for r in records if r["split"] == "valid" and r["step"] == step and "prefix_bytes" in r
        ]
        if prefix:
            record["valid_prefix_bytes"] = prefix[-1]
    if summary and summary.get("best_step") == step:
        record["test_bpc"] = summary["test_bpc"]
        if summary.get("test_prefix_bytes"):
            record["test_prefix_bytes"] = summary["test_prefix_bytes"]
    seconds = [r["seconds"] for r in records if "seconds" in r and r["step"] <= step]
    if summary and summary.get("steps") == step:  # the run's last checkpoint: its time, as `sharnn train` said it
        seconds.append(summary["train_seconds"])
    if seconds:
        record["train_seconds"] = seconds[-1]
    commands = [r["command"] for r in records if r["split"] == "run" and r["step"] < step]
    if commands:
        record["command"], record["resumes"] = commands[0], commands[1:]
    return record | {"parameters": model.num_parameters(), "parameters_collapsed": model.num_parameters(collapsed=True)}


def card_fields(config: TrainConfig, record: dict, out: Path, curve: bool, tokenizer: Tokenizer | None = None) -> dict:
    """What the model card shows beyond the model itself (see ``sharnn/model_card.md``),
    with the metadata's ``license``, ``datasets``, ``model_name`` and ``eval_results``
    (the valid and test bits per byte of ``record`` on whole splits, as the card's
    ``model-index``; a prefix's score is in the card's text only);
    ``tokenizer``: the model's (bytes when None)."""
    tokenizer = tokenizer or ByteTokenizer()
    meta = _data_meta(config.data)
    data, dataset = _data(config.data, meta)
    if meta.get("name") == "enwik8":
        split = _ENWIK8_SPLIT
    elif meta.get("name") == "wikitext-2" or config.data == "wikitext-2-bytes":
        split = _WIKITEXT2_SPLIT
    elif wikipedia_mix_weight(config.data):
        split = "as each corpus is: the enwik8 head's split by position (train, valid, test) then WikiText-2's own file"
    else:
        valid, test = meta.get("valid_fraction", config.valid_fraction), meta.get("test_fraction", config.test_fraction)
        split = (
            f"by position: train first, then valid (the next {100 * valid:g}%), then test (the last {100 * test:g}%)"
        )
    protocol = {
        "split": split,
        "valid_streams": config.valid_streams,
        "test_streams": config.test_streams,
        "bptt": config.bptt,
    }
    results = [
        EvalResult(
            task_type="text-generation",
            dataset_type=dataset[0],
            dataset_config=dataset[1],
            dataset_name=data["name"],
            dataset_split=split_name,
            metric_type="bpc",
            metric_name="bits per byte",
            metric_value=round(record[key], 4),
        )
        for split_name, key in (("validation", "valid_bpc"), ("test", "test_bpc"))
        if key in record and f"{key[:-4]}_prefix_bytes" not in record
    ]  # whole splits only
    return {
        "license": data.pop("license"),
        "datasets": data.pop("datasets"),
        "model_name": out.name,
        "eval_results": results or None,
        "data": data,
        "protocol": protocol,
        "training": record,
        "preset": _preset(record.get("command")),
        "curve": curve,
        "location": str(out),
        "tokenizer": tokenizer.name,
        "prompt": _prompt(tokenizer),
    }


def _data(spec: str, meta: dict) -> tuple[dict, tuple[str, str | None]]:
    """What the card says of the corpus ``spec`` (with its ``meta.json``): name,
    description, licence, the metadata's licence and datasets; and its Hub dataset id and
    config (the corpus's own name when it has none)."""
    if spec == "enwik8-head" or meta.get("name") == "enwik8":
        head = spec == "enwik8-head"
        data = _WIKIPEDIA | {
            "name": "enwik8-head" if head else "enwik8",
            "description": _ENWIK8_HEAD if head else _ENWIK8,
        }
        return data, _ENWIK8_DATASET
    if meta.get("name") == "wikitext-2":
        return _WIKITEXT2 | {"name": "WikiText-2"}, _WIKITEXT2_DATASET
    if spec == "wikitext-2-bytes" or wikipedia_mix_weight(spec):
        both, weight = spec != "wikitext-2-bytes", wikipedia_mix_weight(spec) or 1
        weighted = _WEIGHTED.format(weight=weight, size=14_535_806 + (weight - 1) * 3_738_658) if weight > 1 else ""
        data = {
            "name": spec,
            "description": (f"`{spec}`, bundled with sharnn: {_MIX}{weighted}" if both else _WIKITEXT2_BYTES),
            "licence": _WIKIPEDIA["licence"] + (" and " + _WIKITEXT2["licence"] if both else ""),
            "license": "cc-by-sa-3.0",
            "datasets": _WIKIPEDIA["datasets"] * both + _WIKITEXT2["datasets"],
        }
        return data, _ENWIK8_DATASET if both else _WIKITEXT2_DATASET
    name = Path(spec).name
    return (
        {
            "name": name,
            "description": f"`{spec}`, as named in train_config.yaml.",
            "licence": "unknown: state it before sharing",
            "license": "unknown",
            "datasets": None,
        },
        (name, None),
    )


def _prompt(tokenizer: Tokenizer) -> str:
    """A prompt the card's usage example can encode: a word of a words vocabulary."""
    if tokenizer.name == "words":
        return "the" if "the" in tokenizer.index else next(w for w in tokenizer.vocab if w != "<eos>")
    return "<page>"


def describe(folder: Path) -> tuple[str, SHARNNConfig, str]:
    """What ``sharnn info`` shows of a Hub-layout folder: its configuration as YAML (the
    training config with the exported model, or the model alone after a plain
    ``save_pretrained``), the model config, and a line of scores from ``training.json``.

    Raises:
        CheckpointError: an invalid ``config.json``, ``train_config.yaml`` or ``training.json``.
    """
    model_config = checkpoint.read_model_config(folder)
    if (folder / checkpoint.TRAIN_CONFIG_FILE).is_file():
        text = to_yaml(checkpoint.read_config(folder))
    else:
        text = OmegaConf.to_yaml({"model": OmegaConf.structured(model_config)})
    record = checkpoint.check_training_record(folder)
    if record is None:
        return text, model_config, f"{folder}: no training record (saved with save_pretrained)"
    parts = [f"step {record['step']}", f"epoch {record['epochs']:.2f}"]
    if "valid_bpc" in record:
        parts.append(f"valid {record['valid_bpc']:.4f} BPC")
    parts.append(f"test {record['test_bpc']:.4f} BPC" if "test_bpc" in record else "test not recorded")
    return text, model_config, f"exported model {folder}: " + ", ".join(parts)


def _write_curve(run: Path | None, records: list[dict], path: Path) -> bool:
    """Copy the run's ``bpc.png`` to ``path``, or draw it from its ``records``; False when
    there is neither."""
    if run is not None and (run / CURVE_FILE).is_file():
        shutil.copyfile(run / CURVE_FILE, path)
        return True
    if records:
        plot_bpc(records, path, run.name)
        return True
    return False


def _data_meta(data: str) -> dict:
    """The ``meta.json`` of a prepared corpus folder (``sharnn prepare``), else empty."""
    try:
        return json.loads((Path(data) / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def _preset(command: str | None) -> str | None:
    """The ``--preset`` of a recorded ``sharnn train`` command, or None."""
    words = shlex.split(command or "")
    for i, word in enumerate(words):
        if word == "--preset" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--preset="):
            return word.split("=", 1)[1]
    return None
