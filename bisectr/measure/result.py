"""What a search concludes, as typed records: built by `search.core.decide`, written to a run's
`result.json` by `store`, shown by `report` (text and TUI alike).

`Result.to_dict()` is the JSON contract of `bisectr bisect --json` (docs/json.md);
`Result.from_dict` reads it back, checking every field (`serial.from_plain`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .align import LeafPairing
from ..serial import PlainError, from_plain, to_plain
from .metrics import Float64Evidence, OpVerdict, OutputError


@dataclass
class OpSite:
    """Where an op sits on one side."""

    index: int
    op: str  # the framework's name
    module: str
    source: str  # "path:line", "" when unknown


@dataclass
class BlockOps:
    """An N:M block judged as one op: its ops on both sides."""

    candidate: list[int]
    reference: list[int]


@dataclass
class Rewired:
    """A culprit whose candidate side reads another tensor than its partner does (a residual wired
    differently): the reference's input, the candidate op that computes its counterpart and what the
    candidate reads instead."""

    reference_input: OpSite  # the reference op whose output the culprit's reference side reads
    counterpart: OpSite  # the candidate op paired with it, whose output the culprit's candidate side does not read
    reads: OpSite | None  # the candidate op whose output the culprit's candidate side reads in its place
    reads_leaf: str | None  # or the input, parameter or buffer it reads there, as traced ("input:0")


@dataclass
class Placements:
    """How the culprit's candidate side held what it reads and what it hands on, where that side ran
    on several processes: a distributed tensor's placements ("Partial(sum)"), a local part (each
    process's own, the first process's values shown) or "whole"."""

    ranks: int
    reads: list[str]
    hands_on: list[str]


@dataclass
class InCompiled:
    """Where inside a compiled module its compiled code differs from its eager code, on the inputs it
    was recorded with (`search.compiled.in_compiled`); errors relative, outputs against the eager's."""

    # the deepest module whose compiled code alone makes the difference, relative to the compiled one ("": itself)
    module: str
    module_class: str
    error: float  # the compiled module's
    module_error: float  # with only `module` compiled
    op: str | None  # the first op of `module`'s compiled graph whose value differs beyond rounding
    source: str  # "path:line" of that op in the model's code ("" unknown)
    code: str
    op_error: float | None  # that op's value compiled, against float64 (its eager rounding stays far below)
    other_path: bool  # no op's compiled value differs: the op is the first on a line only the compiled code runs
    step: str  # the compiler step that makes it: a backend, and for inductor a subsystem
    step_detail: str  # which application of the subsystem (a decomposition, a lowering), where bisected
    eager_modules: list[str]  # every module of `module`'s class, kept eager in the confirmation
    confirmed_error: float  # the compiled module's error with them eager
    rounding: float  # the eager module's own: its float32 outputs against float64
    confirmed: bool
    compiles: int
    seconds: float
    backend: str
    eager_ops: list[int] = field(default_factory=list)  # the other side's ops at the op's line (set by the search)


@dataclass
class Culprit:
    kind: Literal["op", "leaf"]
    op: str  # canonical name
    candidate: OpSite
    reference: OpSite
    leaf: str | None  # the differing parameter or buffer, for kind "leaf"
    input_error: float | None
    output_error: float | None  # absolute
    output_error_rel: float | None
    input_error_rel: float | None
    local_error: float | None
    amplification: float | None
    verdict: OpVerdict  # the op's own
    fp64: Float64Evidence | None
    block: BlockOps | None = None
    # For kind "leaf": the reference leaf it pairs with, how the reference's values lie in it
    # ("as stored", "transposed", a slice of a fused parameter) and how it differs ("all zeros").
    reference_leaf: str | None = None
    layout: str | None = None
    description: str | None = None
    fp64_unavailable: str | None = None  # why there is no `fp64` evidence: an op without a float64 kernel
    rewired: Rewired | None = None
    placements: Placements | None = None
    compiled: InCompiled | None = None  # where inside a compiled module's call its compiled code differs from its eager
    cause: str | None = None  # what the difference is, in words, where the search can tell (an op the candidate lacks)


@dataclass
class Recurrence:
    """One occurrence of the culprit's difference (the same op from the same line of code or the same
    module up to layer numbers, or reading differing leaves of the same kind); the first is the culprit."""

    index: int
    op: str
    module: str
    source: str
    local_error: float | None
    alone: float | None = None  # the error this occurrence alone makes (a reference re-run with only its difference)
    share: float | None = None  # alone, as a share of the error


@dataclass
class Confirmation:
    """The candidate re-run with only the patched ops' own differences taken out."""

    patched_ops: list[int]
    output_error: float
    before: float
    confirmed: bool
    leaves: int = 0  # for a leaf culprit: how many leaves were given the reference's values (read by `patched_ops`)
    cut: bool = False  # for a cut gradient: the reference's gradient handed on where the culprit cuts it


@dataclass
class NotBlamed:
    """A difference tested and not blamed: it does not reach the outputs, or patching it contradicts its pairing."""

    index: int
    op: str
    reaches: float
    contradicted: float | None = None  # the outputs' error after taking its difference out, when that made it worse


@dataclass
class Bracket:
    """Where an unconfirmed difference enters: between the cut `low` and the entry point `high`."""

    low: int | None
    high: int | None
    candidate: list[OpSite]
    reference: list[OpSite]
    why: str = ""  # why the difference is not taken for rounding, where no op's evidence says so


