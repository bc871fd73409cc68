"""Per-pair evidence: propagated error, local error, the fp64 oracle and a verdict.

For each candidate op paired with a reference op:
- **propagated error**: candidate output vs reference output in the normal runs;
- **input error**: the worst absolute error among the op's paired inputs;
- **amplification**: output absolute error as a multiple of the input error;
- **local error**: the candidate op replayed on the reference's inputs (keeping the
  candidate's own parameters) vs the reference output;
- **fp64 oracle**: the reference op replayed with all inputs upcast to float64. The
  candidate is *noise* when its local output is within a small factor of the
  reference's own distance to the oracle (plus a dtype floor), in the spirit of
  torch's `same(..., fp64_ref)`; *different* otherwise; *exact* when bit-equal.

A matched N:M block (a hand-written layer norm against `layer_norm`) is judged as one op:
its candidate ops replayed in order on the reference's inputs, its reference ops replayed
in float64 as the oracle. Its evidence sits under the candidate op completing its output.
A block of ops the reference has no partner for (an extra scale, copy or transpose pair) hands on
what the reference passes on unchanged: it is judged against those values, which are also its
float64 truth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..adapters import CannotUpcast
from .align import LAYOUT_OPS, Alignment, Block, TensorPair
from .metrics import EXACT, UNKNOWN, ErrorMetrics, Float64Evidence, OpVerdict, error_metrics
from .numerics import coarsest_dtype, judge, noise_floor
from .runrecord import RunRecord
from .live import LiveRun
from ..capture.trace import OpNode, Trace, is_floating
from ..leafref import leaf_kind


@dataclass
class OpEvidence:
    """One paired op's (or matched block's) evidence, in either pass: the error of what it hands on
    (its outputs forward, the gradients it hands back backward), its own difference replayed on the
    reference's inputs (`local_error`, relative), the fp64 oracle and the verdict they give."""

    candidate: int
    reference: int
    op: str
    dtype: str
    output_error: ErrorMetrics  # propagated: of its first output forward, of the gradient reaching it backward
    local_error: float | None
    fp64: Float64Evidence | None
    verdict: OpVerdict
    block: Block | None = None  # set when the evidence is for a matched N:M block
    fp64_unavailable: str | None = None  # why the fp64 oracle could not be replayed (an op without a float64 kernel)
    # Forward: the worst error among its paired inputs (absolute and relative), and its output's
    # absolute error as a multiple of it.
    input_error: float | None = None
    input_error_rel: float | None = None
    amplification: float | None = None
    # Backward: candidate input tid -> what its own backward adds to that input's gradient (candidate
    # minus reference), in the candidate's layout: what a confirmation takes out.
    own_difference: dict[int, np.ndarray] | None = None


@dataclass
class LeafEvidence:
    candidate: str
    reference: str
    tid: int
    error: ErrorMetrics
    verdict: OpVerdict


