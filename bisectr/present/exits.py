"""The command's exit statuses, and Ctrl-C: kept out of the import machinery, acted on at the next
interruption point, ending the process with status 2."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import NoReturn

EXIT_OK, EXIT_DIVERGENT, EXIT_ERROR, EXIT_BUG = 0, 1, 2, 3

_interrupt_pending = threading.Event()


def handle_interrupts() -> None:
    """From now on a Ctrl-C raises KeyboardInterrupt, except inside the import machinery."""
    signal.signal(signal.SIGINT, _interrupt)


def ignore_interrupts() -> None:
    """What was kept is being said: the shutdown must not be cut short."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _interrupt(signum: int, frame) -> None:
    """Ctrl-C, as Python's own handler, but never inside the import machinery: an exception raised in
    its module-lock callbacks is printed and ignored, and the interrupt would be lost. There it is
    kept for the next `interruption_point`."""
    if frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        _interrupt_pending.set()
        return
    raise KeyboardInterrupt


def interruption_point() -> None:
    """Act on a Ctrl-C that came while modules were being imported."""
    if _interrupt_pending.is_set():
        _interrupt_pending.clear()
        raise KeyboardInterrupt


def exit_interrupted() -> NoReturn:
    """End the process with status 2 after an interruption. CPython marks a KeyboardInterrupt raised
    inside code that C++ bindings run with `PyRun_String` (torch's and paddle's, while they import)
    as unhandled, even once caught, and its normal exit would then end the process by SIGINT."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_ERROR)
