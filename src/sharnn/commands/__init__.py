"""What each ``sharnn`` command does, one module per command: its work (a function callable
from Python with the command's defaults), what it returns, and the lines the command
prints for it. :mod:`sharnn.api` re-exports the public functions; the command line
(:mod:`sharnn.cli`, where click stays, so that ``--help`` loads no torch) parses the
options, calls one of them and prints.

- :mod:`.prepare`: ``sharnn prepare enwik8``, ``wikitext-2`` and ``corpus``, and their lines;
- :mod:`.train`: ``sharnn train``: ``train_run``, its summary line, the sample it prints
  and the note when a limit ended the run before ``max_steps``;
- :mod:`.evaluate`: ``sharnn eval``: ``evaluate_checkpoint`` and ``Evaluation``;
- :mod:`.generate`: ``sharnn generate``: ``generate_text`` and ``Generation``;
- :mod:`.analyze`: ``sharnn analyze tokenization``;
- :mod:`.compress`: ``sharnn compress``, and ``Coding``, what a coding did;
- :mod:`.decompress`: ``sharnn decompress`` (``-t`` too), and the shipped model a file names;
- :mod:`.listing`: ``sharnn decompress -l`` and ``sharnn info FILE.shz``;
- :mod:`.info`: ``sharnn info``;
- :mod:`.export`: ``sharnn export``'s line (:mod:`sharnn.export` does the work);
- :mod:`.loading`: what several commands share: ``load`` (``sharnn.load``), ``Loaded``,
  the run's corpus and the evaluation window;
- :mod:`.arguments`: the checks of the Python API's arguments;
- :mod:`.names`: the names of the coding commands' outputs and the inputs they skip (no torch).
"""
