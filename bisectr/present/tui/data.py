"""What the TUI shows, computed without Textual: op rows, the module tree, tensor
statistics, error heat maps, source context, patch-and-re-run and repro export.

`RunData` wraps a `Run`: its traces, alignment and result as saved (nothing is
recomputed, nothing imported); its sides, when live, for replays and re-runs.
"""

from __future__ import annotations

import linecache
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ...capture.trace import TensorStats
from ...measure.align import Alignment
from ...measure.analysis import Analysis
from ...errors import BisectrError
from ...measure.metrics import Float64Evidence
from ..repro import write_repro
from ..writeup import write_report
from ..report import short_source
from ...measure.result import Result
from ...run import Run

# Worst first; "block" (inside a matched N:M block) and "unaligned" ops carry no evidence.
SEVERITY = {"different": 5, "noise": 4, "unknown": 3, "unaligned": 2, "block": 1, "exact": 0, "": 0}
# Theme variables (Textual) for verdict text.
VERDICT_VARIABLE = {
    "different": "text-error",
    "divergent": "text-error",
    "nondeterministic": "text-error",
    "noise": "text-warning",
    "exact": "text-success",
    "match": "text-success",
}
HEAT_LEVELS = " ·░▒▓█"
CONTEXT_LINES = 2


def fmt_shape(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


@dataclass
class ShownEvidence:
    """What the op detail shows of one op's evidence: the culprit's from the result, any op's
    replayed on a live run. Numbers that are not finite show as n/a (None)."""

    local_error: float | None
    fp64: Float64Evidence | None
    verdict: str
    input_error: float | None
    output_error: float | None  # absolute
    amplification: float | None
    fp64_unavailable: str | None = None  # why there is no `fp64`: an op without a float64 kernel

    def __post_init__(self) -> None:
        for name in ("local_error", "input_error", "output_error", "amplification"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                setattr(self, name, None)


@dataclass
class OpRow:
    """One candidate op, with its reference partner and the search's evidence."""

    index: int
    op: str
    framework_op: str
    module: str
    shape: tuple[int, ...]
    source: str
    output_error: float | None = None  # relative, propagated
    local_error: float | None = None
    amplification: float | None = None
    verdict: str = ""
    reference: int | None = None
    reference_op: str = ""
    reference_module: str = ""
    reference_source: str = ""

    @property
    def severity(self) -> int:
        return SEVERITY.get(self.verdict, 0)

    def search_text(self) -> str:
        return " ".join(
            (
                str(self.index),
                self.op,
                self.framework_op,
                self.module or "(top)",
                self.verdict,
                short_source(self.source),
                self.reference_op,
                short_source(self.reference_source),
            )
        ).lower()

    def matches(self, query: str) -> bool:
        """Every word of `query` occurs in the row (case-insensitive); `#7` matches op 7 only."""
        text = self.search_text()
        for word in query.lower().split():
            if word.startswith("#") and word[1:].isdigit():
                if int(word[1:]) != self.index:
                    return False
            elif word not in text:
                return False
        return True


@dataclass
class ModuleNode:
    name: str
    path: str
    children: dict[str, "ModuleNode"] = field(default_factory=dict)
    ops: list[int] = field(default_factory=list)  # every op in the subtree
    worst: str = ""
    max_error: float | None = None


@dataclass
class HeatMap:
    cells: np.ndarray  # rows x cols of mean |candidate - reference| per block
    max_abs: float  # the largest single difference
    shape: tuple[int, ...]
    block: tuple[int, int]  # elements per cell (rows, cols), at most
    argmax: tuple[int, ...]  # index of the largest difference in the tensor
    candidate_value: float
    reference_value: float

    def lines(self) -> list[str]:
        """Shaded cells, two characters per cell, level proportional to the block's mean difference
        (relative to the largest block mean)."""
        top = float(np.max(self.cells[np.isfinite(self.cells)], initial=0.0))
        out = []
        for row in self.cells:
            chars = []
            for value in row:
                if not np.isfinite(value):
                    chars.append("!!")
                    continue
                level = 0 if top <= 0 or value <= 0 else 1 + int(round(value / top * (len(HEAT_LEVELS) - 2)))
                chars.append(HEAT_LEVELS[min(level, len(HEAT_LEVELS) - 1)] * 2)
            out.append("".join(chars))
        return out


@dataclass
class TensorRow:
    side: str
    role: str  # "in 0", "out 0"
    name: str  # leaf name or "op N"
    shape: tuple[int, ...]
    dtype: str
    stats: TensorStats
    error: float | None  # max relative error vs the paired tensor (candidate rows)
    stored: bool


def source_context(source: str, lines: int = CONTEXT_LINES) -> list[tuple[int, str, bool]]:
    """(line number, text, is the op's line) around `path:line`; empty when unreadable."""
    path, _, line = source.rpartition(":")
    if not path or not line.isdigit():
        return []
    target = int(line)
    out = []
    for number in range(max(1, target - lines), target + lines + 1):
        text = linecache.getline(path, number)
        if not text and number > target:
            break
        out.append((number, text.rstrip("\n").expandtabs(4), number == target))
    return out if any(current and text for _, text, current in out) else []


class RunData:
    """A run, its result and the op pairing, ready for display."""

    def __init__(self, run: Run, backward: bool = False):
        self.run = run
        self.backward = backward and self.has_backward  # the backward pass's result shown instead of the forward's
        self.refresh()

    @property
    def alignment(self) -> Alignment:
        return self.run.alignment

    # -- building ---------------------------------------------------------------
    def refresh(self) -> None:
        """Rebuild what is shown from the run (after a search changed its result)."""
        self.result: Result | None = self.run.result.backward if self.backward else self.run.result
        # Pairing evidence on demand (nothing is replayed until asked for).
        self.analysis = Analysis(self.run.live or self.run)
        self.rows = self._rows()
        self.by_index = {row.index: row for row in self.rows}
        self.tree = self._module_tree()

    def _rows(self) -> list[OpRow]:
        profile = {p.index: p for p in self.result.profile} if self.result else {}
        paired = {p.candidate: p.reference for p in self.alignment.pairs}
        in_blocks = self.alignment.aligned_ops("candidate")
        rows = []
        for op in self.run.candidate.ops:
            out = self.run.candidate.tensors[op.outputs[0]] if op.outputs else None
            row = OpRow(op.index, op.op, op.framework_op, op.module, tuple(out.shape) if out else (), op.source)
            evidence = profile.get(op.index)
            if evidence is not None:
                row.output_error, row.local_error = evidence.output_error, evidence.local_error
                row.amplification, row.verdict = evidence.amplification, evidence.verdict
            else:
                row.verdict = "block" if op.index in in_blocks else ("unaligned" if op.index not in paired else "")
            reference = paired.get(op.index)
            if reference is not None:
                ref_op = self.run.reference.ops[reference]
                row.reference, row.reference_op = reference, ref_op.framework_op
                row.reference_module, row.reference_source = ref_op.module, ref_op.source
            rows.append(row)
        return rows

    def _module_tree(self) -> ModuleNode:
        root = ModuleNode(self.run.model_file.stem or "model", "")
        for row in self.rows:
            node = root
            self._absorb(node, row)
            if not row.module:
                continue
            path = []
            for part in row.module.split("."):
                path.append(part)
                node = node.children.setdefault(part, ModuleNode(part, ".".join(path)))
                self._absorb(node, row)
        return root

    @staticmethod
    def _absorb(node: ModuleNode, row: OpRow) -> None:
        node.ops.append(row.index)
        if row.verdict and (not node.worst or SEVERITY.get(row.verdict, 0) > SEVERITY.get(node.worst, 0)):
            node.worst = row.verdict
        if row.output_error is not None and (node.max_error is None or row.output_error > node.max_error):
            node.max_error = row.output_error

    # -- questions ----------------------------------------------------------------
    @property
    def live(self) -> bool:
        return self.run.is_live

    @property
    def has_backward(self) -> bool:
        """Was the backward pass searched too (`--backward`)?"""
        return self.run.result is not None and self.run.result.backward is not None

    @property
    def culprit_index(self) -> int | None:
        """The candidate op the culprit is (None where the reference does not repeat itself: its op is the culprit)."""
        culprit = self.result.culprit if self.result else None
        if culprit is None or any(found.side == "reference" for found in self.result.nondeterminism[:1]):
            return None
        return culprit.candidate.index

    @property
    def verdict(self) -> str | None:
        return self.result.verdict if self.result else None

    def notable(self) -> tuple[list[int], str]:
        """The ops `n`/`p` walk: those judged different (in op order), else the most amplifying
        ones (largest amplification first)."""
        different = [r.index for r in self.rows if r.verdict == "different"]
        if different:
            return different, "different"
        amplifying = [r for r in self.rows if r.output_error and (r.amplification is None or r.amplification > 1)]
        amplifying.sort(key=lambda r: (-(r.amplification if r.amplification is not None else math.inf), r.index))
        return [r.index for r in amplifying], "amplifying"

    def step(self, current: int | None, forward: bool) -> tuple[int | None, str]:
        ops, kind = self.notable()
        if not ops:
            return None, kind
        if kind == "different":
            if current is None:
                return (ops[0] if forward else ops[-1]), kind
            after = [i for i in ops if (i > current if forward else i < current)]
            return (after[0] if forward else after[-1]) if after else (ops[0] if forward else ops[-1]), kind
        position = ops.index(current) if current in ops else -1
        if position < 0:
            return (ops[0] if forward else ops[-1]), kind
        return ops[(position + (1 if forward else -1)) % len(ops)], kind

    def counts(self) -> dict[str, int]:
        return {
            "candidate": len(self.run.candidate.ops),
            "reference": len(self.run.reference.ops),
            "aligned": len(self.alignment.aligned_ops("candidate")),
            "paired": len(self.alignment.pairs),
        }

    def output_lines(self) -> list[tuple[str, str, float, float]]:
        """(output key, shape, max abs, max rel) per paired output."""
        return [
            (p.key, fmt_shape(self.run.reference.tensors[p.reference].shape), p.metrics.max_abs, p.metrics.max_rel)
            for p in self.run.output_pairs
        ]

    # -- one op ---------------------------------------------------------------------
    def reference_values(self, cand_tid: int) -> np.ndarray | None:
        """The reference tensor paired with a candidate tensor, in the candidate's layout."""
        return self.analysis.reference_values_for(cand_tid)

    def tensor_rows(self, index: int) -> list[TensorRow]:
        cand = self.run.candidate
        op = cand.ops[index]
        rows = []
        for role, tids in (("in", op.inputs), ("out", op.outputs)):
            for position, tid in enumerate(tids):
                try:
                    metrics = self.analysis.tensor_error(tid)
                except BisectrError:  # a damaged tensor file: no error shown (the heat map says why)
                    metrics = None
                error = metrics.max_rel if metrics is not None else None
                rows.append(self._tensor_row("candidate", f"{role} {position}", cand, tid, error))
        ref_index = self.by_index[index].reference
        if ref_index is not None:
            ref_op = self.run.reference.ops[ref_index]
            for role, tids in (("in", ref_op.inputs), ("out", ref_op.outputs)):
                for position, tid in enumerate(tids):
                    rows.append(self._tensor_row("reference", f"{role} {position}", self.run.reference, tid, None))
        return rows

    @staticmethod
    def _tensor_row(side: str, role: str, trace, tid: int, error: float | None) -> TensorRow:
        info = trace.tensors[tid]
        name = info.leaf if info.leaf else (f"op {info.producer}" if info.producer is not None else f"t{tid}")
        return TensorRow(side, role, name, tuple(info.shape), info.dtype, info.stats, error, info.stored)

    def heat_map(self, index: int, rows: int = 6, cols: int = 24) -> HeatMap | None:
        """Where in the op's (first) output the difference sits: mean |difference| over blocks of values."""
        op = self.run.candidate.ops[index]
        if not op.outputs:
            return None
        tid = op.outputs[0]
        reference = self.reference_values(tid)
        if reference is None or not self.run.candidate.has_value(tid):
            return None
        candidate = np.asarray(self.run.candidate.value(tid), dtype=np.float64).reshape(reference.shape)
        reference = np.asarray(reference, dtype=np.float64)
        diff = np.abs(candidate - reference)
        diff[np.isnan(candidate) & np.isnan(reference)] = 0.0
        diff[np.isnan(diff)] = np.inf
        shape = tuple(candidate.shape)
        grid = diff.reshape(1, -1) if diff.ndim <= 1 else diff.reshape(-1, shape[-1])
        if grid.size == 0:
            return None
        row_groups = np.array_split(np.arange(grid.shape[0]), min(rows, grid.shape[0]))
        col_groups = np.array_split(np.arange(grid.shape[1]), min(cols, grid.shape[1]))
        cells = np.array([[grid[np.ix_(r, c)].mean() for c in col_groups] for r in row_groups])
        flat = int(np.argmax(np.where(np.isfinite(diff), diff, np.inf).reshape(-1)))
        argmax = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
        max_abs = float(diff.reshape(-1)[flat])
        return HeatMap(
            cells,
            max_abs,
            shape,
            (len(row_groups[0]), len(col_groups[0])),
            argmax,
            float(candidate.reshape(-1)[flat]),
            float(reference.reshape(-1)[flat]),
        )

    def evidence(self, index: int) -> ShownEvidence | None:
        """The culprit's evidence from the result when `index` is the culprit, else None."""
        if not self.result or self.culprit_index != index:
            return None
        culprit = self.result.culprit
        return ShownEvidence(
            culprit.local_error,
            culprit.fp64,
            culprit.verdict,
            culprit.input_error,
            culprit.output_error,
            culprit.amplification,
            culprit.fp64_unavailable,
        )

    def replay_evidence(self, index: int) -> ShownEvidence | None:
        """Replay one op (live runs): local error and the fp64 oracle. Slow-ish: call from a worker."""
        row = self.by_index[index]
        if not self.run.is_live or row.reference is None:
            return None
        evidence = self.analysis.evidence(index, row.reference, oracle=True)
        return ShownEvidence(
            evidence.local_error,
            evidence.fp64,
            evidence.verdict,
            evidence.input_error,
            evidence.output_error.max_abs,
            evidence.amplification,
            evidence.fp64_unavailable,
        )

    # -- actions ----------------------------------------------------------------------
    def patch_effect(self, index: int) -> dict[str, float]:
        """Re-run the candidate with the reference's values patched in (live runs): for this op's
        outputs only, and for everything up to this op (the search's cut)."""
        from ...search.forward import ForwardPass

        if not self.live:
            raise RuntimeError("patching needs a live run")
        analysis = self.analysis
        search = ForwardPass(self.run.live, analysis)
        before = self.run.output_error().max_rel
        return {
            "before": before,
            "only_this": search.candidate_error(_op_patches(analysis, self.run, index)),
            "up_to_here": search.candidate_error(search.patches_up_to(index)),
        }

    def search_again(self, progress: Callable[[str], None] | None = None, model_file: str | None = None) -> Result:
        """Run the whole search again and save the run with its result (`refresh` then shows it).
        A saved run re-runs nothing by itself: `model_file` names the file it is traced again from
        (`Run.traced_again`), into a new run that takes its place."""
        if not self.run.is_live and model_file is not None:
            self.run = self.run.traced_again(model_file)
        result = self.run.bisect(progress=progress, backward=self.has_backward)
        if self.run.run_dir is not None or self.run.writer is not None:
            self.run.save()
        return result

    def write_report(self) -> list[Path]:
        """`report.md` and `report.html` in the run directory (see `bisectr.present.writeup`)."""
        base = Path(self.run.run_dir) if self.run.run_dir is not None else Path.cwd()
        return write_report(self.run, base / "report")

    def export_repro(self, index: int, directory: str | os.PathLike | None = None) -> Path:
        """Write `repro.py` and `inputs.npz` for op `index` in both frameworks (see `bisectr.present.repro`)."""
        if directory is None:
            base = Path(self.run.run_dir) if self.run.run_dir is not None else Path.cwd()
            directory = base / "repro" / f"op{index}_{re.sub(r'[^A-Za-z0-9_]+', '_', self.run.candidate.ops[index].op)}"
        return write_repro(self.run, index, directory, self.run.live)


def _op_patches(analysis: Analysis, run: Run, index: int) -> dict[int, np.ndarray]:
    """Reference values for the outputs of a candidate op (all that a block hands on, for an op completing one)."""
    block = analysis.blocks.get(index)
    outputs = (
        run.candidate.ops[index].outputs
        if block is None
        else [c for c, _ in analysis.compared_outputs(index, analysis.ops[index].reference)]
    )
    values = {tid: analysis.reference_values_for(tid) for tid in outputs}
    return {tid: v for tid, v in values.items() if v is not None}
