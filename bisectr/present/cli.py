"""`bisectr trace | bisect | view`: the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from rich.console import Console
from rich.markup import escape

from . import report
from .exits import (
    EXIT_BUG,
    EXIT_DIVERGENT,
    EXIT_ERROR,
    EXIT_OK,
    exit_interrupted,
    ignore_interrupts,
    interruption_point,
)
from ..adapters import silence_import_warnings
from ..environment import version_text
from ..errors import BisectrError, UserModelError
from ..measure.result import Result
from ..measure.runrecord import DEFAULT_VALUE_BUDGET
from ..serial import to_plain

if TYPE_CHECKING:
    from ..sides.ranks import Rendezvous

# Off a terminal (a pipe, a file) tables are printed at their natural width: no cell cut or wrapped.
UNBOUNDED_WIDTH = 1 << 16

MODEL_FILE_HELP = """\
A model file defines two functions without arguments, each returning (model, inputs):

    def reference():
        import torch
        return TorchNet().eval(), (torch.ones(2, 8),)

    def candidate():
        import paddle
        return PaddleNet(), (paddle.ones([2, 8]),)

model: a torch.nn.Module, a paddle.nn.Layer or any function calling framework ops;
inputs: a tuple of positional arguments or a dict of keyword arguments."""

EXIT_STATUS_HELP = """\
exit status:
  0  match or noise (the outputs agree, or rounding explains their difference)
  1  divergent (something computes differently; the culprit is named)
  2  usage errors, model-file and model errors, refused models, corrupt run directories
  3  a bug in bisectr itself (the message names the log holding its traceback)"""

EXAMPLE_HELP = """\
example:
  bisectr trace examples/span_head.py --no-tui"""


REPORT_HELP = (
    "also write PATH.md (Markdown for an issue) and PATH.html (one self-contained page with the error-by-op "
    "plot, the op table and the repro script)"
)


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_file", metavar="MODEL.py", help="file defining reference() and candidate()")
    parser.add_argument("--reference", default="reference", metavar="NAME", help="function building the reference side")
    parser.add_argument("--candidate", default="candidate", metavar="NAME", help="function building the candidate side")
    parser.add_argument(
        "--value-budget",
        type=float,
        default=DEFAULT_VALUE_BUDGET / 2**20,
        metavar="MB",
        help="op values stored per side (default %(default)g); beyond, only statistics, and the search "
        "fetches layer outputs, then the ops of the layers where the difference enters",
    )
    parser.add_argument(
        "--backward",
        action="store_true",
        help="search the backward pass too: both sides' gradients from one fixed random output gradient "
        "(or from reference_loss(outputs) / candidate_loss(outputs) where the model file defines them)",
    )
    parser.add_argument(
        "--fix-nondeterminism",
        action="store_true",
        help="where a side does not repeat itself because its dropout is on or a random op is unseeded, put it "
        "in eval mode or seed it before each run, trace again and search as usual (the report says so)",
    )
    _add_isolation_arguments(parser)
    _add_ranks_arguments(parser)


def _add_ranks_arguments(parser: argparse.ArgumentParser) -> None:
    for role in ("reference", "candidate"):
        parser.add_argument(
            f"--{role}-nproc",
            type=int,
            metavar="N",
            help=f"run the {role} side on N processes (per node) started by torchrun (tensor or data parallel; "
            "torch.distributed); default: the model file's NPROC for the side's function, else 1",
        )
    nodes = parser.add_argument_group(
        "several machines (torchrun's rendezvous; the candidate's ranks)",
        "Every node runs the same command with its own --node-rank: node 0 searches, the others serve it their ranks.",
    )
    nodes.add_argument("--nnodes", type=int, default=1, metavar="N", help="machines the candidate's ranks run on")
    nodes.add_argument("--node-rank", type=int, default=0, metavar="R", help="this machine's rank among them (0..N-1)")
    nodes.add_argument("--master-addr", metavar="HOST", help="node 0's address (torchrun's store on --master-port)")
    nodes.add_argument(
        "--master-port", type=int, default=29500, metavar="PORT", help="torchrun's store on node 0 (bisectr's: PORT+1)"
    )
    nodes.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="node 0's address and port in one")


def _add_isolation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--isolate", action="store_true", help="run each side's model in its own worker process")
    for role in ("reference", "candidate"):
        parser.add_argument(
            f"--{role}-python",
            metavar="PATH",
            help=f"interpreter (of another virtual environment) for the {role} side; implies --isolate",
        )


def _help_texts(description: str) -> dict:
    return {
        "description": f"{description}\n\n{MODEL_FILE_HELP}",
        "epilog": f"{EXAMPLE_HELP}\n\n{EXIT_STATUS_HELP}",
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }


class _VersionAction(argparse.Action):
    """`--version`: the versions are looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bisectr", **_help_texts("Find where two implementations of a network start to disagree.")
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="show the versions of bisectr, python and the frameworks found, and exit",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    trace = commands.add_parser(
        "trace",
        help="record both sides, align, analyse and show the result",
        **_help_texts("Record both sides, align, analyse and show the result."),
    )
    _add_model_arguments(trace)
    trace.add_argument("-o", "--out", metavar="RUN_DIR", help="run directory to write (default: .bisectr/runs/<model>)")
    trace.add_argument("--no-tui", action="store_true", help="print the text summary even on a terminal")
    trace.add_argument("--stats-only", action="store_true", help="store statistics only, no tensor values (big models)")
    trace.add_argument(
        "--keep-module",
        action="append",
        default=[],
        metavar="PREFIX",
        help="store values only for ops under this module path (repeatable)",
    )
    trace.add_argument("--alignment", action="store_true", help="print the op alignment as a table")
    trace.add_argument("--ops", action="store_true", help="print every paired op with its mean and max difference")
    trace.add_argument(
        "--format",
        choices=("table", "tsv"),
        default="table",
        help="tsv: print only the --ops or --alignment table, tab-separated (for scripts)",
    )
    trace.add_argument("--report", metavar="PATH", help=REPORT_HELP)

    bisect = commands.add_parser(
        "bisect", help="scripted first-divergence search", **_help_texts("The scripted first-divergence search.")
    )
    _add_model_arguments(bisect)
    bisect.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    bisect.add_argument("--exhaustive", action="store_true", help="patch every op instead of searching")
    bisect.add_argument(
        "--repro", metavar="DIR", help="write a standalone script reproducing the culprit op in both frameworks"
    )
    bisect.add_argument("--report", metavar="PATH", help=REPORT_HELP)
    bisect.add_argument(
        "--substitute",
        metavar="OPS",
        help="re-run the candidate with the reference's implementation of these canonical ops "
        "(comma-separated; 'rounding' = every op that is not bit-exact) and report the error",
    )

    train = commands.add_parser(
        "train",
        help="train both sides for N steps and compare them step by step",
        **_help_texts(
            "Train both sides for N steps on the same batches and compare loss, gradients and "
            "updates step by step; name the first step rounding cannot explain, its stage "
            "and culprit.\n\nThe model file adds reference_optimizer(model) and "
            "candidate_optimizer(model) (an optimizer, or (optimizer, scheduler)), and may add "
            "reference_batch(step) / candidate_batch(step) and reference_loss(outputs) / "
            "candidate_loss(outputs)."
        ),
    )
    train.add_argument(
        "model_file", metavar="MODEL.py", help="file defining reference(), candidate() and their optimizers"
    )
    train.add_argument("--reference", default="reference", metavar="NAME", help="function building the reference side")
    train.add_argument("--candidate", default="candidate", metavar="NAME", help="function building the candidate side")
    train.add_argument("--steps", type=int, default=20, metavar="N", help="optimizer steps per side (default 20)")
    train.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    train.add_argument("--no-tui", action="store_true", help="print the text summary even on a terminal")
    train.add_argument(
        "--report",
        metavar="PATH",
        help="also write PATH.md and PATH.html: the result, both loss curves and the per-step errors, for an issue",
    )
    _add_isolation_arguments(train)
    _add_ranks_arguments(train)

    generate = commands.add_parser(
        "generate",
        help="decode greedily on both sides and find the first step, and the op in it, where they part",
        **_help_texts(
            "Decode greedily on both sides, each with its own cache and both fed the reference's tokens "
            "(teacher forcing); judge every step's logits and cache against rounding (float64 runs in "
            "lockstep); search inside the first step that differs, the cache as state.\n\nEach side is a "
            "causal LM (Hugging Face, PaddleFormers, or a forward(input_ids, ..., cache=...) returning "
            "(logits, cache)); its inputs are input_ids and, for left-padded batches, attention_mask."
        ),
    )
    generate.add_argument("model_file", metavar="MODEL.py", help="file defining reference() and candidate()")
    generate.add_argument("--reference", default="reference", metavar="NAME", help="function building the reference")
    generate.add_argument("--candidate", default="candidate", metavar="NAME", help="function building the candidate")
    generate.add_argument(
        "--tokens", type=int, default=16, metavar="N", help="decode steps after the prefill (default 16)"
    )
    generate.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    generate.add_argument("--no-tui", action="store_true", help="print the text summary even on a terminal")
    _add_isolation_arguments(generate)
    _add_ranks_arguments(generate)
    generate.add_argument(
        "--report", metavar="PATH", help="also write PATH.md and PATH.html: the error and margin by step, the culprit"
    )

    written = commands.add_parser(
        "report",
        help="write a saved run up for an issue: Markdown and an HTML page",
        description="Write a saved run up for an issue: RUN_DIR/report.md (or PATH.md), Markdown "
        "that renders in a GitHub issue, and report.html, one self-contained page "
        "with the error-by-op plot (the 'report' extra: bokeh), the op table and the "
        "culprit's repro script.",
    )
    written.add_argument("run_dir", metavar="RUN_DIR")
    written.add_argument("-o", "--out", metavar="PATH", help="write PATH.md and PATH.html (default RUN_DIR/report)")

    view = commands.add_parser("view", help="reopen a saved run")
    view.add_argument("run_dir", metavar="RUN_DIR")
    view.add_argument("--no-tui", action="store_true", help="print the text summary")
    return parser


