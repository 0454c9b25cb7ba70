"""``sharnn info``: :func:`info` describes a preset, a config file, a run, a checkpoint, an
exported folder, a shipped model or a compressed file.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from ..config import TrainConfig, load_config, preset_names, to_yaml
from ..config_check import shown
from ..errors import CheckpointError, ConfigError
from ..loading import is_pretrained, resolve
from ..models.build import meta_model
from ..models.shipped import DEFAULT_MODEL, shipped_folder, shipped_names
from .arguments import check_overrides, check_path
from .listing import is_compressed, list_file


def info(target: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> str:
    """What ``sharnn info`` prints: the configuration and parameter counts of a preset, a
    config file (with ``key=value`` ``overrides``: a variant's, e.g. ``model.cell=ln_lstm``),
    a run, a checkpoint, an exported or ``save_pretrained`` folder or a shipped model's name,
    and for these folders their step, epoch and scores (None: the lists of presets and of
    shipped models, the default marked).

    Raises:
        ConfigError: an unknown preset or an invalid config file or override; overrides
            given with a folder (they describe a new run); a model too large to count (a
            weight past 2^63 bytes). CheckpointError: an invalid checkpoint or exported
            folder (its ``training.json`` too: :func:`sharnn.training.checkpoint.check_training_record`).
    """
    from ..export import describe

    if target is None:
        shipped = [f"{name} (default)" if name == DEFAULT_MODEL else name for name in shipped_names()]
        return f"presets: {', '.join(preset_names())}\nshipped models: {', '.join(shipped) or 'none'}"
    check_path("target", target)
    check_overrides(overrides)
    if not overrides and is_compressed(target):
        return list_file(target).format()
    path, scores = shipped_folder(str(target)) or Path(target), None  # a shipped name: the package's, as resolve()
    if overrides and path.is_dir():
        raise ConfigError(f"{target} is a folder: key=value settings go with a preset or a config file")
    if is_pretrained(path):
        text, model_config, scores = describe(path)
    else:
        config = _config(target, overrides)  # a preset, a YAML file, or a run/checkpoint folder's config.yaml
        text, model_config = to_yaml(config), config.model
        if path.is_dir():
            scores = _checkpoint_scores(path)
    model = meta_model(model_config)
    lines = [text.rstrip(), ""]
    lines += [f"  {part:<24} {count:>14,}" for part, count in model.parameter_counts().items() if count]
    total, collapsed = model.num_parameters(), model.num_parameters(collapsed=True)
    lines.append(
        f"parameters: {total:,} trainable ({total / 1e6:.2f}M), {collapsed:,} collapsed ({collapsed / 1e6:.2f}M)"
    )
    return "\n".join(lines + [scores] * bool(scores))


def _config(target: str | Path, overrides) -> TrainConfig:
    """:func:`load_config` of ``target``, whose refusal of a name it does not know names the
    shipped models too, and the closest name of all."""
    try:
        return load_config(str(target), overrides)
    except ConfigError as e:
        if Path(target).exists() or not str(e).startswith("unknown preset"):
            raise
        names = preset_names() + shipped_names()
        close = difflib.get_close_matches(str(target), names, n=1, cutoff=0.5) or [
            name for name in names if name.startswith(str(target))
        ]
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(f"{e}; shipped models: {', '.join(shipped_names()) or 'none'}{hint}") from None


def _checkpoint_scores(path: Path) -> str:
    """``checkpoint FOLDER: step N, epoch E, valid X BPC, test Y BPC`` for the checkpoint
    at ``path`` (a run's best): what its run recorded in it, and the test BPC from the
    run's summary.json when it is the checkpoint that was tested."""
    from ..training.checkpoint import read_info
    from ..training.run_folder import read_summary

    try:
        folder = resolve(path.absolute())  # the folder given, never a shipped model of its name
    except CheckpointError:
        return "no checkpoint yet"
    record = read_info(folder)
    if "step" not in record:
        return f"checkpoint {folder}: no training record"
    summary = read_summary(folder.parent.parent)  # the run holding checkpoints/step-N
    try:
        parts = [f"step {int(record['step'])}", f"epoch {float(record['epochs']):.2f}"]
        if "valid_bpc" in record:
            parts.append(f"valid {float(record['valid_bpc']):.4f} BPC")
        elif float(record["best_valid_bpc"]) < float("inf"):
            parts.append(f"best valid so far {float(record['best_valid_bpc']):.4f} BPC (step {record['best_step']})")
    except (KeyError, ValueError) as e:
        raise CheckpointError(
            f"{folder}: the training record in its model.safetensors is not sharnn's ({shown(e)})"
        ) from None
    if isinstance(summary, dict) and summary.get("best_step") == int(record["step"]):
        test = summary.get("test_bpc")
        if isinstance(test, bool) or not isinstance(test, (int, float)):
            raise CheckpointError(f"{folder.parent.parent / 'summary.json'}: test_bpc is not a number")
        parts.append(f"test {test:.4f} BPC")
    return f"checkpoint {folder}: " + ", ".join(parts)
