"""A run as a plain record: both traces, their outputs paired, the alignment and the
search's result, tied together by one run id. What a run directory holds, and all that
a view needs: a record never imports a model file or starts a process (the live
ability to re-run is `sides.Sides`, a separate handle).
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .align import Alignment, Permutation
from ..errors import ModelFileError, OutputMismatchError
from .metrics import UNKNOWN, ErrorMetrics, OutputError, error_metrics
from .numerics import magnitude, relative_to
from .result import Result, SettingDifference
from ..serial import PlainError
from ..capture.modelfile import SideFix
from ..capture.trace import Trace, is_floating

LAYOUT_CONFIRMED = 0.5  # outputs of different shapes pair through a layout that brings them within this max_rel
MAX_OUTPUT_DIMS = 6  # outputs with more dimensions are never permuted to find a layout


DEFAULT_VALUE_BUDGET = 256 * 2**20  # bytes of op outputs stored per side: beyond, the search goes by layer windows


@dataclass
class HowTraced:
    """The `trace` arguments that recorded a run (shown to the user, never run from a saved run)."""

    model_file: str
    reference_fn: str = "reference"
    candidate_fn: str = "candidate"
    isolate: bool = False
    reference_python: str | None = None
    candidate_python: str | None = None
    store_values: bool = True
    keep_modules: list[str] = field(default_factory=list)
    value_budget: int | None = None  # bytes of op outputs stored per side (see `trace`)
    reference_nproc: int = 1  # processes torchrun ran the side on (`bisectr.sides.ranks`)
    candidate_nproc: int = 1  # per node, on `candidate_nodes` machines
    candidate_nodes: int = 1
    environment: dict[str, str | None] = field(default_factory=dict)  # `environment.describe()` where it was traced
    settings: dict[str, dict[str, str]] = field(default_factory=dict)  # each side's `Trace.settings`
    fixes: dict[str, SideFix] = field(default_factory=dict)  # what `--fix-nondeterminism` changed in each side


@dataclass
class OutputPair:
    key: str  # the reference's key
    candidate_key: str
    reference: int  # tid
    candidate: int
    metrics: ErrorMetrics
    # The permutation turning the candidate's values into the reference's layout (None: the same
    # data order, reshaped), when their shapes differ and the values confirmed it.
    layout: Permutation = None

    def in_reference_layout(self, values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Candidate values of this output, in the reference's shape and layout."""
        return in_layout(values, self.layout, shape)

    def in_candidate_layout(self, values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Reference values of this output, in the candidate's shape and layout."""
        if self.layout is not None:
            values = np.transpose(values.reshape(_squeezed(values.shape)), np.argsort(self.layout))
        return np.ascontiguousarray(values).reshape(shape)


def in_layout(values: np.ndarray, layout: Permutation, shape: tuple[int, ...]) -> np.ndarray:
    """`values` with their squeezed dimensions permuted by `layout` (None: as they are), reshaped to `shape`."""
    if layout is not None:
        values = np.transpose(values.reshape(_squeezed(values.shape)), layout)
    return np.ascontiguousarray(values).reshape(shape)


@dataclass
class RunRecord:
    run_id: str
    traced: HowTraced
    reference: Trace
    candidate: Trace
    output_pairs: list[OutputPair]
    alignment: Alignment
    result: Result | None = None
    run_dir: Path | None = None

    @property
    def traces(self) -> dict[str, Trace]:
        return {"reference": self.reference, "candidate": self.candidate}

    @property
    def model_file(self) -> Path:
        return Path(self.traced.model_file)

    def settings_differ(self) -> list[SettingDifference]:
        """The numerics settings (`Trace.settings`) both sides name and ran with different values of."""
        reference, candidate = self.reference.settings, self.candidate.settings
        return [
            SettingDifference(name, reference[name], candidate[name])
            for name in reference
            if name in candidate and reference[name] != candidate[name]
        ]

    def worst_output_error(self, outputs: dict[str, np.ndarray]) -> float:
        """The largest max_rel of `outputs` (keyed like the reference's outputs) against the reference's."""
        worst = 0.0
        for pair in self.output_pairs:
            reference = self.reference.value(pair.reference)
            worst = max(worst, error_metrics(outputs[pair.key].reshape(reference.shape), reference).max_rel)
        return worst

    def candidate_output_error(self, outputs: dict[str, np.ndarray]) -> float:
        """`worst_output_error` of outputs keyed like the candidate's."""
        in_layout = {}
        for pair in self.output_pairs:
            shape = self.reference.tensors[pair.reference].shape
            in_layout[pair.key] = pair.in_reference_layout(outputs[pair.candidate_key], shape)
        return self.worst_output_error(in_layout)

    def candidate_output_change(self, outputs: dict[str, np.ndarray]) -> float:
        """How far `outputs` (keyed like the candidate's) moved from the candidate's own: the largest
        max_abs against the reference output's magnitude, so that it reads as a share of the error."""
        worst = 0.0
        for pair in self.output_pairs:
            own = self.candidate.value(pair.candidate)
            moved = error_metrics(outputs[pair.candidate_key].reshape(own.shape), own).max_abs
            worst = max(worst, relative_to(moved, magnitude(self.reference.value(pair.reference))))
        return worst

    def output_error(self) -> OutputError:
        """Worst max_abs and max_rel over all paired outputs."""
        return OutputError(
            max((p.metrics.max_abs for p in self.output_pairs), default=0.0),
            max((p.metrics.max_rel for p in self.output_pairs), default=0.0),
        )

    def check(self) -> None:
        """Raise `PlainError` when the output pairs, the alignment or the result name ops or
        tensors the traces do not have (a crafted or mismatched run directory)."""
        ops = {role: len(trace.ops) for role, trace in self.traces.items()}

        def op_index(role: str, index: int | None, where: str) -> None:
            if index is not None and not 0 <= index < ops[role]:
                raise PlainError(where, f"names {role} op {index}; the {role} has {ops[role]} ops")

        def tensor(role: str, tid: int, where: str) -> None:
            if tid not in self.traces[role].tensors:
                raise PlainError(where, f"names {role} tensor {tid}, which its trace does not have")

        for i, pair in enumerate(self.output_pairs):
            tensor("reference", pair.reference, f"output_pairs[{i}].reference")
            tensor("candidate", pair.candidate, f"output_pairs[{i}].candidate")
        for i, op_pair in enumerate(self.alignment.pairs):
            op_index("candidate", op_pair.candidate, f"alignment.pairs[{i}].candidate")
            op_index("reference", op_pair.reference, f"alignment.pairs[{i}].reference")
        for i, block in enumerate(self.alignment.blocks):
            for role in ("candidate", "reference"):
                for index in getattr(block, role):
                    op_index(role, index, f"alignment.blocks[{i}].{role}")
        for tid, tensor_pair in self.alignment.tensors.items():
            tensor("candidate", tid, f"alignment.tensors.{tid}")
            tensor("reference", tensor_pair.reference, f"alignment.tensors.{tid}.reference")
        if self.result is not None:
            _check_result_ops(self.result, op_index)
            if self.result.backward is not None:
                _check_result_ops(self.result.backward, op_index)


def _check_result_ops(result: Result, op_index: Callable[[str, int | None, str], None]) -> None:
    """Every op index the result names exists on its side."""
    culprit = result.culprit
    if culprit is not None:
        op_index("candidate", culprit.candidate.index, "result.culprit.candidate.index")
        op_index("reference", culprit.reference.index, "result.culprit.reference.index")
        for role in ("candidate", "reference"):
            for index in getattr(culprit.block, role, []) if culprit.block else []:
                op_index(role, index, f"result.culprit.block.{role}")
    for i, row in enumerate(result.profile):
        op_index("candidate", row.index, f"result.profile[{i}].index")
        op_index("reference", row.reference, f"result.profile[{i}].reference")
    listed = [("recurrences", r.index) for r in result.recurrences] + [
        ("not_blamed", n.index) for n in result.not_blamed
    ]
    listed += [("cuts", c.op) for c in result.cuts] + [("entry", result.entry)]
    if result.confirmation is not None:
        listed += [("confirmation.patched_ops", i) for i in result.confirmation.patched_ops]
    if result.bracket is not None:
        listed += [("bracket.low", result.bracket.low), ("bracket.high", result.bracket.high)]
        listed += [("bracket.candidate", s.index) for s in result.bracket.candidate]
        for site in result.bracket.reference:
            op_index("reference", site.index, "result.bracket.reference")
    if result.nonfinite is not None and result.nonfinite.first is not None:
        listed.append(("nonfinite.first", result.nonfinite.first.index))
    for where, index in listed:
        op_index("candidate", index, f"result.{where}")


def pair_outputs(
    reference: Trace,
    candidate: Trace,
    model_file: Path,
    layouts: dict[str, Permutation] | None = None,
    only: dict[str, str] | None = None,
) -> list[OutputPair]:
    """Pair flattened outputs by key, then the rest by position; with `only` (reference key -> candidate key), those
    pairs alone (a decoding step's logits and the cache entries that pair whole). Sizes must agree; shapes that
    differ pair only through a layout the values confirm, or the one `layouts` gives by candidate key."""
    ref_keys, cand_keys = list(reference.outputs), list(candidate.outputs)
    if only is None:
        keyed = _keyed_outputs(ref_keys, cand_keys, model_file)
    else:
        keyed = list(only.items())
        missing = [k for k in only if k not in ref_keys] + [k for k in only.values() if k not in cand_keys]
        if missing:
            raise OutputMismatchError(
                f"{model_file}: cannot pair the outputs {missing}: reference has {ref_keys}, candidate has {cand_keys}"
            )
    pairs = []
    for ref_key, cand_key in keyed:
        ref_tid, cand_tid = reference.outputs[ref_key], candidate.outputs[cand_key]
        ref_info, cand_info = reference.tensors[ref_tid], candidate.tensors[cand_tid]
        shapes = (
            f"output {ref_key!r} has shape {list(ref_info.shape)} in the reference but {cand_key!r} has "
            f"{list(cand_info.shape)} in the candidate"
        )
        if ref_info.size != cand_info.size:
            raise OutputMismatchError(f"{model_file}: {shapes}")
        if ref_info.nonfinite:
            raise ModelFileError(
                f"{model_file}: the reference output {ref_key!r} holds {ref_info.stats.nan} NaN and "
                f"{ref_info.stats.inf} Inf values; a trusted reference must be finite"
            )
        pair = OutputPair(ref_key, cand_key, ref_tid, cand_tid, {})
        if reference.has_value(ref_tid) and candidate.has_value(cand_tid):
            ref_values, cand_values = reference.value(ref_tid), candidate.value(cand_tid)
            if cand_key in (layouts or {}):
                pair.layout = layouts[cand_key]
            elif _squeezed(ref_info.shape) != _squeezed(cand_info.shape):
                pair.layout = _confirmed_layout(cand_values, ref_values, f"{model_file}: {shapes}")
            pair.metrics = error_metrics(pair.in_reference_layout(cand_values, ref_values.shape), ref_values)
        else:
            pair.metrics = UNKNOWN
        pairs.append(pair)
    return pairs


def _keyed_outputs(ref_keys: list[str], cand_keys: list[str], model_file: Path) -> list[tuple[str, str]]:
    """The outputs to pair, (reference key, candidate key): those both sides name, then the rest by position."""
    common = [k for k in ref_keys if k in cand_keys]
    ref_rest = [k for k in ref_keys if k not in cand_keys]
    cand_rest = [k for k in cand_keys if k not in ref_keys]
    if len(ref_rest) != len(cand_rest) and not (common and (not ref_rest or not cand_rest)):
        raise OutputMismatchError(
            f"{model_file}: cannot pair the outputs: reference has {ref_keys}, candidate has {cand_keys}"
        )
    # Where one side's keys are all the other's, the outputs both have are compared (`unpaired_outputs`).
    return [(k, k) for k in common] + (list(zip(ref_rest, cand_rest)) if len(ref_rest) == len(cand_rest) else [])


def unpaired_outputs(run: RunRecord) -> dict[str, list[str]]:
    """Each side's output keys that no output of the other side is compared with."""
    compared = {
        "reference": {p.key for p in run.output_pairs},
        "candidate": {p.candidate_key for p in run.output_pairs},
    }
    return {role: [k for k in trace.outputs if k not in compared[role]] for role, trace in run.traces.items()}


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _confirmed_layout(candidate: np.ndarray, reference: np.ndarray, shapes: str) -> Permutation:
    """The permutation of the candidate's (squeezed) dimensions under which its values are
    closest to the reference's, when that brings them within `LAYOUT_CONFIRMED` and no other
    layout comes as close; else an `OutputMismatchError` saying what was tried."""
    tried = layouts_by_error(candidate, reference)
    if tried and tried[0][0] <= LAYOUT_CONFIRMED and (len(tried) == 1 or tried[1][0] > tried[0][0]):
        return tried[0][1]
    errors = (
        ", ".join(f"transposed {list(layout)}: max_rel {error:.3g}" for error, layout in tried) or "no transpose fits"
    )
    raise OutputMismatchError(
        f"{shapes}, and no layout of the candidate's values matches the reference's ({errors}); "
        "return the outputs in the same shape"
    )


def layouts_by_error(candidate: np.ndarray, reference: np.ndarray) -> list[tuple[float, Permutation]]:
    """Each permutation of the candidate's squeezed dimensions that gives the reference's squeezed shape,
    with the relative error of the candidate's values laid out so, closest first."""
    cand_shape, ref_shape = _squeezed(candidate.shape), _squeezed(reference.shape)
    tried = []
    if len(cand_shape) <= MAX_OUTPUT_DIMS:
        for layout in itertools.permutations(range(len(cand_shape))):
            if tuple(cand_shape[i] for i in layout) == ref_shape:
                values = np.transpose(candidate.reshape(cand_shape), layout).reshape(reference.shape)
                tried.append((error_metrics(values, reference).max_rel, layout))
    return sorted(tried)


def output_seeds(run: RunRecord) -> dict[str, dict[str, np.ndarray]]:
    """The gradient each side's backward starts from, per output key: one fixed random tensor per
    paired floating output (seeded by the output's key), in each side's layout."""
    seeds: dict[str, dict[str, np.ndarray]] = {"reference": {}, "candidate": {}}
    for pair in run.output_pairs:
        ref_info, cand_info = run.reference.tensors[pair.reference], run.candidate.tensors[pair.candidate]
        if not (is_floating(ref_info.dtype) and is_floating(cand_info.dtype)):
            continue
        values = np.random.default_rng(zlib.crc32(pair.key.encode())).standard_normal(ref_info.shape)
        seeds["reference"][pair.key] = values
        seeds["candidate"][pair.candidate_key] = pair.in_candidate_layout(values, cand_info.shape)
    return seeds