def main(argv: Sequence[str] | None = None, exit_on_interrupt: bool = False) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "trace" and args.format == "tsv" and (args.ops == args.alignment or args.stats_only):
        parser.error("--format tsv prints one table: give either --ops or --alignment (and no --stats-only)")
    if args.command == "trace" and args.backward and args.stats_only:
        parser.error("--backward searches with stored values: leave out --stats-only")
    silence_import_warnings()
    launched = _launched_as_rank()
    if launched and args.command != "view":
        Console(stderr=True, soft_wrap=True).print(
            f"[bold red]bisectr: error:[/] {launched}", markup=True, highlight=False
        )
        return EXIT_ERROR
    console = Console(soft_wrap=True)
    if not console.is_terminal:
        console.width = UNBOUNDED_WIDTH
    try:
        if getattr(args, "node_rank", 0) > 0:
            return _serve_as_node(args)
        status = COMMANDS[args.command](args, console)
        interruption_point()
        return status
    except BisectrError as exc:
        error_console = Console(stderr=True, soft_wrap=True)
        error_console.print(f"[bold red]bisectr: error:[/] {escape(str(exc))}", markup=True, highlight=False)
        if isinstance(exc, UserModelError) and exc.user_traceback:
            error_console.print(exc.user_traceback, markup=False, highlight=False)
        return EXIT_ERROR
    except KeyboardInterrupt as exc:
        ignore_interrupts()
        Console(stderr=True, soft_wrap=True).print(
            f"bisectr: interrupted; {str(exc) or 'nothing was saved'}", highlight=False
        )
        if exit_on_interrupt:
            exit_interrupted()
        return EXIT_ERROR
    except Exception as exc:  # what bisectr did not expect is its own bug, never a verdict
        return _report_bug(exc)