class Analysis:
    """Evidence for every paired op and leaf of a run. Local errors and the fp64 oracle replay
    ops, where the run is live; for a run record alone (a saved run) only the recorded values are compared."""

    def __init__(self, run: RunRecord | LiveRun):
        self.live = run if isinstance(run, LiveRun) else None
        self.run = run.run if isinstance(run, LiveRun) else run
        self.alignment = self.run.alignment
        self.ops: dict[int, OpEvidence] = {}
        self.leaves: dict[int, LeafEvidence] = {}
        self.blocks: dict[int, Block] = {}  # candidate op completing a matched N:M block -> the block
        self._tensor_errors: dict[int, ErrorMetrics | None] = {}
        self._held: dict[int, tuple[bool, ...]] = {}  # candidate op -> `_values_held` when its evidence was made

    @property
    def reference(self) -> Trace:
        return self.run.reference

    @property
    def candidate(self) -> Trace:
        return self.run.candidate

    def compute(self, earlier: Analysis | None = None) -> "Analysis":
        """Evidence of every paired op and matched block. An `earlier` analysis of the same run hands on
        the evidence of each op whose tensors have the values they had then (a windowed search fetches
        values between two analyses: only the ops reading them are replayed again)."""
        equal = {
            (p.candidate, p.reference) for p in self.alignment.leaves.pairs if p.status == "equal" and p.slots is None
        }
        for tid, pair in self.alignment.tensors.items():
            info = self.candidate.tensors[tid]
            if info.producer is None and info.leaf and leaf_kind(info.leaf) != "input":
                if (
                    info.leaf,
                    self.reference.tensors[pair.reference].leaf,
                ) in equal:  # compared when paired: not read again
                    self._tensor_errors[tid] = EXACT
                self.leaves[tid] = self._leaf_evidence(pair)
        completing: dict[int, int] = {}  # candidate op completing a matched block -> its reference op
        for block in self.alignment.blocks:
            ops = self._completing_ops(block) if block.matched else None
            if ops is not None:
                self.blocks[ops[0]] = block
                completing[ops[0]] = ops[1]
        pairs = [(p.candidate, p.reference) for p in self.alignment.pairs if p.candidate not in completing]
        for cand_index, ref_index in pairs + list(completing.items()):
            self.ops[cand_index] = self._evidence_since(earlier, cand_index, ref_index)
        return self

    def _evidence_since(self, earlier: Analysis | None, cand_index: int, ref_index: int) -> OpEvidence:
        held = self._values_held(cand_index, ref_index)
        self._held[cand_index] = held
        if earlier is not None and earlier._held.get(cand_index) == held:
            return earlier.ops[cand_index]
        return self.evidence(cand_index, ref_index)

    def _values_held(self, cand_index: int, ref_index: int) -> tuple[bool, ...]:
        """Which tensors an op's (or its block's) evidence reads have values: what it depends on."""
        candidate, reference = self.evidence_tensors(cand_index, ref_index)
        return tuple(map(self.candidate.has_value, candidate)) + tuple(map(self.reference.has_value, reference))

    def evidence_tensors(self, cand_index: int, ref_index: int) -> tuple[list[int], list[int]]:
        """The candidate's and the reference's tensors an op's (or its block's) evidence reads: the
        external inputs, the compared outputs, and the reference partners of the candidate's."""
        cand_ops, ref_ops = self.covered_ops(cand_index, ref_index)
        compared = self.compared_outputs(cand_index, ref_index)
        candidate = external_inputs(self.candidate, cand_ops) + [c for c, _ in compared]
        reference = external_inputs(self.reference, ref_ops) + [r for _, r in compared]
        return candidate, reference + [
            self.alignment.tensors[t].reference for t in candidate if t in self.alignment.tensors
        ]

    def _completing_ops(self, block: Block) -> tuple[int, int] | None:
        """(candidate op, reference op) of the block whose first outputs are the last pair it hands on
        (for a block the reference has no ops in, the reference op making what it passes on)."""
        for cand_tid, ref_tid in reversed(self._block_outputs(block)):
            cand_op = self.candidate.producer_op(cand_tid)
            ref_op = self.reference.producer_op(ref_tid)
            if ref_op is not None and cand_op.outputs[0] == cand_tid and ref_op.outputs[0] == ref_tid:
                return cand_op.index, ref_op.index
        return None

    def _block_outputs(self, block: Block) -> list[tuple[int, int]]:
        """(candidate tid, reference tid) of the paired tensors the block's ops produce on both sides, in candidate
        order; for a block the reference has no ops in, every paired tensor its ops produce."""
        inside = set(block.reference)
        return [
            (tid, self.alignment.tensors[tid].reference)
            for i in block.candidate
            for tid in self.candidate.ops[i].outputs
            if tid in self.alignment.tensors
            and (not inside or self.reference.tensors[self.alignment.tensors[tid].reference].producer in inside)
        ]

    def covered_ops(self, cand_index: int, ref_index: int, block: Block | None = None) -> tuple[list[int], list[int]]:
        """The candidate and reference ops one piece of evidence covers: the pair, or the block it completes
        (`block`, or the matched block `cand_index` completes)."""
        block = block or self.blocks.get(cand_index)
        return (block.candidate, block.reference) if block else ([cand_index], [ref_index])

    def in_order(self) -> list[OpEvidence]:
        """Evidence for every paired op, in candidate op order."""
        return [self.ops[index] for index in sorted(self.ops)]

    def reference_values_for(self, cand_tid: int) -> np.ndarray | None:
        """The reference tensor paired with `cand_tid`, in the candidate's layout."""
        pair: TensorPair | None = self.alignment.tensors.get(cand_tid)
        if pair is None or not self.reference.has_value(pair.reference):
            return None
        return pair.reference_in_candidate_layout(
            self.reference.value(pair.reference), self.candidate.tensors[cand_tid].shape
        )

    def in_reference_layout(self, cand_tid: int, ref_tid: int, values: np.ndarray) -> np.ndarray:
        """Values of the candidate tensor `cand_tid` laid out as its partner `ref_tid` (a transpose
        absorbed by `transpose_y` on one side is undone here)."""
        pair = self.alignment.tensors.get(cand_tid)
        shape = self.reference.tensors[ref_tid].shape
        if pair is not None and pair.reference == ref_tid:
            return pair.candidate_in_reference_layout(values, shape)
        return values.reshape(shape)

    def tensor_error(self, cand_tid: int) -> ErrorMetrics | None:
        """Propagated error of a candidate tensor against its reference partner (None if unpaired)."""
        if cand_tid not in self._tensor_errors:
            reference = self.reference_values_for(cand_tid)
            paired = reference is not None and self.candidate.has_value(cand_tid)
            self._tensor_errors[cand_tid] = error_metrics(self.candidate.value(cand_tid), reference) if paired else None
        return self._tensor_errors[cand_tid]

    def _leaf_evidence(self, pair: TensorPair) -> LeafEvidence:
        info = self.candidate.tensors[pair.candidate]
        error = self.tensor_error(pair.candidate) or UNKNOWN
        verdict = (
            "exact" if error.max_abs == 0 else ("noise" if error.max_rel <= noise_floor(info.dtype) else "different")
        )
        return LeafEvidence(
            info.leaf, self.reference.tensors[pair.reference].leaf or "", pair.candidate, error, verdict
        )

    def evidence(self, cand_index: int, ref_index: int, block: Block | None = None, oracle: bool = False) -> OpEvidence:
        """Evidence for a pair, or for the block it completes (`block`, or the matched block `cand_index` completes).
        The fp64 oracle is replayed where the local error leaves the verdict open, or for `oracle`: a local
        error within the dtype's floor is noise whatever the oracle says (`numerics.judge`)."""
        block = block or self.blocks.get(cand_index)
        cand_op = self.candidate.ops[cand_index]
        out_tid = cand_op.outputs[0]
        cand_ops, ref_ops = self.covered_ops(cand_index, ref_index, block)
        inputs = external_inputs(self.candidate, cand_ops)
        dtype = coarsest_dtype(self.candidate.dtypes_of(cand_ops))
        output_error = self.tensor_error(out_tid) or UNKNOWN
        input_errors = [e for e in (self.tensor_error(t) for t in inputs) if e is not None]
        input_abs = max((e.max_abs for e in input_errors), default=0.0)
        input_rel = max((e.max_rel for e in input_errors), default=0.0)
        local, fp64, fp64_unavailable = self._replayed_errors(
            cand_index, ref_index, block, None if oracle else noise_floor(dtype)
        )
        verdict = (
            "unknown"
            if local is None
            else judge(local, fp64 and fp64.candidate_error, fp64 and fp64.reference_error, dtype)
        )
        amplification = _ratio(output_error.max_abs, input_abs)
        # a block is named by its reference ops; one the reference has no ops in, by the candidate's
        named = [self.reference.ops[i] for i in ref_ops] or [self.candidate.ops[i] for i in cand_ops]
        name = block_name([op.op for op in named]) if block else cand_op.op
        return OpEvidence(
            cand_index,
            ref_index,
            name,
            dtype,
            output_error,
            local,
            fp64,
            verdict,
            block,
            fp64_unavailable,
            input_abs,
            input_rel,
            amplification,
        )

    def compared_outputs(self, cand_index: int, ref_index: int, block: Block | None = None) -> list[tuple[int, int]]:
        """(candidate tid, reference tid) that an op's evidence compares: its first output, or every
        paired tensor a block hands on."""
        block = block or self.blocks.get(cand_index)
        if block is None:
            return [(self.candidate.ops[cand_index].outputs[0], self.reference.ops[ref_index].outputs[0])]
        return self._block_outputs(block)

    def local_outputs(self, cand_index: int, ref_index: int, block: Block | None = None) -> dict[int, np.ndarray]:
        """The candidate op (or the block it completes) replayed on the reference's inputs, keeping the
        candidate's own parameters (and its own values for inputs with no reference partner): the
        values of `compared_outputs`, by candidate tid."""
        block = block or self.blocks.get(cand_index)
        compared = [tid for tid, _ in self.compared_outputs(cand_index, ref_index, block)]
        ops = self.covered_ops(cand_index, ref_index, block)[0]
        if block is None and self._reads_its_own_inputs(
            self.candidate.ops[cand_index]
        ):  # the replay would compute what was recorded
            return {tid: self.candidate.value(tid) for tid in compared}
        values = {}  # the reference's values where it has them: `Sides.replay` reads the candidate's own for the rest
        for tid in external_inputs(self.candidate, ops):
            from_reference = None if self.candidate.tensors[tid].producer is None else self.reference_values_for(tid)
            if from_reference is not None:
                values[tid] = from_reference
        computed = self.live.replay("candidate", ops, values)
        return {tid: computed[tid] for tid in compared}

    def _reads_its_own_inputs(self, cand_op: OpNode) -> bool:
        """Does the local replay feed the op exactly the values it read when recorded?"""
        if not self.candidate.has_value(cand_op.outputs[0]):
            return False
        for tid in cand_op.inputs:
            if self.candidate.tensors[tid].producer is None or self.reference_values_for(tid) is None:
                continue  # the replay reads the candidate's own values
            error = self.tensor_error(tid)  # None: the candidate's own values were not stored
            if error is None or error.max_abs != 0:
                return False
        return True

    def with_oracle(self, evidence: OpEvidence) -> OpEvidence:
        """The evidence with its fp64 oracle replayed where the local error alone decided it (live runs)."""
        if evidence.fp64 is not None or evidence.fp64_unavailable or not evidence.local_error or self.live is None:
            return evidence
        return self.evidence(evidence.candidate, evidence.reference, evidence.block, oracle=True)

    def _replayed_errors(
        self, cand_index: int, ref_index: int, block: Block | None, decided_under: float | None
    ) -> tuple[float | None, Float64Evidence | None, str | None]:
        """Local error, and the fp64 evidence unless the local error is 0 (bit-exact) or at most `decided_under`,
        or why the fp64 oracle could not be replayed."""
        if self.live is None:
            return None, None, None
        ref_ops = self.covered_ops(cand_index, ref_index, block)[1]
        ref_inputs = external_inputs(self.reference, ref_ops)
        compared = self.compared_outputs(cand_index, ref_index, block)
        if not compared or not all(self.reference.has_value(t) for t in ref_inputs + [r for _, r in compared]):
            return None, None, None
        if (
            block is None
            and self.tensor_error(compared[0][0]) == EXACT
            and self._reads_its_own_inputs(self.candidate.ops[cand_index])
        ):
            return 0.0, None, None  # the replay would compute the recorded output, equal to the reference's
        reference_out = {r: self.reference.value(r) for _, r in compared}
        try:
            local_out = self.local_outputs(cand_index, ref_index, block)
        except Exception:  # an op that cannot run on substituted inputs keeps no local evidence
            return None, None, None
        if any(local_out[c].size != reference_out[r].size for c, r in compared):
            return None, None, None
        local_out = {r: self.in_reference_layout(c, r, local_out[c]) for c, r in compared}

        def worst(values: dict[int, np.ndarray], truth: dict[int, np.ndarray]) -> float:
            return max(error_metrics(values[r], truth[r]).max_rel for _, r in compared)

        local = worst(local_out, reference_out)
        if local == 0.0 or (decided_under is not None and local <= decided_under):
            return local, None, None
        if not ref_ops:  # the reference passes its values on unchanged: they are their own float64 truth
            return local, Float64Evidence(local, 0.0), None
        try:
            oracle = self.live.replay("reference", ref_ops, {}, float64=True)  # on the reference's own inputs
        except CannotUpcast as exc:  # an op without a float64 kernel: the local error decides alone
            return local, None, str(exc)
        oracle = {r: oracle[r].reshape(reference_out[r].shape) for _, r in compared}
        return local, Float64Evidence(worst(local_out, oracle), worst(reference_out, oracle)), None


