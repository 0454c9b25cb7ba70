"""What each ``sharnn`` command does, callable from Python with the command's defaults: the
public names of :mod:`sharnn.commands`, one module per command, where each is defined with
what it returns and the lines its command prints.

- :func:`load`: a checkpoint, run folder (its best checkpoint), exported folder or shipped model;
- :func:`evaluate_checkpoint` (``sharnn eval``), :func:`generate_text` (``sharnn
  generate``), :func:`analyze_tokenization` (``sharnn analyze tokenization``),
  :func:`compress_file` and :func:`decompress_file` (``sharnn compress`` /
  ``decompress``), :func:`list_file` (``sharnn decompress -l``), :func:`train_run`
  (``sharnn train``) and :func:`info` (``sharnn info``); ``sharnn export`` is
  :func:`sharnn.export.export`.

Every function raises a :class:`sharnn.errors.SharnnError` subclass for what a user can
get wrong (a missing file, an incompatible checkpoint, bad settings), with the command
line's message; ``OSError`` when the file system refuses.
"""

from __future__ import annotations

from .commands.analyze import analyze_tokenization
from .commands.compress import Coding, compress_file
from .commands.decompress import decompress_file
from .commands.evaluate import Evaluation, evaluate_checkpoint
from .commands.generate import Generation, generate_text
from .commands.info import info
from .commands.listing import Listing, list_file
from .commands.loading import Loaded, load
from .commands.train import format_summary, train_run

__all__ = [
    "Coding",
    "Evaluation",
    "Generation",
    "Listing",
    "Loaded",
    "analyze_tokenization",
    "compress_file",
    "decompress_file",
    "evaluate_checkpoint",
    "format_summary",
    "generate_text",
    "info",
    "list_file",
    "load",
    "train_run",
]
