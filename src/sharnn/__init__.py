"""sharnn: the Single Headed Attention RNN (Merity 2019, arXiv:1911.11423) in PyTorch.

Python API::

    from sharnn import SHARNN, SHARNNConfig, State, MinTrustLAMB
    model = SHARNN(SHARNNConfig(d_model=256, n_layers=2, boom_dim=1024))
    logits, state = model(tokens)   # tokens [T, B] int64 -> logits [T, B, 256]
    model.set_execution(fast=True, compile=True)   # the CUDA fast path; same function
"""

from .config import TrainConfig, load_config
from .data import ByteTokenizer, Corpus, load_corpus
from .evaluate import EvalResult, evaluate
from .generate import generate, sample
from .model import SHARNN, SHARNNConfig, State
from .optim import MinTrustLAMB

__all__ = [
    "SHARNN", "SHARNNConfig", "State", "MinTrustLAMB", "TrainConfig", "load_config",
    "ByteTokenizer", "Corpus", "load_corpus", "EvalResult", "evaluate", "generate", "sample",
]
__version__ = "0.1.0"
