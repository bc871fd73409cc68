"""The interactive Textual TUI of bisectr.

Entry point: `run_app(run) -> int` (see `bisectr.present.tui.app.run_app`). `python -m bisectr.present.tui RUN_DIR`
opens a saved run.
"""

from __future__ import annotations

from ...errors import BisectrError


def run_app(run) -> int:
    """Open the TUI on `run` (a `bisectr.Run`: its result, alignment and, when live, its sides).

    Returns 0 when the user quits. Raises `BisectrError` when Textual is not installed.
    """
    try:
        from .app import run_app as _run_app
    except ImportError as exc:  # an environment that installed bisectr without its dependencies
        if "textual" not in str(exc):
            raise
        raise BisectrError("the TUI needs Textual: pip install textual (or use --no-tui)") from None
    return _run_app(run)


__all__ = ["run_app"]
