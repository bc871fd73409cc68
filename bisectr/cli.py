"""`bisectr trace | bisect | view`: the command line."""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Sequence

from rich.console import Console

from . import report
from .report import json_safe
from .errors import BisectrError, UserModelError
from .store import save_result

EXIT_OK, EXIT_DIVERGENT, EXIT_ERROR = 0, 1, 2


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_file", metavar="MODEL.py", help="file defining reference() and candidate()")
    parser.add_argument("--reference", default="reference", metavar="NAME", help="function building the reference side")
    parser.add_argument("--candidate", default="candidate", metavar="NAME", help="function building the candidate side")
    parser.add_argument("--isolate", action="store_true", help="run each side's model in its own worker process")
    for role in ("reference", "candidate"):
        parser.add_argument(f"--{role}-python", metavar="PATH",
                            help=f"interpreter (of another virtual environment) for the {role} side; implies --isolate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bisectr", description="Find where two implementations of a network start to disagree.")
    commands = parser.add_subparsers(dest="command", required=True)

    trace = commands.add_parser("trace", help="record both sides, align, analyse and show the result")
    _add_model_arguments(trace)
    trace.add_argument("-o", "--out", metavar="RUN_DIR", help="run directory to write (default: .bisectr/runs/<model>)")
    trace.add_argument("--no-tui", action="store_true", help="print the text summary even on a terminal")
    trace.add_argument("--stats-only", action="store_true", help="store statistics only, no tensor values (big models)")
    trace.add_argument("--keep-module", action="append", default=[], metavar="PREFIX",
                       help="store values only for ops under this module path (repeatable)")
    trace.add_argument("--alignment", action="store_true", help="print the op alignment as a table")
    trace.add_argument("--ops", action="store_true", help="print every paired op with its mean and max difference")

    bisect = commands.add_parser("bisect", help="scripted first-divergence search")
    _add_model_arguments(bisect)
    bisect.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    bisect.add_argument("--exhaustive", action="store_true", help="patch every op instead of searching")
    bisect.add_argument("--repro", metavar="DIR", help="write a standalone script reproducing the culprit op in both frameworks")
    bisect.add_argument("--substitute", metavar="OPS",
                        help="re-run the candidate with the reference's implementation of these canonical ops "
                             "(comma-separated; 'rounding' = every op that is not bit-exact) and report the error")

    view = commands.add_parser("view", help="reopen a saved run")
    view.add_argument("run_dir", metavar="RUN_DIR")
    view.add_argument("--no-tui", action="store_true", help="print the text summary")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore", message="No ccache found")  # printed by paddle on import
    console = Console(soft_wrap=True)
    try:
        return COMMANDS[args.command](args, console)
    except BisectrError as exc:
        error_console = Console(stderr=True, soft_wrap=True)
        error_console.print(f"[bold red]bisectr: error:[/] {exc}", markup=True, highlight=False)
        if isinstance(exc, UserModelError) and exc.user_traceback:
            error_console.print(exc.user_traceback, markup=False, highlight=False)
        return EXIT_ERROR
    except KeyboardInterrupt:
        Console(stderr=True, soft_wrap=True).print("bisectr: interrupted; nothing was saved")
        return EXIT_ERROR


def _exit_status(result: dict) -> int:
    return EXIT_DIVERGENT if result["verdict"] == "divergent" else EXIT_OK


def _search(run, console: Console, exhaustive: bool, quiet: bool):
    if quiet:
        return run.bisect(exhaustive=exhaustive)
    with console.status("searching") as status:
        return run.bisect(exhaustive=exhaustive, progress=lambda message: status.update(message))


def _isolation(args: argparse.Namespace) -> dict:
    return {"isolate": args.isolate, "reference_python": args.reference_python, "candidate_python": args.candidate_python}


def run_trace(args: argparse.Namespace, console: Console) -> int:
    from .run import trace

    out = Path(args.out) if args.out else Path(".bisectr/runs") / Path(args.model_file).stem
    run = trace(args.model_file, args.reference, args.candidate, out=out,
                store_values=not args.stats_only, keep_modules=tuple(args.keep_module), **_isolation(args))
    report.print_trace_summary(console, run)
    if args.stats_only:
        console.print("statistics only: no values stored, so no search (trace again without --stats-only)")
        return EXIT_OK
    result = _search(run, console, exhaustive=False, quiet=not console.is_terminal)
    if args.alignment:
        report.print_alignment(console, run, result.alignment)
    saved = json_safe(result.to_dict())
    if args.ops:
        report.print_ops(console, run, saved)
    save_result(run.run_dir, saved)
    if console.is_terminal and not args.no_tui:
        from .tui import run_app

        run_app(run, result)
        return _exit_status(run.saved_result or saved)
    report.print_result(console, run, saved)
    console.print(f"\nrun saved in {run.run_dir}  (reopen with: bisectr view {run.run_dir})", highlight=False)
    return _exit_status(saved)


def run_bisect(args: argparse.Namespace, console: Console) -> int:
    from .run import trace

    run = trace(args.model_file, args.reference, args.candidate, **_isolation(args))
    searched = _search(run, Console(stderr=True), args.exhaustive, quiet=args.json)
    result = json_safe(searched.to_dict())
    if args.repro and searched.culprit is not None:
        from .repro import write_repro

        where = write_repro(run, searched.alignment, searched.culprit["candidate"]["index"], args.repro)
        result["repro"] = str(where / "repro.py")
    if args.substitute:
        from .substitution import substitute

        chosen = _substituted_ops(args.substitute, result)
        result["substitution"] = json_safe(substitute(run, searched.alignment, chosen).to_dict())
    if args.json:
        print(json.dumps(result))
    else:
        report.print_result(console, run, result)
        if "repro" in result:
            console.print(f"repro written: python {result['repro']}", highlight=False)
        if "substitution" in result:
            report.print_substitution(console, result["substitution"])
    return _exit_status(result)


def _substituted_ops(spec: str, result: dict) -> list[str]:
    """Canonical op names from `--substitute`; 'rounding' names every op whose replay is not bit-exact."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if "rounding" in names:
        names.remove("rounding")
        names += sorted({row["op"] for row in result["profile"] if row["verdict"] in ("noise", "different")})
    return names


def run_view(args: argparse.Namespace, console: Console) -> int:
    from .run import load

    run = load(args.run_dir)
    if console.is_terminal and not args.no_tui:
        from .tui import run_app

        run_app(run)
        return _exit_status(run.saved_result) if run.saved_result else EXIT_OK
    report.print_trace_summary(console, run)
    if run.saved_result is None:
        console.print("this run holds no search result")
        return EXIT_OK
    report.print_result(console, run, run.saved_result)
    return _exit_status(run.saved_result)


COMMANDS = {"trace": run_trace, "bisect": run_bisect, "view": run_view}


if __name__ == "__main__":
    sys.exit(main())
