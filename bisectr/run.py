"""A run: both sides recorded, kept on disk, and (while live) able to re-run."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from .adapters import input_layout
from .align import Alignment, align_traces
from .errors import ModelFileError, OutputMismatchError, RunDirError
from .metrics import error_metrics
from .modelfile import load_module, load_sides
from .recording import Call, RecordOptions, RerunResult
from .sides import LocalSide, SideRunner
from .store import SIDES, RunWriter, read_manifest, read_trace
from .trace import Trace

if TYPE_CHECKING:
    from .bisection import Result


@dataclass
class OutputPair:
    key: str  # the reference's key
    candidate_key: str
    reference: int  # tid
    candidate: int
    metrics: dict[str, float]


@dataclass
class Run:
    model_file: Path
    reference: Trace
    candidate: Trace
    run_dir: Path | None = None
    # Where each side's model runs; present after `trace`, not after `load`.
    runners: dict[str, SideRunner] = field(default_factory=dict)
    saved_result: dict | None = None
    _pairs: list[OutputPair] | None = field(default=None, init=False, repr=False)

    @property
    def traces(self) -> dict[str, Trace]:
        return {"reference": self.reference, "candidate": self.candidate}

    @property
    def is_live(self) -> bool:
        """Can ops be replayed and sides re-run (models loaded)?"""
        return bool(self.runners)

    def output_pairs(self) -> list[OutputPair]:
        if self._pairs is None:
            self._pairs = pair_outputs(self.reference, self.candidate, self.model_file)
        return self._pairs

    def worst_output_error(self, outputs: dict[str, np.ndarray]) -> float:
        """The largest max_rel of `outputs` (keyed like the reference's outputs) against the reference's."""
        worst = 0.0
        for pair in self.output_pairs():
            reference = self.reference.value(pair.reference)
            worst = max(worst, error_metrics(outputs[pair.key].reshape(reference.shape), reference)["max_rel"])
        return worst

    def candidate_output_error(self, outputs: dict[str, np.ndarray]) -> float:
        """`worst_output_error` of outputs keyed like the candidate's."""
        return self.worst_output_error({pair.key: outputs[pair.candidate_key] for pair in self.output_pairs()})

    def output_error(self) -> dict[str, float]:
        """Worst max_abs and max_rel over all paired outputs."""
        pairs = self.output_pairs()
        return {
            "max_abs": max((p.metrics["max_abs"] for p in pairs), default=0.0),
            "max_rel": max((p.metrics["max_rel"] for p in pairs), default=0.0),
        }

    def rerun(self, role: str, patches: dict[int, np.ndarray], capture: set[int] | frozenset = frozenset()) -> RerunResult:
        """Run one side again with `patches` (tid -> values) swapped in; see `PatchedRerun`."""
        return self._runner(role).rerun(self.traces[role], patches, capture)

    @cached_property
    def pins(self) -> dict[str, str] | None:
        """`ALIGN_MODULES` of the model file: candidate module paths pinned to reference ones."""
        if not self.model_file.is_file():
            return None
        return getattr(load_module(self.model_file), "ALIGN_MODULES", None)

    def align(self) -> Alignment:
        self._check_pins()
        return align_traces(self.reference, self.candidate, self.pins, input_layout)

    def _check_pins(self) -> None:
        """Every `ALIGN_MODULES` pin must name a module that ran ops on its side."""
        for cand_prefix, ref_prefix in (self.pins or {}).items():
            for role, prefix in (("candidate", cand_prefix), ("reference", ref_prefix)):
                modules = {op.module for op in self.traces[role].ops}
                if not any(m == prefix or m.startswith(prefix + ".") for m in modules):
                    tops = sorted({m.split(".")[0] for m in modules if m})
                    raise ModelFileError(f"{self.model_file}: ALIGN_MODULES pins {cand_prefix!r} to {ref_prefix!r}, but no "
                                         f"op of the {role} ran in a module {prefix!r} (its top-level modules: "
                                         f"{', '.join(tops) or 'none'})")

    def bisect(self, tolerance: float = 0.0, exhaustive: bool = False, progress=None) -> "Result":
        """Align, analyse and search for the culprit (re-runs the models)."""
        from .bisection import bisect_run

        if not self.is_live:
            fresh = trace(self.model_file, **self._how_traced())
            self.reference, self.candidate, self.runners = fresh.reference, fresh.candidate, fresh.runners
            self._pairs = None
        return bisect_run(self, tolerance, exhaustive, progress)

    def replay(self, role: str, index: int, values: dict[int, np.ndarray], float64: bool = False) -> list[np.ndarray]:
        """Call op `index` of one side again on `values` (tid -> array) for its inputs; see `replay_op`."""
        return self._runner(role).replay(self.traces[role], index, values, float64)

    def call(self, role: str, index: int) -> Call | None:
        """The recorded call of op `index` (function and arguments), when the side is live."""
        return self.runners[role].call(index) if self.is_live else None

    def _runner(self, role: str) -> SideRunner:
        if not self.is_live:
            raise RunDirError(f"{self.run_dir}: a saved run cannot re-run its models; trace the model file again")
        return self.runners[role]

    def _how_traced(self) -> dict:
        """The `trace` arguments that recorded this run (functions, isolation), from its manifest."""
        manifest = read_manifest(self.run_dir) if self.run_dir else {}
        return {"reference": manifest.get("reference_fn", "reference"), "candidate": manifest.get("candidate_fn", "candidate"),
                "isolate": manifest.get("isolate", False), "reference_python": manifest.get("reference_python"),
                "candidate_python": manifest.get("candidate_python")}


def bisect(model_file: str | os.PathLike, reference: str = "reference", candidate: str = "candidate",
           tolerance: float = 0.0, exhaustive: bool = False, **isolation) -> "Result":
    """Trace `model_file` into a temporary run and search for the culprit (`isolation`: see `trace`)."""
    return trace(model_file, reference, candidate, **isolation).bisect(tolerance, exhaustive)


def trace(model_file: str | os.PathLike, reference: str = "reference", candidate: str = "candidate",
          out: str | os.PathLike | None = None, store_values: bool = True, keep_modules: tuple[str, ...] = (),
          isolate: bool = False, reference_python: str | None = None, candidate_python: str | None = None,
          watch: Callable[[str, Callable[[], int]], None] | None = None) -> Run:
    """Record both sides of `model_file` into the run directory `out` (a temporary one if None).

    `watch(role, ops)`, for a progress display, is called as each side's recording starts with a
    function returning the number of ops recorded so far (not for an isolated side).

    With `isolate`, each side's model runs in its own worker process (`bisectr.isolate`), started
    with `reference_python` / `candidate_python` (default: this interpreter); naming one implies it.
    """
    model_file = Path(model_file)
    if isolate or reference_python or candidate_python:
        from .isolate import start_isolated

        runners = start_isolated(model_file, {"reference": reference, "candidate": candidate},
                                 {"reference": reference_python, "candidate": candidate_python})
    else:
        runners = {role: LocalSide(side) for role, side in zip(SIDES, load_sides(model_file, reference, candidate))}
    run_dir = Path(out) if out is not None else _temporary_run_dir(model_file)
    writer = RunWriter(run_dir)
    options = RecordOptions(store_values=store_values, keep_modules=tuple(keep_modules))
    try:
        traces = {role: runner.record(writer.tensor_writer(role), options, watch and partial(watch, role))
                  for role, runner in runners.items()}
        pair_outputs(traces["reference"], traces["candidate"], model_file)
        manifest = {"model_file": str(model_file.resolve()), "reference_fn": reference, "candidate_fn": candidate,
                    "store_values": store_values, "keep_modules": list(keep_modules), "isolate": isolate,
                    "reference_python": reference_python, "candidate_python": candidate_python}
        final_dir = writer.commit(traces, manifest)
    except BaseException:
        writer.abort()
        raise
    return Run(model_file, traces["reference"], traces["candidate"], final_dir, runners)


def load(run_dir: str | os.PathLike) -> Run:
    """Reopen a run directory written by `trace` (values are memory-mapped, models not loaded)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    result_path = run_dir / "result.json"
    saved = None
    if result_path.is_file():
        import json

        saved = json.loads(result_path.read_text())
    return Run(Path(manifest["model_file"]), read_trace(run_dir, "reference"), read_trace(run_dir, "candidate"),
               run_dir, saved_result=saved)


def pair_outputs(reference: Trace, candidate: Trace, model_file: Path) -> list[OutputPair]:
    """Pair flattened outputs by key, then the rest by position; shapes must agree."""
    ref_keys, cand_keys = list(reference.outputs), list(candidate.outputs)
    common = [k for k in ref_keys if k in candidate.outputs]
    ref_rest = [k for k in ref_keys if k not in candidate.outputs]
    cand_rest = [k for k in cand_keys if k not in reference.outputs]
    if len(ref_rest) != len(cand_rest):
        raise OutputMismatchError(
            f"{model_file}: cannot pair the outputs: reference has {ref_keys}, candidate has {cand_keys}")
    keyed = [(k, k) for k in common] + list(zip(ref_rest, cand_rest))
    pairs = []
    for ref_key, cand_key in keyed:
        ref_tid, cand_tid = reference.outputs[ref_key], candidate.outputs[cand_key]
        ref_info, cand_info = reference.tensors[ref_tid], candidate.tensors[cand_tid]
        if ref_info.size != cand_info.size:
            raise OutputMismatchError(f"{model_file}: output {ref_key!r} has shape {list(ref_info.shape)} in the reference "
                                      f"but {cand_key!r} has {list(cand_info.shape)} in the candidate")
        if ref_info.nonfinite:
            raise ModelFileError(f"{model_file}: the reference output {ref_key!r} holds {ref_info.stats['nan']} NaN and "
                                 f"{ref_info.stats['inf']} Inf values; a trusted reference must be finite")
        metrics = _output_metrics(reference, candidate, ref_tid, cand_tid)
        pairs.append(OutputPair(ref_key, cand_key, ref_tid, cand_tid, metrics))
    return pairs


def _output_metrics(reference: Trace, candidate: Trace, ref_tid: int, cand_tid: int) -> dict[str, float]:
    if reference.has_value(ref_tid) and candidate.has_value(cand_tid):
        ref_values = reference.value(ref_tid)
        return error_metrics(candidate.value(cand_tid).reshape(ref_values.shape), ref_values)
    return {"max_abs": float("nan"), "mean_abs": float("nan"), "max_rel": float("nan"), "cosine": float("nan")}


def _temporary_run_dir(model_file: Path) -> Path:
    parent = Path(tempfile.mkdtemp(prefix="bisectr-"))
    atexit.register(shutil.rmtree, parent, True)
    return parent / model_file.stem