def _launched_as_rank() -> str | None:
    """Why this process must not search, when a distributed launcher (torchrun, paddle's launch) started
    it as one rank of several: every rank would record only its own shards, compare them with the
    reference's whole tensors and write the same run directory."""
    for launcher, world, rank in (
        ("torchrun", "WORLD_SIZE", "RANK"),
        ("paddle.distributed.launch", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID"),
    ):
        size = os.environ.get(world, "1")
        if size.isdigit() and int(size) > 1:
            return (
                f"started by {launcher} as rank {os.environ.get(rank, '?')} of {size} ({world}={size}): "
                "run bisectr as one process, not under a distributed launcher. "
                "Each rank would compare its own shards with the reference's "
                "whole tensors; for a side that computes on several processes (tensor parallel), give bisectr "
                "--candidate-nproc N and it starts that side's ranks under torchrun itself"
            )
    return None


def _report_bug(exc: Exception) -> int:
    with tempfile.NamedTemporaryFile("w", prefix="bisectr-bug-", suffix=".log", delete=False) as log:
        log.write("".join(traceback.format_exception(exc)))
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]bisectr: internal error:[/] {type(exc).__name__}: {escape(str(exc))}\n"
        f"This is a bug in bisectr, not in your model. Its traceback is in {escape(log.name)}; "
        "please report it with that file.",
        markup=True,
        highlight=False,
    )
    return EXIT_BUG


