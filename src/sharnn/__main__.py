"""``python -m sharnn`` (and ``torchrun --nproc_per_node=N -m sharnn train ...``): the
command line of :mod:`sharnn.cli`."""

from .cli import main

main()
