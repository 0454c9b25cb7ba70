"""sharnn: the Single Headed Attention RNN (Merity 2019, arXiv:1911.11423) in PyTorch.

Python API::

    from sharnn import SHARNN, SHARNNConfig, State, MinTrustLAMB
    model = SHARNN(SHARNNConfig(d_model=256, n_layers=2, boom_dim=1024))
    logits, state = model(tokens)   # tokens [T, B] int64 -> logits [T, B, 256]
    model.set_attn_implementation("sdpa")   # fused attention kernels; the same function
    model.save_pretrained("my-model")        # config.json, model.safetensors (with its SHA-256), README.md
    model = SHARNN.from_pretrained("my-model")   # a folder or a Hugging Face Hub repo id

``docs/`` in the repository explains the model, the optimizer, the data, the
evaluation protocol and tokenizations (words, wordpieces, bytes).

The package in four wings (``tests/test_layers.py`` keeps their contract):
:mod:`sharnn.models` (the networks, their config, step and Hub layout), :mod:`sharnn.data.corpus`
(corpora, tokenizers, preparation), :mod:`sharnn.training` (recipe, optimizer, loop, run
folder, checkpoints) and :mod:`sharnn.coding` (the compressor), under a thin top: errors,
files, configuration, runtime, evaluation, generation, analysis, export, the API and the
command line.

The public names load on first use (PEP 562), so that ``import sharnn`` and the command
line's ``--help`` and ``--version`` do not import torch.
"""

import importlib

__version__ = "0.4.0"

# Each public name and the submodule that defines it.
_EXPORTS = {
    "SHARNN": "models.sharnn",
    "SHARNNConfig": "models.config",
    "State": "models.sharnn",
    "Transformer": "models.transformer",
    "build_model": "models.build",
    "load_pretrained": "models.build",
    "MinTrustLAMB": "training.optim",
    "TrainConfig": "config",
    "load_config": "config",
    "Runtime": "runtime",
    "TrainingState": "training.recipe",
    "ByteTokenizer": "data.tokenizer",
    "load_tokenizer": "data.tokenizer",
    "Corpus": "data.corpus",
    "load_corpus": "data.corpus",
    "EvalResult": "evaluation",
    "evaluate": "evaluation",
    "generate": "generation",
    # what the commands do (sharnn.api)
    "load": "api",
    "Loaded": "api",
    "evaluate_checkpoint": "api",
    "Evaluation": "api",
    "generate_text": "api",
    "Generation": "api",
    "analyze_tokenization": "api",
    "compress_file": "api",
    "decompress_file": "api",
    "Coding": "api",
    "list_file": "api",
    "Listing": "api",
    "train_run": "api",
    "info": "api",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:  # a submodule (``sharnn.models``), as an eager package gives them
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":  # a dependency of the submodule is missing
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