FAILING = ("divergent", "nondeterministic")  # the verdicts of exit status 1


def _exit_status(result: Result | None) -> int:
    passes = [] if result is None else [result, result.backward]
    return EXIT_DIVERGENT if any(r is not None and r.verdict in FAILING for r in passes) else EXIT_OK


def _search(run, console: Console, exhaustive: bool, quiet: bool, backward: bool, fix_nondeterminism: bool):
    """`run` searched (with `fix_nondeterminism`, the run `steadied` returns): the run its result is in."""
    from ..run import steadied

    def search(run):
        return run.bisect(exhaustive=exhaustive, backward=backward, progress=progress)

    def progress(message: str) -> None:
        interruption_point()
        if status is not None:
            status.update(message)

    with nullcontext() if quiet else console.status("searching") as status:
        if fix_nondeterminism:
            return steadied(run, search)
        search(run)
        return run


class _RecordingText:
    """The status line while the sides are recorded. Rich renders it a dozen times a second from its
    own thread, reading the count of ops recorded so far: the recording does nothing for it."""

    def __init__(self, model_file: str):
        self.model_file = model_file
        self.role: str | None = None
        self.ops: Callable[[], int] | None = None

    def watch(self, role: str, ops: Callable[[], int]) -> None:
        self.role, self.ops = role, ops

    def __rich__(self) -> str:
        return f"loading {self.model_file}" if self.ops is None else f"recording {self.role}: {self.ops()} ops"


@contextmanager
def _recording_status(
    console: Console, model_file: str, quiet: bool
) -> Iterator[Callable[[str, Callable[[], int]], None] | None]:
    """The `watch` argument of `trace`: a status line on `console`, or None (nothing shown) when quiet."""
    if quiet:
        yield None
        return
    text = _RecordingText(model_file)
    with console.status(text) as status:
        yield text.watch
        status.update(text)  # a last frame with the final count, however short the recording was


def _where_sides_run(args: argparse.Namespace) -> dict:
    """`trace`'s arguments saying where each side runs: its own worker, interpreter, ranks and machines."""
    return {
        "isolate": args.isolate,
        "reference_python": args.reference_python,
        "candidate_python": args.candidate_python,
        "reference_nproc": args.reference_nproc,
        "candidate_nproc": args.candidate_nproc,
        "rendezvous": _rendezvous(args),
    }


def _rendezvous(args: argparse.Namespace) -> Rendezvous | None:
    """The machines the candidate's ranks spread over (None: this one only)."""
    from ..sides.ranks import Rendezvous

    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise BisectrError(f"--node-rank must be from 0 to --nnodes - 1 ({args.nnodes - 1}), not {args.node_rank}")
    if args.nnodes == 1:
        return None
    address, port = args.master_addr, args.master_port
    if args.rdzv_endpoint:
        address, _, given = args.rdzv_endpoint.rpartition(":")
        if not address or not given.isdigit():
            raise BisectrError(f"--rdzv-endpoint must be HOST:PORT, not {args.rdzv_endpoint!r}")
        port = int(given)
    if not address:
        raise BisectrError(f"--nnodes {args.nnodes} needs node 0's address: --master-addr HOST or --rdzv-endpoint")
    return Rendezvous(args.nnodes, args.node_rank, address, port)


def _serve_as_node(args: argparse.Namespace) -> int:
    """Node R > 0 of the candidate's machines: serve node 0's bisectr this node's ranks, then exit."""
    from ..capture.modelfile import declared_nproc, load_module
    from ..sides.ranks import serve_node

    rendezvous = _rendezvous(args)
    model_file = Path(args.model_file)
    nproc = args.candidate_nproc or declared_nproc(load_module(model_file), model_file, args.candidate)
    serve_node("candidate", nproc, rendezvous, args.candidate_python)
    return EXIT_OK


def _trace_options(args: argparse.Namespace) -> dict:
    return {**_where_sides_run(args), "value_budget": round(args.value_budget * 2**20)}


