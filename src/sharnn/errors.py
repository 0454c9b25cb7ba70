"""Errors that mean "the user asked for something that cannot be done".

The command line prints these as one line and exits non-zero; anything else is a bug,
printed as one line that says so (``SHARNN_TRACEBACK=1``: with its traceback;
:func:`sharnn.console.internal_error_line`).
"""


class SharnnError(Exception):
    """Base class of all user-facing errors."""


class ConfigError(SharnnError, ValueError):
    """An unknown preset or key, or an invalid value in a configuration."""


class DataError(SharnnError):
    """A missing, corrupt, wrong-checksum or too-small data file."""


class CheckpointError(SharnnError):
    """A missing or corrupt checkpoint, or one that does not match its configuration."""


class RunError(SharnnError):
    """A run folder that cannot be used: it exists already, or has nothing to resume."""


class TrainingDiverged(SharnnError):
    """The training loss became NaN or infinite, or ran away far above the uniform baseline."""


class Interrupted(SharnnError):
    """A run stopped by Ctrl-C or SIGTERM after saving; it can be resumed. ``exit_code``:
    the process's exit status (128 + the signal number)."""

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code