def computes(op: str) -> bool:
    """Does a canonical op compute values (not a layout change, nor an eval-mode dropout passing them on)?"""
    return op not in LAYOUT_OPS and op != "dropout"


def block_name(ops: list[str]) -> str:
    """A block is named by the ops that compute in it (`attention`, not `transpose+attention+transpose`)."""
    return "+".join(dict.fromkeys([op for op in ops if computes(op)] or ops))


def computing_op(trace: Trace, indices: list[int]) -> int:
    """The last op of `indices` that computes (the one a block's name comes from); the last op if none does."""
    return next((i for i in reversed(indices) if computes(trace.ops[i].op)), indices[-1])


def entering_op(alignment: Alignment, trace: Trace, block: Block) -> int:
    """The candidate op of `block` where its difference enters first: the first op that computes among
    those the reference has no partner for (neither paired nor inside a matched block with reference ops:
    an extra scale, an activation written out before the op it feeds); in an N:M block, whose ops have a
    partner only together, the op completing it."""
    partnered = alignment.partnered_ops()
    unpartnered = [i for i in block.candidate if i not in partnered and computes(trace.ops[i].op)]
    return unpartnered[0] if unpartnered else computing_op(trace, block.candidate)


def rewired_input(
    run: RunRecord, alignment: Alignment, candidate_ops: list[int], reference_ops: list[int]
) -> tuple[int, int, int] | None:
    """(reference tensor, its candidate counterpart, the candidate tensor read instead) where the
    reference ops read an op output whose paired candidate tensor the candidate ops do not read,
    reading one the reference ops do not read the partner of: the same op fed from elsewhere."""
    counterparts: dict[int, list[int]] = {}
    for cand_tid, pair in alignment.tensors.items():
        if pair.how != "leaf":
            counterparts.setdefault(pair.reference, []).append(cand_tid)
    cand_inputs = external_inputs(run.candidate, candidate_ops)
    ref_inputs = external_inputs(run.reference, reference_ops)
    instead = [
        t
        for t in cand_inputs
        if t in alignment.tensors
        and alignment.tensors[t].reference not in ref_inputs
        and is_floating(run.candidate.tensors[t].dtype)
    ]
    for ref_tid in ref_inputs:
        if run.reference.tensors[ref_tid].producer is None:
            continue
        partners = [t for t in counterparts.get(ref_tid, []) if run.candidate.tensors[t].producer is not None]
        if partners and not set(partners) & set(cand_inputs) and instead:
            return ref_tid, partners[0], instead[0]
    return None


def external_inputs(trace: Trace, indices: list[int]) -> list[int]:
    """The tensors ops `indices` read that none of them produced, in reading order."""
    inside = set(indices)
    return list(
        dict.fromkeys(t for i in indices for t in trace.ops[i].inputs if trace.tensors[t].producer not in inside)
    )


def _ratio(output_error: float, input_error: float) -> float:
    if output_error == 0 or output_error != output_error:
        return 0.0
    return output_error / input_error if input_error > 0 else float("inf")