def run_trace(args: argparse.Namespace, console: Console) -> int:
    from ..run import trace

    out = Path(args.out) if args.out else Path(".bisectr/runs") / Path(args.model_file).stem
    run = None
    try:
        with _recording_status(console, args.model_file, quiet=not console.is_terminal) as watch:
            run = trace(
                args.model_file,
                args.reference,
                args.candidate,
                out=out,
                store_values=not args.stats_only,
                keep_modules=tuple(args.keep_module),
                watch=watch,
                commit=False,
                **_trace_options(args),
            )
        interruption_point()
        if not args.stats_only:
            run = _search(
                run,
                console,
                exhaustive=False,
                quiet=not console.is_terminal,
                backward=args.backward,
                fix_nondeterminism=args.fix_nondeterminism,
            )
        interruption_point()
        run.save()  # traces, alignment and result land together: until here the previous run stays
        if args.report:
            _write_report(run, args.report, console)
        status = _show_trace(args, console, run)
        interruption_point()
        return status
    except KeyboardInterrupt:
        raise KeyboardInterrupt(_what_is_kept(run, out)) from None
    except BaseException:
        if run is not None:
            run.discard()
        raise


def _what_is_kept(run, out: Path) -> str:
    """After an interruption: drop the run if it was not saved, and say what `out` holds."""
    from ..capture.store import is_run_dir

    if run is not None and run.writer is None:
        return f"the new run was saved in {run.run_dir}"
    if run is not None:
        run.discard()
    return "nothing was saved; " + (
        f"the previous run in {out} is untouched" if is_run_dir(out) else f"{out} holds no run"
    )


def _show_trace(args: argparse.Namespace, console: Console, run) -> int:
    if args.stats_only:
        report.print_trace_summary(console, run)
        console.print("statistics only: no values stored, so no search (trace again without --stats-only)")
        return EXIT_OK
    if args.format == "tsv":
        _print_tables(console, run, args)
        return _exit_status(run.result)
    if console.is_terminal and not args.no_tui:
        from .tui import run_app

        _print_tables(console, run, args)  # still on the terminal when the TUI closes
        run_app(run)
        return _exit_status(run.result)
    report.print_result(console, run, run.result)
    console.print()
    report.print_trace_summary(console, run)
    _print_tables(console, run, args)
    console.print(f"\nrun saved in {run.run_dir}  (reopen with: bisectr view {run.run_dir})", highlight=False)
    return _exit_status(run.result)


def _print_tables(console: Console, run, args: argparse.Namespace) -> None:
    """The tables asked for with --alignment and --ops, in the chosen --format."""
    tsv = args.format == "tsv"
    if args.alignment:
        report.print_alignment(console, run, tsv)
    if args.ops:
        report.print_ops(console, run, run.result, tsv)


def run_bisect(args: argparse.Namespace, console: Console) -> int:
    from ..run import trace

    status_console = Console(stderr=True)
    with _recording_status(status_console, args.model_file, quiet=args.json) as watch:
        run = trace(args.model_file, args.reference, args.candidate, watch=watch, **_trace_options(args))
    run = _search(run, status_console, args.exhaustive, args.json, args.backward, args.fix_nondeterminism)
    searched = run.result
    result = searched.to_dict()
    if args.repro:
        from .repro import NoRepro, write_repro
    if args.repro and searched.culprit is not None:
        try:
            result["repro"] = str(write_repro(run, searched.culprit.candidate.index, args.repro, run.live) / "repro.py")
        except NoRepro as exc:
            result["repro_skipped"] = str(exc)
    backward = searched.backward
    if args.repro and backward is not None and backward.culprit is not None and backward.culprit.kind == "op":
        from .repro import repro_upstream

        culprit = backward.culprit
        upstream = repro_upstream(run.live, culprit.candidate.index, culprit.reference.index)
        where = write_repro(run, culprit.candidate.index, Path(args.repro) / "backward", run.live, upstream)
        result["backward"]["repro"] = str(where / "repro.py")
    substitution = None
    if args.substitute:
        from ..search.substitution import substitute

        substitution = substitute(run.live, _substituted_ops(args.substitute, searched))
        result["substitution"] = to_plain(substitution)
    if args.report:
        result["report"] = [str(path) for path in _write_report(run, args.report, None)]
    if args.json:
        print(json.dumps(result, allow_nan=False))
    else:
        report.print_result(console, run, searched)
        if "report" in result:
            console.print(f"report written: {', '.join(result['report'])}", highlight=False)
        if "repro" in result:
            console.print(f"repro written: python {result['repro']}", highlight=False)
        if "repro_skipped" in result:
            console.print(f"no repro written: {result['repro_skipped']}", highlight=False)
        if "repro" in (result.get("backward") or {}):
            console.print(f"backward repro written: python {result['backward']['repro']}", highlight=False)
        if substitution is not None:
            report.print_substitution(console, result["substitution"])
    return _exit_status(searched)


