"""`trace`, `load` and `bisect`: runs made, saved and reopened.

A `Run` is a `RunRecord` (plain data, what its run directory holds) that may also be live
(`live`: its sides' runners, which re-runs go through): a run just traced is, a run
loaded from disk never is (opening a run directory imports and starts nothing).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from .adapters import input_layout
from .measure.align import Alignment, Permutation, align_traces
from .measure.leaves import pair_leaves
from .search.backward import BackwardRules
from .search.core import decide
from .search.forward import ForwardRules
from .environment import describe
from .errors import BisectrError, ModelFileError, RunDirError
from .sides.isolate import IsolatedSide
from .capture.modelfile import SideFix, build_side, declared_nproc, load_module
from .sides.ranks import RankedSide, Rendezvous
from .measure.runrecord import DEFAULT_VALUE_BUDGET, HowTraced, OutputPair, RunRecord, pair_outputs
from .capture.recording import RecordOptions
from .measure.result import Result
from .serial import PlainError, from_plain, to_plain
from .sides.runner import Fix, LocalSide, SideRunner, recorded_through
from .measure.live import LiveRun
from .capture.locks import RunLock, interrupts_deferred
from .capture.store import SIDES, RunWriter, read_document, read_manifest, read_trace, save_result
from .capture.trace import Trace

__all__ = ["OutputPair", "Run", "bisect", "how_traced", "load", "record_run", "start_sides", "steadied", "trace"]


@dataclass
class Run(RunRecord):
    live: LiveRun | None = field(default=None, repr=False, compare=False)
    # The run directory being written, until `save` moves it into place (`trace(..., commit=False)`).
    writer: RunWriter | None = field(default=None, repr=False, compare=False)

    @property
    def is_live(self) -> bool:
        """Can ops be replayed and sides re-run (models loaded)?"""
        return self.live is not None

    def bisect(
        self,
        tolerance: float = 0.0,
        exhaustive: bool = False,
        progress: Callable[[str], None] | None = None,
        backward: bool = False,
    ) -> Result:
        """Search for the culprit (re-runs the models); the result is kept in `result` (see `save`).
        With `backward`, the backward pass is searched too (`bisectr.search.backward`): its result is
        the forward result's `backward`. A run loaded from disk runs nothing: `traced_again` first."""
        if self.live is None:
            raise RunDirError(
                f"{self.run_dir}: a saved run runs nothing by itself; to search again, trace it again from "
                f"the model file it was traced from ({self.traced.model_file}): "
                "run.traced_again(model_file).bisect()"
            )
        if progress is not None:
            self.live.say = progress
        result = decide(ForwardRules(self.live), tolerance, exhaustive)
        if backward and result.verdict != "nondeterministic":
            result.backward = decide(
                BackwardRules(self.live, reference_activations=result.verdict == "divergent"), tolerance
            )
        self.result = result
        return result

    def traced_again(self, model_file: str | os.PathLike, **isolation: Any) -> "Run":
        """A new live run of `model_file` as this run was traced (its functions, stored values and
        modules kept), into the same run directory, where it replaces this one once saved (the run
        directory is left as it is until then). `isolation`: the interpreters of isolated sides (see `trace`)."""
        return _traced_as(self.traced, model_file, self.run_dir, False, self.traced.fixes, **isolation)

    def save(self) -> Path:
        """Write the run into its directory: everything at once for a run traced with
        `commit=False` (an interrupted search leaves the previous run there untouched),
        else the result alone (result.json replaced atomically)."""
        if self.writer is not None:
            documents = {
                "pairing": {"output_pairs": to_plain(self.output_pairs), "alignment": to_plain(self.alignment)}
            }
            if self.result is not None:
                documents["result"] = self.result.to_dict()
            manifest = {"run_id": self.run_id, "traced": to_plain(self.traced)}
            with interrupts_deferred():
                self.run_dir = self.writer.commit(self.traces, manifest, documents)
                self.writer = None
        elif self.run_dir is not None and self.result is not None:
            save_result(self.run_dir, self.run_id, self.result.to_dict())
        return self.run_dir

    def discard(self) -> None:
        """Drop a run not saved yet (`commit=False`): its partial directory goes, the previous run stays."""
        if self.writer is not None:
            self.writer.abort()
            self.writer = None


