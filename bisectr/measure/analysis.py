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

import itertools
from dataclasses import dataclass

import numpy as np

from ..adapters import CannotUpcast
from .align import LAYOUT_OPS, Alignment, Block, TensorPair
from .metrics import EXACT, UNKNOWN, ErrorMetrics, Float64Evidence, OpVerdict, blocked, error_metrics
from .numerics import coarsest_dtype, judge, noise_floor
from .runrecord import RunRecord
from .live import LiveRun
from ..capture.trace import OpNode, Trace, is_floating
from ..leafref import leaf_kind, leaf_name


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
        self._activation_ops: set[int] | None = None  # the candidate's `Trace.activations`, once asked

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
        absorbed by `transpose_y` on one side is undone here); where it holds a slice of its partner, the
        partner's values with the candidate's in that slice."""
        pair = self.alignment.tensors.get(cand_tid)
        if pair is not None and pair.reference == ref_tid:
            return pair.candidate_into_reference(values, self.reference.value(ref_tid))
        return values.reshape(self.reference.tensors[ref_tid].shape)

    def in_candidate_layout(self, cand_tid: int, ref_tid: int, values: np.ndarray) -> np.ndarray:
        """Values of the reference tensor `ref_tid` laid out as the candidate tensor `cand_tid` it is paired with
        (only its slice, where the candidate holds a slice of it)."""
        pair = self.alignment.tensors.get(cand_tid)
        shape = self.candidate.tensors[cand_tid].shape
        if pair is not None and pair.reference == ref_tid:
            return pair.reference_in_candidate_layout(values, shape)
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

    def local_outputs(
        self, cand_index: int, ref_index: int, block: Block | None = None, every: bool = False
    ) -> dict[int, np.ndarray]:
        """The candidate op (or the block it completes) replayed on the reference's inputs, keeping the
        candidate's own parameters (and its own values for inputs with no reference partner): the
        values of `compared_outputs` (of every tensor the replay computed, for `every`), by candidate tid."""
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
        return computed if every else {tid: computed[tid] for tid in compared}

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

    def entering_op(self, block: Block, completing: int, reference_op: int) -> Entering:
        """Where a block's difference enters, as (candidate op, reference op or None for the block's own). The
        block's ops are replayed on the reference's inputs; the first whose outputs hold no value of the reference
        block (nor of its inputs), with nothing computed from them that does, while what it reads does (a bucket
        function's first wrong comparison inside a position bias computed as one block). Where the reference
        block computes on that op's input first, and the candidate holds nothing of what that makes, the
        candidate lacks that op: it is named on the reference's side, on the candidate's where the input was made
        (a norm after the encoder, a soft-cap on the scores). Without a live run, or where no op is found,
        `entering_op`."""
        if self.run.traced.candidate_nproc > 1 or self.run.traced.reference_nproc > 1:
            # what a rank holds of its own is no value of the reference's: the block's structure decides
            return Entering(entering_op(self.alignment, self.candidate, block))
        fallback = Entering(in_common_module(self.candidate, block))
        if self.live is None or not block.reference:
            return fallback
        try:
            computed = self.local_outputs(completing, reference_op, block, every=True)
        except Exception:  # an op that cannot run on substituted inputs: the block's structure decides
            return fallback
        reference = {
            t: self.reference.value(t)
            for t in {t for i in block.reference for t in self.reference.ops[i].outputs}
            | set(external_inputs(self.reference, block.reference))
            if self.reference.has_value(t)
        }
        held = _holding(block.candidate, self.candidate, computed, reference)
        inside = set(block.candidate)
        descendants = _descendants(self.candidate, block.candidate)
        reads_held = {
            i: all(held[p] for p in {self.candidate.tensors[t].producer for t in self.candidate.ops[i].inputs} & inside)
            for i in block.candidate
        }
        # An op that breaks from what it reads only by a table no reference tensor holds: that table, even where
        # what follows holds a reference value again (positions counted from 0 rotate by nothing: the rotated
        # query holds the reference's query before its rotation).
        for i in block.candidate:
            table = self._unpaired_table(i, inside) if not held[i] and reads_held[i] else None
            if table is not None:
                return self._from_table(table)
        frontier = [
            i for i in block.candidate if not held[i] and not any(held[d] for d in descendants[i]) and reads_held[i]
        ]
        # Of several, one whose outputs are a reference tensor scaled (q scaled before its product where the reference
        # scales the scores after) is taken for another order of the same computation, where another is not.
        unexplained = [i for i in frontier if not _scaled_holding(i, self.candidate, computed, reference)]
        for i in (unexplained or frontier)[:1]:
            rewired = self._read_instead(i, block)
            if rewired is not None:
                return rewired
            table = self._unpaired_table(i, inside)
            if table is not None:
                return self._from_table(table)
            return self._missing_before(i, block, computed, reference) or Entering(i, self.counterpart(i, block))
        return fallback

    def _from_table(self, table: int) -> Entering:
        made = self.candidate.ops[table]
        return Entering(
            table,
            cause=f"it computes from a table no reference tensor holds, made by {made.framework_op} at "
            f"{made.source or made.module}",
        )

    def counterpart(self, index: int, block: Block) -> int | None:
        """The reference op to name against candidate op `index`: the op of `block` computing on a partner of what it
        reads (through ops that only move data), of its kind where one is (what the reference does there instead),
        else the op making that partner; None where what it reads has no partner."""
        read = _moved_from(self.candidate, self.candidate.ops[index].inputs)
        partners = {self.alignment.tensors[t].reference for t in read if t in self.alignment.tensors}
        reading = [
            i
            for i in block.reference
            if self.reference.ops[i].op not in ONLY_MOVES_DATA
            and partners & _moved_from(self.reference, self.reference.ops[i].inputs)
        ]
        kind = self.candidate.ops[index].op
        makers = sorted(p for p in (self.reference.tensors[t].producer for t in partners) if p is not None)
        return next(
            (i for i in reading if self.reference.ops[i].op == kind),
            reading[0] if reading else makers[-1] if makers else None,
        )

    def _read_instead(self, index: int, block: Block) -> Entering | None:
        """Where op `index` reads, from outside its block, a table paired with one the reference block does not
        read (a layer given the full mask where the reference gives it the sliding window's): named where the
        candidate made what it reads. An activation read instead (the residual stream where the reference reads its
        norm) is the reading op's own mistake."""
        reads = set(external_inputs(self.reference, block.reference))
        for tid in self.candidate.ops[index].inputs:
            pair = self.alignment.tensors.get(tid)
            info = self.candidate.tensors[tid]
            if pair is None or info.producer is None or info.producer in set(block.candidate):
                continue
            if pair.reference in reads or not is_floating(info.dtype) or info.producer in self._activations():
                continue
            made = self.candidate.ops[info.producer]
            return Entering(
                info.producer,
                cause=f"{self.candidate.ops[index].framework_op} reads what {made.framework_op} made at "
                f"{made.source or made.module}, which the reference computes but does not read here",
            )
        return None

    def _activations(self) -> set[int]:
        if self._activation_ops is None:
            self._activation_ops = self.candidate.activations()
        return self._activation_ops

    def _unpaired_table(self, index: int, inside: set[int]) -> int | None:
        """Where op `index` reads a tensor computed from no parameter that no reference tensor holds (a position
        table or a mask the candidate made otherwise than the reference): the first op computing it."""
        for tid in self.candidate.ops[index].inputs:
            info = self.candidate.tensors[tid]
            if info.producer is None or info.producer in inside or tid in self.alignment.tensors:
                continue
            if not is_floating(info.dtype) or info.producer in self._activations():
                continue
            return self._table_site(tid)
        return None

    def table_read(self, index: int) -> Entering | None:
        """Where op `index` reads a table no reference tensor holds (`_unpaired_table`): named there."""
        table = self._unpaired_table(index, {index})
        return None if table is None else self._from_table(table)

    def _table_site(self, tid: int) -> int:
        """Of the ops making table `tid`, the first whose output no reference table holds (a decoding step's mask
        from the right positions, compared with the wrong bound): the first op computing it where all do. A
        constant (a one-position step's position 0) tells nothing by its values: no reference tensor holds it."""
        made = sorted(self.candidate.made_by(tid))
        computing = [i for i in made if computes(self.candidate.ops[i].op)] or [self.candidate.tensors[tid].producer]
        activations = self.reference.activations()
        tables: dict[int, list[np.ndarray]] = {}
        for info in self.reference.tensors.values():
            if info.producer is not None and info.producer not in activations and self.reference.has_value(info.tid):
                tables.setdefault(info.size, []).append(self.reference.value(info.tid))
        for i in computing:
            op = self.candidate.ops[i]
            if not op.outputs or not self.candidate.has_value(op.outputs[0]):
                continue
            values = self.candidate.value(op.outputs[0])
            constant = not values.size or is_constant(values)
            if constant or not any(same_values(values, held) for held in tables.get(values.size, [])):
                return i
        return computing[0]

    def _missing_before(
        self, entering: int, block: Block, computed: dict[int, np.ndarray], reference: dict[int, np.ndarray]
    ) -> Entering | None:
        """(where the candidate made what op `entering` reads, the reference op it lacks) where the reference block
        computes on a partner of what `entering` reads before anything the candidate holds: a reference op that
        computes, reads that partner (through ops that only move data) and whose output no candidate value holds."""
        candidate_values = list(computed.values())
        by_size: dict[int, list[np.ndarray]] = {}
        for values in candidate_values:
            by_size.setdefault(values.size, []).append(values)
        for tid in self.candidate.ops[entering].inputs:
            pair = self.alignment.tensors.get(tid)
            if pair is None or self.candidate.tensors[tid].producer in set(block.candidate):
                continue
            kinds = {self.candidate.ops[i].op for i in block.candidate}
            for ref_op in block.reference:
                op = self.reference.ops[ref_op]
                if not computes(op.op) or op.op in kinds or not op.outputs or op.outputs[0] not in reference:
                    continue  # an op of a kind the candidate's block has is there, reading something else
                if pair.reference not in _moved_from(self.reference, op.inputs):
                    continue
                if not any(
                    self.reference.ops[j].op == self.candidate.ops[entering].op for j in block.reference if j > ref_op
                ):
                    continue  # the reference computes otherwise on that input, not first something the candidate lacks
                made = reference[op.outputs[0]]
                if any(same_values(values, made) for values in by_size.get(made.size, [])):
                    continue
                producer = self.candidate.tensors[tid].producer
                site = self._missing_site(entering, producer, op.module)
                maker = self.candidate.ops[producer].framework_op if producer is not None else "its input"
                return Entering(
                    site,
                    ref_op,
                    f"the candidate has no counterpart of the reference's {op.framework_op} in "
                    f"{op.module or '(top level)'}: {self.candidate.ops[entering].framework_op} reads what "
                    f"{maker} made as it is",
                )
        return None

    def _missing_site(self, consumer: int, producer: int | None, lacked_module: str) -> int:
        """Where an op the candidate lacks belongs: after the op that made what it would read (a norm closing an
        encoder) or before the one reading that (a norm opening a head). The candidate's own modules say where it
        has one it never called (their parameters unread); else the reference's, where its lacked op lies."""
        if producer is None:
            return consumer
        sites = {"producer": producer, "consumer": consumer}
        unread = [leaf_name(name).rpartition(".")[0] for name in self.candidate.unread_leaves]
        if unread:
            nearest = {
                side: max(_shared_depth(self.candidate.ops[index].module, module) for module in unread)
                for side, index in sites.items()
            }
        else:
            partners = {
                "producer": self._partner_module(self.candidate.ops[producer].outputs),
                "consumer": self._partner_module(self.candidate.ops[consumer].outputs),
            }
            nearest = {side: _shared_depth(module, lacked_module) for side, module in partners.items()}
        return sites["consumer"] if nearest["consumer"] > nearest["producer"] else sites["producer"]

    def _partner_module(self, tids: list[int]) -> str:
        """The module of the reference op making the partner of the first of `tids` paired ('' where none is)."""
        for tid in tids:
            pair = self.alignment.tensors.get(tid)
            if pair is not None:
                producer = self.reference.tensors[pair.reference].producer
                return self.reference.ops[producer].module if producer is not None else ""
        return ""

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
        try:
            reference_out = {c: self.in_candidate_layout(c, r, reference_out[r]) for c, r in compared}
        except ValueError:
            return None, None, None
        if any(local_out[c].size != reference_out[c].size for c, _ in compared):
            return None, None, None
        local_out = {c: local_out[c].reshape(reference_out[c].shape) for c, _ in compared}

        def worst(values: dict[int, np.ndarray], truth: dict[int, np.ndarray]) -> float:
            return max(error_metrics(values[c], truth[c]).max_rel for c, _ in compared)

        local = worst(local_out, reference_out)
        if local == 0.0 or (decided_under is not None and local <= decided_under):
            return local, None, None
        if not ref_ops:  # the reference passes its values on unchanged: they are their own float64 truth
            return local, Float64Evidence(local, 0.0), None
        try:
            oracle = self.live.replay("reference", ref_ops, {}, float64=True)  # on the reference's own inputs
        except CannotUpcast as exc:  # an op without a float64 kernel: the local error decides alone
            return local, None, str(exc)
        oracle = {
            c: self.in_candidate_layout(c, r, oracle[r].reshape(self.reference.tensors[r].shape)) for c, r in compared
        }
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


def in_common_module(trace: Trace, block: Block) -> int:
    """The first op of `block` that computes in the innermost module holding all its ops (a port's residual add
    before the norm that reads it, in the layer); the op completing it where none does."""
    computing = [i for i in block.candidate if computes(trace.ops[i].op)]
    common = common_module([trace.ops[i].module for i in computing])
    return next((i for i in computing if trace.ops[i].module == common), computing_op(trace, block.candidate))


@dataclass(frozen=True)
class Entering:
    """Where a block's difference enters: the candidate op to name, the reference op to name against it (None: the
    block's own), and what the difference is where the values say it (an op the candidate lacks)."""

    candidate: int
    reference: int | None = None
    cause: str | None = None


def _shared_depth(module: str, other: str) -> int:
    """How many leading names two module paths share."""
    depth = 0
    for a, b in zip(module.split("."), other.split(".")):
        if a != b or not a:
            break
        depth += 1
    return depth


def common_module(modules: list[str]) -> str:
    """The innermost module path that every one of `modules` is, or lies under ('' for the root)."""
    if not modules:
        return ""
    parts = [m.split(".") if m else [] for m in modules]
    common = []
    for names in zip(*parts):
        if len(set(names)) != 1:
            break
        common.append(names[0])
    return ".".join(common)


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


# The largest distance (relative to their magnitude) at which a value replayed in a block holds a reference value:
# another order of the same float32 sums stays well below it, a coarser dtype widens it (`_holding`).
HOLDS_VALUES = 1e-4
MAX_PERMUTED_AXES = 5  # tensors of more axes are compared as stored only
MAX_PERMUTED_COLUMNS = 4096
ONLY_MOVES_DATA = LAYOUT_OPS | {"getitem", "cast", "dropout", "split", "chunk", "unbind"}


def is_constant(values: np.ndarray) -> bool:
    """Does a tensor hold one value everywhere (a norm's weight at one, a one-position step's angle 0)? Such values
    tell nothing of where they come from."""
    return values.size > 0 and bool(np.all(values == values.reshape(-1)[0]))


def same_values(values: np.ndarray, reference: np.ndarray, tolerance: float = HOLDS_VALUES) -> bool:
    """Do two tensors of one size hold the same values in some layout: as stored, with their axes in another order
    (heads split before the sequence or after it), or with the entries of one axis reordered alike in every row
    (rotary halves against interleaved pairs)? Positions both block (a mask's -1e9 against -inf) count as equal;
    values that are not floats are compared exactly."""
    if values.size != reference.size:
        return False
    if _close(values.reshape(-1), reference.reshape(-1), tolerance):
        return True
    if values.size < 2 or not _same_multiset(values, reference, tolerance):
        return False
    return _in_another_axis_order(values, reference, tolerance) or _rows_permuted_alike(values, reference, tolerance)


def _close(a: np.ndarray, b: np.ndarray, tolerance: float) -> bool:
    """Are two flat arrays equal within `tolerance` of their magnitude, blocked and non-finite positions alike?"""
    if a.dtype.kind not in "fc" or b.dtype.kind not in "fc":
        return bool(np.array_equal(a.astype(np.float64), b.astype(np.float64)))
    a, b = a.astype(np.float64), b.astype(np.float64)
    special_a, special_b = _special(a), _special(b)
    if not np.array_equal(special_a, special_b):
        return False
    if special_a.any():
        if not np.array_equal(_special_kind(a[special_a]), _special_kind(b[special_a])):
            return False
        a, b = a[~special_a], b[~special_a]
    if a.size == 0:
        return True
    scale = max(float(np.abs(a).max()), float(np.abs(b).max()), 1e-30)
    return float(np.abs(a - b).max()) <= tolerance * scale


def _special(values: np.ndarray) -> np.ndarray:
    """Where flat `values` are not finite, or hold a mask's blocking constants."""
    special = ~np.isfinite(values)
    masked = blocked(np.where(special, 0.0, values))
    return special if masked is None else special | masked


def _special_kind(values: np.ndarray) -> np.ndarray:
    """NaN 0, +inf 1, blocking or -inf -1: what two special values must share to count as equal."""
    return np.where(np.isnan(values), 0, np.where(values > 0, 1, -1))


def _same_multiset(a: np.ndarray, b: np.ndarray, tolerance: float) -> bool:
    """Do two tensors hold the same values in any order (what any layout of one keeps of the other)?"""
    return _close(np.sort(a.reshape(-1)), np.sort(b.reshape(-1)), tolerance)


def _in_another_axis_order(a: np.ndarray, b: np.ndarray, tolerance: float) -> bool:
    """Is one tensor the other with its axes permuted, read in its own order (a (batch, seq, hidden) tensor against
    the (batch, heads, seq, head_dim) one holding its heads)?"""
    return axis_order(b, a, tolerance) is not None or axis_order(a, b, tolerance) is not None


def axis_order(shaped: np.ndarray, flat: np.ndarray, tolerance: float) -> tuple[int, ...] | None:
    """The order of `shaped`'s axes, other than its own, in which its values read as `flat`'s; None where none
    does."""
    rank = shaped.ndim
    if rank < 2 or rank > MAX_PERMUTED_AXES or shaped.size != flat.size:
        return None
    for order in itertools.permutations(range(rank)):
        if order != tuple(range(rank)) and _close(np.transpose(shaped, order).reshape(-1), flat.reshape(-1), tolerance):
            return order
    return None


def _rows_permuted_alike(a: np.ndarray, b: np.ndarray, tolerance: float) -> bool:
    """Are two tensors of one shape equal once the entries of one axis are reordered, alike in every row?"""
    if a.shape != b.shape:
        return False
    rng = np.random.default_rng(0)
    for axis in range(a.ndim):
        count = a.shape[axis]
        if count < 2 or count > MAX_PERMUTED_COLUMNS:
            continue
        columns_a = np.moveaxis(a, axis, -1).reshape(-1, count).astype(np.float64)
        columns_b = np.moveaxis(b, axis, -1).reshape(-1, count).astype(np.float64)
        if not (np.isfinite(columns_a).all() and np.isfinite(columns_b).all()):
            continue
        projection = rng.standard_normal(columns_a.shape[0])
        order_a, order_b = np.argsort(projection @ columns_a), np.argsort(projection @ columns_b)
        if _close(columns_a[:, order_a].reshape(-1), columns_b[:, order_b].reshape(-1), tolerance):
            return True
    return False


def _moved_from(trace: Trace, tids: list[int]) -> set[int]:
    """`tids` and every tensor they were made from by ops that only move data (a transpose, a reshape, a slice)."""
    moved, pending = set(), list(tids)
    while pending:
        tid = pending.pop()
        if tid in moved:
            continue
        moved.add(tid)
        producer = trace.tensors[tid].producer
        if producer is not None and trace.ops[producer].op in ONLY_MOVES_DATA:
            pending.extend(trace.ops[producer].inputs)
    return moved


def _descendants(trace: Trace, indices: list[int]) -> dict[int, set[int]]:
    """For each op of `indices`, the ops of `indices` computed from its outputs (through any of them)."""
    inside = set(indices)
    readers: dict[int, set[int]] = {i: set() for i in indices}
    for i in indices:
        for tid in trace.ops[i].inputs:
            producer = trace.tensors[tid].producer
            if producer in inside:
                readers[producer].add(i)
    descendants: dict[int, set[int]] = {}
    for i in sorted(indices, reverse=True):
        below = set(readers[i])
        for reader in readers[i]:
            below |= descendants.get(reader, set())
        descendants[i] = below
    return descendants


def _holding(
    indices: list[int], trace: Trace, computed: dict[int, np.ndarray], reference: dict[int, np.ndarray]
) -> dict[int, bool]:
    """For each op of a block replayed on the reference's inputs: do its outputs hold a value of the reference block
    (or of its inputs)? An op that only moves data, whose outputs were not kept, holds what it was given."""
    by_size: dict[int, list[np.ndarray]] = {}
    for values in reference.values():
        by_size.setdefault(values.size, []).append(values)
    inside = set(indices)
    held: dict[int, bool] = {}
    for i in indices:
        op = trace.ops[i]
        outputs = [t for t in op.outputs if t in computed]
        if not computes(op.op):
            producers = {trace.tensors[t].producer for t in op.inputs} & inside
            if all(held.get(p, True) for p in producers):
                held[i] = True
                continue
        if (
            outputs
            and all(_kind(computed[t]) != "f" for t in outputs)
            and not any(
                _kind(values) == _kind(computed[t]) for t in outputs for values in by_size.get(computed[t].size, [])
            )
        ):
            held[i] = True  # bookkeeping of its own (a mask of rows), where the reference holds nothing of its kind
            continue
        tolerance = max(HOLDS_VALUES, *(8 * noise_floor(trace.tensors[t].dtype) for t in outputs)) if outputs else 0.0
        # The first output is the op's result; the rest are by-products (a batch norm's batch statistics) that may
        # equal a reference leaf (a running mean) whatever its result holds.
        held[i] = bool(outputs) and any(
            same_values(computed[outputs[0]], values, tolerance)
            for values in by_size.get(computed[outputs[0]].size, [])
        )
    return held


def _kind(values: np.ndarray) -> str:
    """ "f" for floats, "b" for booleans, "i" for integers."""
    return "f" if values.dtype.kind in "fc" else "b" if values.dtype.kind == "b" else "i"


def _scaled_holding(
    index: int, trace: Trace, computed: dict[int, np.ndarray], reference: dict[int, np.ndarray]
) -> bool:
    """Do op `index`'s outputs hold a reference value times a constant (q scaled before its product with k, where the
    reference scales the scores after it)?"""
    for tid in trace.ops[index].outputs:
        if tid not in computed or computed[tid].dtype.kind != "f":
            continue
        values = computed[tid].astype(np.float64)
        norm = float(np.linalg.norm(values))
        if norm == 0 or not np.isfinite(norm):
            continue
        tolerance = max(HOLDS_VALUES, 8 * noise_floor(trace.tensors[tid].dtype))
        for held in reference.values():
            if held.size != values.size or held.dtype.kind != "f":
                continue
            held_norm = float(np.linalg.norm(held.astype(np.float64)))
            if held_norm == 0 or not np.isfinite(held_norm):
                continue
            for sign in (1.0, -1.0):
                if same_values(values * (sign * held_norm / norm), held, tolerance):
                    return True
    return False