def _substituted_ops(spec: str, result) -> list[str]:
    """Canonical op names from `--substitute`; 'rounding' names every op whose replay is not bit-exact."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if "rounding" in names:
        names.remove("rounding")
        names += sorted({row.op for row in result.profile if row.verdict in ("noise", "different")})
    return names


def run_report(args: argparse.Namespace, console: Console) -> int:
    from ..run import load

    _write_report(load(args.run_dir), args.out or Path(args.run_dir) / "report", console)
    return EXIT_OK


def _write_report(run, path: str | Path, console: Console | None) -> list[Path]:
    from .writeup import write_report

    return _written(lambda: write_report(run, path), path, console)


def _written(write: Callable[[], list[Path]], path: str | Path, console: Console | None) -> list[Path]:
    """The files `write()` wrote, said on `console`; a path that cannot be written is status 2."""
    try:
        written = write()
    except OSError as exc:
        raise BisectrError(f"{exc.filename or path}: cannot write the report: {exc.strerror or exc}") from None
    if console is not None:
        console.print(f"report written: {', '.join(map(str, written))}", highlight=False)
    return written


def run_view(args: argparse.Namespace, console: Console) -> int:
    from ..run import load

    run = load(args.run_dir)
    if console.is_terminal and not args.no_tui:
        from .tui import run_app

        run_app(run)
        return _exit_status(run.result)
    if run.result is None:
        report.print_trace_summary(console, run)
        console.print("this run holds no search result")
        return EXIT_OK
    report.print_result(console, run, run.result)
    console.print()
    report.print_trace_summary(console, run)
    return _exit_status(run.result)


def run_train(args: argparse.Namespace, console: Console) -> int:
    from ..training import train

    if args.steps < 1:
        raise BisectrError(f"--steps must be at least 1 (got {args.steps})")
    status_console = Console(stderr=True)
    if args.json:
        result = train(args.model_file, args.reference, args.candidate, args.steps, **_where_sides_run(args))
        print(json.dumps(result.to_dict(), allow_nan=False))
    else:
        with status_console.status("training") as status:

            def progress(message: str) -> None:
                interruption_point()
                status.update(message)

            result = train(
                args.model_file, args.reference, args.candidate, args.steps, progress, **_where_sides_run(args)
            )
        if console.is_terminal and not args.no_tui:
            from .tui.training import TrainingApp

            TrainingApp(result, args.model_file).run()
        report.print_training(console, result)  # still on the terminal when the TUI closes
    if args.report:
        from .writeup import write_training_report

        _written(lambda: write_training_report(result, args.model_file, args.report), args.report, Console(stderr=True))
    return EXIT_DIVERGENT if result.verdict in FAILING else EXIT_OK


def run_generate(args: argparse.Namespace, console: Console) -> int:
    from ..generation import generate

    options = _where_sides_run(args)
    if args.json:
        result = generate(args.model_file, args.reference, args.candidate, args.tokens, **options)
    else:
        with Console(stderr=True).status("decoding") as status:

            def progress(message: str) -> None:
                interruption_point()
                status.update(message)

            result = generate(
                args.model_file, args.reference, args.candidate, args.tokens, progress=progress, **options
            )
    document = result.to_dict()
    if args.report:
        from .writeup import write_generation_report

        written = _written(lambda: write_generation_report(result, args.model_file, args.report), args.report, None)
        document["report"] = [str(path) for path in written]
    if args.json:
        print(json.dumps(document, allow_nan=False))
    else:
        if console.is_terminal and not args.no_tui:
            from .tui import run_app
            from .tui.generation import SEARCH, GenerationApp

            if GenerationApp(result, args.model_file).run() == SEARCH:
                run_app(result.run)
        report.print_generation(console, result)  # still on the terminal when the TUI closes
        if "report" in document:
            console.print(f"report written: {', '.join(document['report'])}", highlight=False)
    return EXIT_DIVERGENT if result.verdict in FAILING else EXIT_OK


COMMANDS = {
    "trace": run_trace,
    "bisect": run_bisect,
    "train": run_train,
    "generate": run_generate,
    "report": run_report,
    "view": run_view,
}


if __name__ == "__main__":
    sys.exit(main())