def bisect(
    model_file: str | os.PathLike,
    reference: str = "reference",
    candidate: str = "candidate",
    tolerance: float = 0.0,
    exhaustive: bool = False,
    backward: bool = False,
    fix_nondeterminism: bool = False,
    **isolation: Any,
) -> Result:
    """Trace `model_file` into a temporary run and search for the culprit (`isolation`: see `trace`;
    `backward`: see `Run.bisect`; `fix_nondeterminism`: see `steadied`)."""
    run = trace(model_file, reference, candidate, **isolation)
    search = partial(Run.bisect, tolerance=tolerance, exhaustive=exhaustive, backward=backward)
    return steadied(run, search).result if fix_nondeterminism else search(run)


def steadied(run: Run, search: Callable[[Run], Result]) -> Run:
    """`search(run)`; then, while it finds a side that does not repeat itself for a reason bisectr can take
    away (its dropout on, an unseeded random op: `Nondeterminism.fixable`), the run traced again with
    that taken away (`SideFix`, kept in `HowTraced.fixes`) and searched again. Returns the last run (its
    `result` set), in `run`'s run directory."""
    search(run)
    while (fixes := _more_fixes(run.traced.fixes, run.result)) is not None:
        committed, out = run.writer is None, run.run_dir if run.writer is None else run.writer.final_dir
        run.discard()  # a run not saved yet: the next trace writes its directory
        isolation = {name: getattr(run.traced, name) for name in _ISOLATION}
        run = _traced_as(run.traced, run.traced.model_file, out, committed, fixes, **isolation)
        search(run)
    return run


# The `trace` arguments that say where each side runs, as `HowTraced` keeps them.
_ISOLATION = ("isolate", "reference_python", "candidate_python", "reference_nproc", "candidate_nproc")


def _traced_as(
    traced: HowTraced,
    model_file: str | os.PathLike,
    out: Path | None,
    commit: bool,
    fixes: dict[str, SideFix],
    **isolation: Any,
) -> Run:
    """A new live run of `model_file` recorded as `traced` says (its functions, stored values and modules), into
    `out`, with `fixes` made to its sides first (`isolation`: see `trace`)."""
    return trace(
        model_file,
        traced.reference_fn,
        traced.candidate_fn,
        out=out,
        store_values=traced.store_values,
        keep_modules=tuple(traced.keep_modules),
        value_budget=traced.value_budget,
        commit=commit,
        fixes=fixes,
        **isolation,
    )


def _more_fixes(fixes: dict[str, SideFix], result: Result | None) -> dict[str, SideFix] | None:
    """`fixes` with what `result` says bisectr can do about a side that does not repeat itself; None where that
    is nothing new."""
    if result is None or result.verdict != "nondeterministic":
        return None
    more = {role: replace(fix) for role, fix in fixes.items()}
    for found in result.nondeterminism:
        fix = more.setdefault(found.side, SideFix())
        if found.fixable == "eval":
            fix.eval_mode = True
        elif found.fixable == "seed" and fix.seed is None:
            fix.seed = 0
    return None if more == fixes else more


def trace(
    model_file: str | os.PathLike,
    reference: str = "reference",
    candidate: str = "candidate",
    out: str | os.PathLike | None = None,
    store_values: bool = True,
    keep_modules: tuple[str, ...] = (),
    value_budget: int | None = DEFAULT_VALUE_BUDGET,
    isolate: bool = False,
    reference_python: str | None = None,
    candidate_python: str | None = None,
    reference_nproc: int | None = None,
    candidate_nproc: int | None = None,
    watch: Callable[[str, Callable[[], int]], None] | None = None,
    commit: bool = True,
    fixes: dict[str, SideFix] | None = None,
    rendezvous: Rendezvous | None = None,
) -> Run:
    """Record both sides of `model_file`, pair their outputs and align them, into the run
    directory `out` (a temporary one if None). With `commit=False` nothing is moved into
    place until `Run.save()` (and `Run.discard()` drops it).

    `watch(role, ops)`, for a progress display, is called as each side's recording starts with a
    function returning the number of ops recorded so far (not for an isolated side).

    Op outputs are stored until a side's pass `value_budget` bytes (None: no limit), then only their
    statistics: the search of such a run fetches the values it needs from the live models, layer
    outputs first, then the ops of the layers where the difference enters (`bisectr.search.window`).

    With `isolate`, each side's model runs in its own worker process (`bisectr.sides.isolate`), started
    with `reference_python` / `candidate_python` (default: this interpreter); naming one implies it.
    A side with `reference_nproc` / `candidate_nproc` above 1 runs on that many processes started by
    torchrun (`bisectr.sides.ranks`), as a tensor-parallel model does; None: as many as the model
    file's `NPROC` gives its function (`{"candidate": 2}`), else 1. With `rendezvous` on several nodes, the
    candidate's ranks are `candidate_nproc` per node on each of them, this process node 0's bisectr.

    `fixes` (role -> `SideFix`) are made to the sides before they are recorded (see `steadied`).
    """
    model_file = Path(model_file)
    module = load_module(model_file)
    traced = how_traced(
        module,
        model_file,
        reference,
        candidate,
        isolate,
        reference_python,
        candidate_python,
        reference_nproc,
        candidate_nproc,
        store_values,
        keep_modules,
        value_budget,
        fixes,
        rendezvous,
    )
    run_dir = Path(out) if out is not None else temporary_run_dir(model_file.stem)
    with RunLock(run_dir):  # a run directory another process writes is refused before any model is built
        runners, pins = start_sides(module, model_file, traced, rendezvous)
        return record_run(traced, runners, pins, run_dir, model_file, watch, commit)


