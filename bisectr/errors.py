"""Errors bisectr reports to the user as a message and exit status 2 (and `InterceptionFailure`, its own: 3)."""

from __future__ import annotations


class BisectrError(Exception):
    """A problem with the user's input, reported without a bisectr traceback."""


class ModelFileError(BisectrError):
    """The model file is missing, malformed, or its functions return the wrong thing."""


class UserModelError(BisectrError):
    """The user's model raised; `user_traceback` holds the user's own frames."""

    def __init__(self, message: str, user_traceback: str = ""):
        super().__init__(message)
        self.user_traceback = user_traceback

    @property
    def raised(self) -> str:
        """What the model raised ("TypeError: ..."), without the message's where and who."""
        return str(self).rsplit(" raised ", 1)[-1]


class RunDirError(BisectrError):
    """A run directory is missing, incomplete or corrupt."""


class TraceMismatchError(BisectrError):
    """A re-run executed a different op sequence than the recording."""


class PathDeparture(TraceMismatchError):
    """A re-run took another path than the recording: other ops, or other shapes from patched values."""


class OutputMismatchError(BisectrError):
    """The two sides' outputs cannot be paired."""


class RunWriteError(RunDirError):
    """Writing a run failed (disk full, I/O error, permissions): nothing of it was saved."""


class UnreadableTensorError(BisectrError):
    """A side's model made a tensor of a class bisectr cannot read (a tensor subclass such as DTensor)."""


class UnrecordedOutputError(BisectrError):
    """A side's outputs were not computed by ops bisectr recorded (another process, a file, numpy)."""


class InterceptionFailure(RuntimeError):
    """The model runs on its own but fails under bisectr's interception: bisectr's failure (exit 3), not the user's."""
