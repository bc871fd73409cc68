"""Where a side's model runs: the live handle a search re-runs and replays through.

A side runner records the forward pass (`record`) and answers requests about it (`run`): a
re-run with patches, a replay of ops or of their backward, a backward pass, the float64 runs,
a recorded call, a training step, the questions of the search inside a compiled module's call
(`bisectr.engines.compiled`). `LocalSide` keeps the model in this process and answers each request
with its engine (`bisectr.engines`); a runner in another process
(`--isolate`) sends the same requests to its worker, so the analysis and the search never know
where a model lives. A live run (`bisectr.measure.live.LiveRun`) holds both runners with the run they
recorded; a run record (`runrecord.RunRecord`) never does.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from ..adapters import Determinism
from ..adapters.base import CompiledProbe
from ..engines.decoding import Decoder, StepOutputs
from ..engines.compiled import CloseCompiled, CompiledQuestion, OpenCompiled, answer_compiled, probe_compiled
from ..engines.float64 import Float64Run, float64_outputs
from ..engines.gradient import Gradients, backward, float64_gradients, replay_vjp
from ..capture.calls import Call, RecordedCalls
from ..engines.patched import RerunResult, rerun
from ..engines.training import StepFacts, Trainer
from ..engines.values import replay
from ..errors import ModelFileError, UnreadableTensorError, UnrecordedOutputError
from ..capture.modelfile import BuiltSide, SideFix, intercepted_forward, load_module, module_name
from ..capture.ops import UNINITIALISED
from ..capture.recording import RecordOptions, Recorder, output_pairs, poison_for
from ..capture.store import TensorWriter
from ..capture.trace import TensorInfo, Trace, is_floating
from ..leafref import leaf_kind


# -- what a side is asked ------------------------------------------------------------------
@dataclass
class Rerun:
    """Run again, following the recording, with `patches` (tid -> values, or a `Shift`) swapped in
    (see `engines.patched.Patches`); the values of the tids in `capture` come back too. With `every_op`,
    each op no patch reaches is checked against the recording, not only where it meets patched values
    and at the outputs (a difference a later op squashes, a norm's, still shows). -> `RerunResult`"""

    patches: dict[int, Any]
    capture: frozenset[int] = frozenset()
    every_op: bool = False


@dataclass
class Replay:
    """Ops `indices` (one op, or a block in op order) called again on `values` (tid -> array) for
    every input they do not compute, upcast to float64 if asked. -> tid -> values of what they computed"""

    indices: list[int]
    values: dict[int, np.ndarray]
    float64: bool = False


@dataclass
class ReplayVJP:
    """The backward of ops `indices` on `values` for their external inputs, from `upstream` (tid ->
    the gradient reaching an output; None: none does); see `engines.gradient.VJPInterpreter`.
    -> tid -> the gradient of each floating external input (None: none reaches it)"""

    indices: list[int]
    values: dict[int, np.ndarray]
    upstream: dict[int, np.ndarray | None]
    float64: bool = False


@dataclass
class Backward:
    """Forward and backward again, following the recording, from the loss or from `seeds` (output
    key -> gradient), with `gradient_patches` (tid -> gradient) handed on instead of the own, on
    `activations` (tid -> values) in place of its own forward's, and the gradients of `reduced` (tid ->
    "sum" or "mean") reduced over the ranks before they are handed on (see `engines.gradient.GradientRerun`).
    -> `Gradients`"""

    seeds: dict[str, np.ndarray]
    gradient_patches: dict[int, np.ndarray] = field(default_factory=dict)
    activations: dict[int, np.ndarray] = field(default_factory=dict)
    reduced: dict[int, str] = field(default_factory=dict)


@dataclass
class Float64Outputs:
    """The outputs of a float64 copy of the model (with `leaf_values`, leaf name -> values, in place
    of its own) on float64 inputs, keyed like the trace's outputs, and the ops that still ran below
    float64. -> `Float64Run`; raises `CannotUpcast` saying why the side cannot run in float64"""

    leaf_values: dict[str, np.ndarray]


@dataclass
class Float64Gradients:
    """The gradients of the parameters and floating inputs (by leaf name) of a float64 copy of the
    model (with `leaf_values`), as `Backward` computes them. -> `Float64Run`; raises `CannotUpcast`"""

    seeds: dict[str, np.ndarray]
    leaf_values: dict[str, np.ndarray]


@dataclass
class LeafValue:
    """The values of parameter or buffer `tid` as the model holds them (a run does not copy them).
    -> array"""

    tid: int


@dataclass
class RecordedCall:
    """The recorded call of op `index` (function and arguments). -> `Call`, or None where op `index`
    has none (the model's code was re-run)"""

    index: int


@dataclass
class TrainStep:
    """One optimizer step (steps counted from 1) of the side's trainer at `width` bits (32: a copy of
    the model as built; 64: a float64 copy), made by its first step from the model file's optimizer,
    batches and loss (the outputs against `seeds`, output key -> gradient, where it defines no loss).
    -> `StepFacts`"""

    width: int
    number: int
    seeds: dict[str, np.ndarray]


@dataclass
class StepValues:
    """One parameter's gradient, update or Adam moment ("gradient", "update", "moment1", "moment2") after
    the last step of the trainer at `width`. -> float64 array, or None where it has none"""

    width: int
    measure: str
    parameter: str


@dataclass
class TrainerSettings:
    """The optimizer settings of the trainer at `width`, and each parameter's weight decay. -> (dict, dict)"""

    width: int


@dataclass
class DecodeStep:
    """Decoding step `number` (0: the prefill) of the side's decoder at `width` bits (32: the model as
    built; 64: a float64 copy), fed `token` (one per row; None at the prefill), of `steps` in all.
    -> `StepOutputs`"""

    width: int
    number: int
    token: np.ndarray | None
    steps: int


@dataclass
class OpenStep:
    """Make the side decoding step `number` as a forward pass of its own (`StepSide`): the steps before it
    decoded again, fed `tokens` (the token of every step from 1 to `number`); what is recorded and re-run
    from then on is that step. -> None"""

    number: int
    tokens: list[np.ndarray]


@dataclass
class RecordAgain:
    """The forward recorded once more, statistics only and its uninitialised memory poisoned as a re-run's is
    (`recording.poison_for`), the recording that re-runs follow left as it is (`bisectr.search.repeat`). -> `Trace`"""


@dataclass
class DrawsRandom:
    """Op `index` replayed twice on `values` (tid -> array, as `Replay`) with the framework's random
    generators seeded alike: do its outputs repeat (it draws from them), and is the module calling it
    in training mode? -> (bool, bool)"""

    index: int
    values: dict[int, np.ndarray]


@dataclass
class InTraining:
    """Is the module at `module` in training mode? -> bool (False where the side's framework cannot say)"""

    module: str


@dataclass
class RerunByCode:
    """From now on re-run the model's own code, not its recorded calls: its forward repeats itself only as a
    whole (it seeds its own generator). -> None"""


@dataclass
class EachRank:
    """`request` answered by every rank of a side on several processes, not only by the first. -> the list of
    their answers, by rank (one answer for a side on one process)"""

    request: Any


@dataclass
class Fix:
    """Make `fix`'s changes to the side, before it is recorded (`--fix-nondeterminism`). -> None"""

    fix: SideFix


Request = (
    Rerun
    | Replay
    | ReplayVJP
    | Backward
    | Float64Outputs
    | Float64Gradients
    | LeafValue
    | RecordedCall
    | TrainStep
    | StepValues
    | TrainerSettings
    | DecodeStep
    | OpenStep
    | RecordAgain
    | DrawsRandom
    | InTraining
    | RerunByCode
    | Fix
    | EachRank
    | OpenCompiled
    | CloseCompiled
    | CompiledQuestion
)


# Requests that run the recorded pass (or ops of it) again: each starts from the state the pass was recorded in.
RUNS_THE_RECORDED_PASS = (
    Rerun,
    Replay,
    ReplayVJP,
    Backward,
    Float64Outputs,
    Float64Gradients,
    RecordAgain,
    DrawsRandom,
)


class SideRunner(Protocol):
    def record(self, writer: TensorWriter | None, options: RecordOptions, watch: Watch | None = None) -> Trace:
        """Record one forward pass, writing tensor values through `writer`; `watch`: see `record_side`."""

    def run(self, request: Request) -> Any:
        """Answer `request` about the recorded forward (each request says what it returns)."""


# Called as a recording starts with a function returning the number of ops recorded so far (read
# from another thread by a progress display: the recording itself pays nothing for it).
Watch = Callable[[Callable[[], int]], None]


def recorded_through(
    runner: SideRunner, writer: TensorWriter | None, options: RecordOptions, watch: Watch | None = None
) -> Trace:
    """One forward pass recorded by `runner`, whose trace reads the model's parameters and buffers
    (which a run does not copy) from the live model through the runner."""
    trace = runner.record(writer, options, watch)
    trace.leaf_reader = lambda tid: runner.run(LeafValue(tid))
    return trace


def record_side(
    side: BuiltSide, writer: TensorWriter | None, options: RecordOptions, watch: Watch | None = None
) -> tuple[Trace, RecordedCalls]:
    """Record one side's forward pass: its trace, and the calls and leaves that replays need."""
    items = side.input_items()
    device, dtype = side.adapter.describe(side.model, [value for _, value in items])
    trace = Trace(side.role, side.adapter.name, device, dtype)
    recorder = Recorder(side.adapter, side.model, items, trace, writer, options)
    if watch is not None:
        watch(lambda: recorder.op_count)
    try:
        outputs = intercepted_forward(side, recorder)
    except UnreadableTensorError as exc:
        raise UnreadableTensorError(
            f"{side.model_file}: in the {side.role} model returned by {side.function}(), {exc}"
        ) from None
    pairs = output_pairs(side.adapter, outputs)
    if not pairs:
        raise ModelFileError(
            f"{side.model_file}: the {side.role} model returned no tensors (got {type(outputs).__name__})"
        )
    recorder.finish(pairs)
    if writer is not None:
        writer.raise_failure()  # an op the failed write cut short computed nothing that was recorded
    _refuse_unrecorded_outputs(side, trace)
    return trace, recorder.recorded


def _is_input_or_weight(info: TensorInfo) -> bool:
    return leaf_kind(info.leaf) in ("input", "param", "buffer")


def _refuse_unrecorded_outputs(side: BuiltSide, trace: Trace) -> None:
    """Fail closed: a verdict speaks only of what was recorded. A side whose floating outputs no
    recorded op computed from its inputs or parameters is refused."""
    where = f"{side.model_file}: the {side.role} model returned by {side.function}()"
    elsewhere = (
        "computed outside what bisectr sees (in another process, loaded from a file, copied from numpy); "
        "bisectr compares only the framework ops it records in its own process"
    )
    if not trace.ops:
        raise UnrecordedOutputError(
            f"{where} ran no {side.adapter.name} op that bisectr could record: its outputs were "
            f"{elsewhere}. Give {side.function}() a model that computes its outputs here"
        )
    unseen = [
        key
        for key, tid in trace.outputs.items()
        if is_floating(trace.tensors[tid].dtype) and not trace.reaches(tid, _is_input_or_weight)
    ]
    if unseen:
        raise UnrecordedOutputError(
            f"{where} returned {', '.join(map(repr, unseen))}, which no recorded op computed from "
            f"its inputs or parameters ({len(trace.ops)} ops recorded): {'they were' if len(unseen) > 1 else 'it was'} "
            f"{elsewhere}"
        )


class LocalSide:
    """A side whose model lives in this process: each request is answered by its engine (`ANSWERS`).
    `on_ranks`: this process is one rank of a side on several processes."""

    def __init__(self, side: BuiltSide, on_ranks: bool = False):
        self.side, self.on_ranks = side, on_ranks
        side.adapter.hold_whole(side.model)
        self.recorded = RecordedCalls()
        self.trace: Trace | None = None
        self.trainers: dict[int, Trainer] = {}  # by width (`TrainStep`)
        self.decoders: dict[int, Decoder] = {}  # by width (`DecodeStep`)
        self.compiled: CompiledProbe | None = None  # the compiled call `OpenCompiled` made ready
        self.state: list[tuple[Any, np.ndarray]] = []  # the buffers as the pass was recorded (`_restore_state`)

    def record(self, writer: TensorWriter | None, options: RecordOptions, watch: Watch | None = None) -> Trace:
        self.state = self._buffers()
        try:
            self.trace, self.recorded = record_side(self.side, writer, options, watch)
        finally:
            self._restore_state()
        return self.trace

    def run(self, request: Request) -> Any:
        answer = self.ANSWERS.get(type(request))
        if answer is None:
            raise TypeError(f"not a side request: {request!r}")
        if not isinstance(request, RUNS_THE_RECORDED_PASS):
            return answer(self, request)
        self._restore_state()
        try:
            return answer(self, request)
        finally:
            self._restore_state()

    def _buffers(self) -> list[tuple[Any, np.ndarray]]:
        """The model's state with its values now: its buffers, and the parameters no gradient reaches (paddle keeps a
        norm's running statistics as such), before the pass updates them."""
        adapter = self.side.adapter
        return [
            (tensor, np.array(adapter.to_numpy(tensor), copy=True))
            for name, tensor in adapter.named_leaves(self.side.model)
            if leaf_kind(name) == "buffer" or not adapter.requires_grad(tensor)
        ]

    def _restore_state(self) -> None:
        """Give back the buffers the values they had when the pass was recorded: a forward that updates its own
        state (a BatchNorm in training mode) then runs again as it was recorded."""
        adapter = self.side.adapter
        for tensor, values in self.state:
            if not np.array_equal(adapter.to_numpy(tensor), values, equal_nan=True):
                adapter.assign(tensor, values)

    def _rerun(self, request: Rerun) -> RerunResult:
        return rerun(self.side, self.trace, self.recorded, request.patches, request.capture, request.every_op)

    def _replay(self, request: Replay) -> dict[int, np.ndarray]:
        return replay(self.side.adapter, self.trace, self.recorded, request.indices, request.values, request.float64)

    def _replay_vjp(self, request: ReplayVJP) -> dict[int, np.ndarray | None]:
        return replay_vjp(
            self.side.adapter,
            self.trace,
            self.recorded,
            request.indices,
            request.values,
            request.upstream,
            request.float64,
        )

    def _backward(self, request: Backward) -> Gradients:
        return backward(
            self.side, self.trace, request.seeds, request.gradient_patches, request.activations, request.reduced
        )

    def _float64_outputs(self, request: Float64Outputs) -> Float64Run:
        return float64_outputs(self.side, self.trace, self.recorded, request.leaf_values)

    def _float64_gradients(self, request: Float64Gradients) -> Float64Run:
        return float64_gradients(self.side, self.trace, request.seeds, request.leaf_values)

    def _leaf_value(self, request: LeafValue) -> np.ndarray:
        return self.side.adapter.to_numpy(self.recorded.leaves[request.tid][0])

    def _recorded_call(self, request: RecordedCall) -> Call | None:
        calls = self.recorded.calls
        return calls[request.index] if request.index < len(calls) else None

    def _train_step(self, request: TrainStep) -> StepFacts:
        return self._trainer(request.width, request.seeds).step(request.number)

    def _step_values(self, request: StepValues) -> np.ndarray | None:
        return self.trainers[request.width].read(request.measure, request.parameter)

    def _trainer_settings(self, request: TrainerSettings) -> tuple[dict, dict]:
        trainer = self.trainers[request.width]
        return trainer.settings(), trainer.weight_decays()

    def _decode_step(self, request: DecodeStep) -> StepOutputs:
        if request.number == 0:
            self.decoders[request.width] = Decoder(self.side, float64=request.width == 64)
        return self.decoders[request.width].step(request.number, request.token, request.steps)

    def _open_step(self, request: OpenStep) -> None:
        decoder = Decoder(self.side, float64=False)
        for number in range(request.number):
            decoder.step(number, request.tokens[number - 1] if number else None, request.number)
        self.side = decoder.step_side(request.tokens[request.number - 1] if request.number else None)
        self.trace, self.recorded = None, RecordedCalls()

    def _record_again(self, request: RecordAgain) -> Trace:
        poisons = {
            op.index: poison_for(self.trace.tensors[op.outputs[0]]) for op in self.trace.ops if op.op in UNINITIALISED
        }
        return record_side(self.side, None, RecordOptions(store_values=False, poison=poisons))[0]

    def _draws_random(self, request: DrawsRandom) -> tuple[bool, bool]:
        adapter = self.side.adapter
        runs = []
        for _ in range(2):
            adapter.seed(0)
            runs.append(replay(adapter, self.trace, self.recorded, [request.index], request.values))
        repeats = all(np.array_equal(runs[0][tid], runs[1][tid], equal_nan=True) for tid in runs[0])
        return repeats, adapter.in_training(self.side.model, self.trace.ops[request.index].module)

    def _in_training(self, request: InTraining) -> bool:
        adapter = self.side.adapter
        return isinstance(adapter, Determinism) and adapter.in_training(self.side.model, request.module)

    def _rerun_by_code(self, request: RerunByCode) -> None:
        self.recorded.faithful = False

    def _fix(self, request: Fix) -> None:
        self.side.apply(request.fix)

    def _each_rank(self, request: EachRank) -> list[Any]:
        return [self.run(request.request)]

    def _open_compiled(self, request: OpenCompiled) -> tuple[str, float] | None:
        self.compiled = probe_compiled(self.side.adapter, self.trace, self.recorded, request.index, request.values)
        return None if self.compiled is None else (self.compiled.backend, self.compiled.rounding())

    def _close_compiled(self, request: CloseCompiled) -> None:
        self.compiled = None

    def _compiled_question(self, request: CompiledQuestion) -> Any:
        return answer_compiled(self.compiled, request)

    def _trainer(self, width: int, seeds: dict[str, np.ndarray]) -> Trainer:
        """The trainer at `width`, made at its first step (from the model file as the side was built from it)."""
        if width not in self.trainers:
            side = self.side
            module = sys.modules.get(module_name(side.model_file)) or load_module(side.model_file)
            self.trainers[width] = Trainer(side, module, seeds, float64=width == 64, on_ranks=self.on_ranks)
        return self.trainers[width]

    ANSWERS: dict[type, Callable[[LocalSide, Any], Any]] = {
        Rerun: _rerun,
        Replay: _replay,
        ReplayVJP: _replay_vjp,
        Backward: _backward,
        Float64Outputs: _float64_outputs,
        Float64Gradients: _float64_gradients,
        LeafValue: _leaf_value,
        RecordedCall: _recorded_call,
        TrainStep: _train_step,
        StepValues: _step_values,
        TrainerSettings: _trainer_settings,
        DecodeStep: _decode_step,
        OpenStep: _open_step,
        RecordAgain: _record_again,
        DrawsRandom: _draws_random,
        InTraining: _in_training,
        RerunByCode: _rerun_by_code,
        Fix: _fix,
        EachRank: _each_rank,
        OpenCompiled: _open_compiled,
        CloseCompiled: _close_compiled,
        **dict.fromkeys(CompiledQuestion.__subclasses__(), _compiled_question),
    }