@dataclass
class NonFiniteSite(OpSite):
    leaf: str | None = None  # the parameter holding them, when they start at a leaf


@dataclass
class NonFinite:
    """NaN/Inf in the candidate's outputs (the reference's are finite), and where they start."""

    nan: int
    inf: int
    first: NonFiniteSite | None


@dataclass
class Cut:
    op: int  # the candidate op up to which the reference's values were patched in
    output_error: float
    moved: float | None = None  # how far the outputs moved from the candidate's own (relative, as output_error)


@dataclass
class ProfileRow:
    """One paired op's evidence, for the error profile and the op table."""

    index: int
    reference: int
    op: str
    module: str
    output_error: float  # relative, propagated
    max_abs: float
    mean_abs: float
    local_error: float | None
    verdict: OpVerdict
    amplification: float


@dataclass
class OpCounts:
    """How many ops each side recorded, and how many of the candidate's are paired or in matched blocks."""

    reference: int
    candidate: int
    aligned: int


@dataclass
class Float64Check:
    """The whole model run in float64 on both sides (see `precision`)."""

    status: Literal["agree", "disagree", "skipped"]
    reason: str  # why it was skipped, or what the numbers say
    error: float | None  # the measured difference (max_rel over the outputs)
    float64_error: float | None = None  # the same with both sides in float64
    reference_rounding: float | None = None  # the reference's outputs vs its own float64 outputs
    candidate_rounding: float | None = None
    # The candidate's leaves that are the reference's rounded to its dtype ran with the reference's
    # values on both sides (said here in one sentence); `narrow_ops` still ran below float64.
    rounded_leaves: str = ""
    narrow_ops: dict[str, list[str]] = field(default_factory=dict)
    # What rounding alone predicts for the measured difference (None when skipped).
    predicted: float | None = field(init=False)

    def __post_init__(self) -> None:
        skipped = self.reference_rounding is None or self.candidate_rounding is None
        self.predicted = None if skipped else self.reference_rounding + self.candidate_rounding


Cause = Literal["random", "uninitialized", "kernel", "other"]


@dataclass
class Nondeterminism:
    """A side that does not repeat itself: the first op whose outputs differ between two of its runs
    (`bisectr.search.repeat`), why, and how to make it repeat itself."""

    side: Literal["reference", "candidate"]
    op: OpSite
    cause: Cause
    fix: str  # one sentence
    # How far the op's outputs moved between the runs, relative to their largest magnitude (None: the
    # second run called another op there).
    difference: float | None
    # What the op reads that made it differ: a leaf that changed, the op that left the memory uninitialised.
    reads: str | None = None
    # What `--fix-nondeterminism` can do about it: "eval" (the side's model in eval mode), "seed"
    # (its random generators seeded before each run), None (nothing: the fix is the user's).
    fixable: Literal["eval", "seed"] | None = None


@dataclass
class SettingDifference:
    """A setting that changes numerics, which the two sides ran with different values of."""

    name: str
    reference: str
    candidate: str


@dataclass
class Result:
    verdict: Literal["match", "noise", "divergent", "nondeterministic"]
    output_error: OutputError
    culprit: Culprit | None
    reruns: int  # candidate re-runs
    ops: OpCounts
    entry: int | None = None  # the entry point k*
    recurrences: list[Recurrence] = field(default_factory=list)
    confirmation: Confirmation | None = None
    not_blamed: list[NotBlamed] = field(default_factory=list)
    cuts: list[Cut] = field(default_factory=list)
    reference_reruns: int = 0
    nonfinite: NonFinite | None = None
    fp64_check: Float64Check | None = None
    bracket: Bracket | None = None  # for a divergent result no patch confirmed
    profile: list[ProfileRow] = field(default_factory=list)
    pass_: Literal["forward", "backward"] = field(default="forward", metadata={"key": "pass"})
    # Backward only: a gradient one side has and the other lacks, said plainly (a frozen parameter,
    # a detached path); the losses, where the model file defines them.
    missing_gradient: str | None = None
    # Backward only, a side on several processes: gradients placed Replicate whose ranks hold different values
    # (a reduction the side's backward leaves out), said plainly.
    unreduced_gradient: str | None = None
    losses: dict[str, float | None] | None = None
    # The backward's: "own" (each side on its own forward activations) or "reference" (the
    # candidate's backward through its own ops at the reference's forward values).
    activations: str | None = None
    backward: Result | None = None  # the backward pass's result, when one was run
    leaves: LeafPairing | None = None  # the parameters and buffers, paired and compared
    # For `nondeterministic`: each side that does not repeat itself (its culprit is the first's).
    nondeterminism: list[Nondeterminism] = field(default_factory=list)
    settings: list[SettingDifference] = field(default_factory=list)  # the sides' numerics settings that differ
    fixed: list[str] = field(default_factory=list)  # what `--fix-nondeterminism` changed before the sides were recorded

    @property
    def unconfirmed(self) -> bool:
        """A divergent result whose culprit no patch confirmed (it comes with a bracket), and no
        gradient that one side lacks shows it."""
        confirmed = self.confirmation is not None and self.confirmation.confirmed
        return self.verdict == "divergent" and not confirmed and self.missing_gradient is None

    def to_dict(self) -> dict:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Result":
        result = from_plain(cls, data)
        if result.backward is not None and result.backward.pass_ != "backward":
            raise PlainError("backward.pass", "the backward result is not a backward pass")
        return result
