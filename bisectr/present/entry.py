"""The `bisectr` command's entry: Ctrl-C is handled from its first line, before the heavy imports."""

from __future__ import annotations

import sys
from typing import NoReturn

from .exits import exit_interrupted, handle_interrupts, ignore_interrupts, interruption_point


def program() -> NoReturn:
    """The `bisectr` command: the command line's `main`, then exit with its status (the work is done
    and said: a Ctrl-C during the interpreter's shutdown no longer changes the status)."""
    handle_interrupts()
    try:
        from .cli import main

        interruption_point()
    except KeyboardInterrupt:
        ignore_interrupts()
        sys.stderr.write("bisectr: interrupted while starting; nothing was saved\n")
        exit_interrupted()
    status = main(exit_on_interrupt=True)
    ignore_interrupts()
    sys.exit(status)
