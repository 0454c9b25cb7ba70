"""``python -m sharnn`` (and ``torchrun --nproc_per_node=N -m sharnn train ...``): the
command line of :mod:`sharnn.cli`, and :func:`run`, the ``sharnn`` command's entry point."""

import sys


def run() -> None:
    """Run the command line. Ctrl-C at any moment, even while the libraries a command needs
    are loading, prints one line ``interrupted`` and exits with status 130."""
    try:
        from .cli import main

        main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    run()
