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
"""

from .config import TrainConfig, load_config
from .data import Corpus, load_corpus
from .evaluate import EvalResult, evaluate
from .generate import generate
from .model import SHARNN, SHARNNConfig, State
from .optim import MinTrustLAMB
from .runtime import Runtime
from .tokenizer import ByteTokenizer, load_tokenizer
from .train import TrainingState

__all__ = [
    "SHARNN", "SHARNNConfig", "State", "MinTrustLAMB", "TrainConfig", "load_config", "Runtime", "TrainingState",
    "ByteTokenizer", "load_tokenizer", "Corpus", "load_corpus", "EvalResult", "evaluate", "generate",
]
__version__ = "0.2.0"
