"""What each ``sharnn`` command does, one module per command: its work (a function callable
from Python with the command's defaults), what it returns, and the lines the command
prints for it. :mod:`sharnn.api` re-exports the public functions; the command line
(:mod:`sharnn.cli`) parses the options, calls one of them and prints.

- :mod:`.compress`: ``sharnn compress``, and :class:`Coding`, what a coding did;
- :mod:`.decompress`: ``sharnn decompress`` (``-t`` too), and the shipped model a file names;
- :mod:`.listing`: ``sharnn decompress -l`` and ``sharnn info FILE.shz``.
"""
