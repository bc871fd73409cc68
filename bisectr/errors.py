"""Errors bisectr reports to the user as a message and exit status 2."""
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


class RunDirError(BisectrError):
    """A run directory is missing, incomplete or corrupt."""


class TraceMismatchError(BisectrError):
    """A re-run executed a different op sequence than the recording."""


class OutputMismatchError(BisectrError):
    """The two sides' outputs cannot be paired."""


class RunWriteError(RunDirError):
    """Writing a run failed (disk full, I/O error, permissions): nothing of it was saved."""