def how_traced(
    module: ModuleType,
    model_file: Path,
    reference: str,
    candidate: str,
    isolate: bool = False,
    reference_python: str | None = None,
    candidate_python: str | None = None,
    reference_nproc: int | None = None,
    candidate_nproc: int | None = None,
    store_values: bool = True,
    keep_modules: tuple[str, ...] = (),
    value_budget: int | None = DEFAULT_VALUE_BUDGET,
    fixes: dict[str, SideFix] | None = None,
    rendezvous: Rendezvous | None = None,
) -> HowTraced:
    """How the sides of `model_file` (loaded as `module`) are to be built and recorded (see `trace`)."""
    nprocs = {
        role: declared_nproc(module, model_file, function) if nproc is None else nproc
        for role, function, nproc in (
            ("reference", reference, reference_nproc),
            ("candidate", candidate, candidate_nproc),
        )
    }
    for role, nproc in nprocs.items():
        if nproc < 1:
            raise BisectrError(f"--{role}-nproc must be at least 1, not {nproc}")
    return HowTraced(
        str(model_file.resolve()),
        reference,
        candidate,
        bool(isolate or reference_python or candidate_python),
        reference_python,
        candidate_python,
        store_values,
        list(keep_modules),
        value_budget,
        nprocs["reference"],
        nprocs["candidate"],
        fixes=dict(fixes or {}),
        candidate_nodes=rendezvous.nnodes if rendezvous is not None else 1,
    )


def record_run(
    traced: HowTraced,
    runners: dict[str, SideRunner],
    pins: dict[str, str] | None,
    run_dir: Path,
    label: Path,
    watch: Callable[[str, Callable[[], int]], None] | None = None,
    commit: bool = True,
    output_layouts: dict[str, Permutation] | None = None,
    paired_outputs: dict[str, str] | None = None,
) -> Run:
    """Record both sides through their runners into `run_dir`, pair the outputs and align the
    traces (with `pins`: candidate module -> reference module); see `trace`. `label` names the
    sides' origin in messages (the model file); `output_layouts` and `paired_outputs`: `pair_outputs`'
    `layouts` and `only`."""
    writer = RunWriter(run_dir)
    options = RecordOptions(traced.store_values, tuple(traced.keep_modules), traced.value_budget)
    try:
        traces = {}
        for role, runner in runners.items():
            traces[role] = recorded_through(runner, writer.tensor_writer(role), options, watch and partial(watch, role))
            writer.recorded(role, traces[role])
        reference_trace, candidate_trace = traces["reference"], traces["candidate"]
        traced.environment = describe()  # once the sides ran: their frameworks are loaded, a GPU found
        traced.settings = {role: trace.settings for role, trace in traces.items()}
        output_pairs = pair_outputs(reference_trace, candidate_trace, label, output_layouts, paired_outputs)
        alignment = _align(label, pins, reference_trace, candidate_trace)
        run = Run(uuid.uuid4().hex, traced, reference_trace, candidate_trace, output_pairs, alignment, writer=writer)
        run.live = LiveRun(run, runners)
        if commit:
            run.save()
    except BaseException:
        writer.abort()
        raise
    return run


