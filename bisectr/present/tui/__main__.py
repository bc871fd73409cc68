"""`python -m bisectr.present.tui RUN_DIR`: open a saved run in the TUI."""

from __future__ import annotations

import argparse
import sys

from ...errors import BisectrError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bisectr.present.tui", description="Browse a saved bisectr run.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `bisectr trace`")
    args = parser.parse_args(argv)
    from ...run import load
    from . import run_app

    try:
        return run_app(load(args.run_dir))
    except BisectrError as exc:
        print(f"bisectr: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