def start_sides(
    module: ModuleType, model_file: Path, traced: HowTraced, rendezvous: Rendezvous | None = None
) -> tuple[dict[str, SideRunner], dict[str, str] | None]:
    """Each side's runner, and the model file's `ALIGN_MODULES` pins (candidate module -> reference module).
    Sides in other processes build their models while this one builds its own (from `module`, the
    loaded model file); on any failure every process started is stopped. `rendezvous`: the nodes the
    candidate's ranks spread over."""
    pins = getattr(module, "ALIGN_MODULES", None)
    functions = {"reference": traced.reference_fn, "candidate": traced.candidate_fn}
    nprocs = {"reference": traced.reference_nproc, "candidate": traced.candidate_nproc}
    pythons = {"reference": traced.reference_python, "candidate": traced.candidate_python}
    started: dict[str, IsolatedSide | RankedSide] = {}
    try:
        for role, function in functions.items():
            nodes = rendezvous if role == "candidate" and rendezvous is not None and rendezvous.nnodes > 1 else None
            if nprocs[role] > 1 or nodes is not None:
                started[role] = RankedSide(model_file, role, function, nprocs[role], pythons[role], nodes)
            elif traced.isolate:
                started[role] = IsolatedSide(model_file, role, function, pythons[role])
        local = {
            role: LocalSide(build_side(module, model_file, role, function))
            for role, function in functions.items()
            if role not in started
        }
        for runner in started.values():
            runner.wait_built()
        for role, fix in traced.fixes.items():
            (started.get(role) or local[role]).run(Fix(fix))
    except BaseException:
        for runner in started.values():
            runner.abandon()
        raise
    return {role: started.get(role) or local[role] for role in SIDES}, pins


def _align(model_file: Path, pins: dict[str, str] | None, reference: Trace, candidate: Trace) -> Alignment:
    """Align the traces, with the model file's `ALIGN_MODULES` pins (candidate module -> reference module)."""
    traces = {"reference": reference, "candidate": candidate}
    for cand_prefix, ref_prefix in (pins or {}).items():
        for role, prefix in (("candidate", cand_prefix), ("reference", ref_prefix)):
            modules = {op.module for op in traces[role].ops}
            if not any(m == prefix or m.startswith(prefix + ".") for m in modules):
                tops = sorted({m.split(".")[0] for m in modules if m})
                raise ModelFileError(
                    f"{model_file}: ALIGN_MODULES pins {cand_prefix!r} to {ref_prefix!r}, but no "
                    f"op of the {role} ran in a module {prefix!r} (its top-level modules: "
                    f"{', '.join(tops) or 'none'})"
                )
    return pair_leaves(reference, candidate, align_traces(reference, candidate, pins, input_layout))


def load(run_dir: str | os.PathLike) -> Run:
    """Reopen a run directory written by `trace`: JSON and memory-mapped values only (no model
    file is imported, no process started). Anything missing, damaged or inconsistent is a
    `RunDirError` naming the file."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    run_id = manifest.get("run_id")
    if not isinstance(run_id, str):
        raise RunDirError(f"{run_dir / 'manifest.json'}: no run id")
    traced = _from_document(HowTraced, manifest.get("traced"), run_dir / "manifest.json", "traced")
    reference, candidate = (read_trace(run_dir, role, run_id) for role in SIDES)
    pairing = read_document(run_dir, "pairing", run_id)
    if pairing is None:
        raise RunDirError(f"{run_dir / 'pairing.json'}: missing (the run is incomplete)")
    output_pairs = _from_document(
        list[OutputPair], pairing.get("output_pairs"), run_dir / "pairing.json", "output_pairs"
    )
    alignment = _from_document(Alignment, pairing.get("alignment"), run_dir / "pairing.json", "alignment")
    result_document = read_document(run_dir, "result", run_id)
    result = None
    if result_document is not None:
        try:
            result = Result.from_dict(result_document)
        except PlainError as exc:
            raise RunDirError(f"{run_dir / 'result.json'}: {exc}") from None
    run = Run(run_id, traced, reference, candidate, output_pairs, alignment, result, run_dir)
    try:
        run.check()
    except PlainError as exc:
        raise RunDirError(f"{run_dir}: {exc}") from None
    return run


def _from_document(kind: Any, data: Any, path: Path, where: str) -> Any:
    try:
        return from_plain(kind, data, where)
    except PlainError as exc:
        raise RunDirError(f"{path}: {exc}") from None


def temporary_run_dir(name: str) -> Path:
    parent = Path(tempfile.mkdtemp(prefix="bisectr-"))
    atexit.register(shutil.rmtree, parent, True)
    return parent / name
