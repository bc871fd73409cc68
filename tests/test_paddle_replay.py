"""Replaying recorded ops of paddle.vision classifiers (real Paddle, no mocks): each op computes its
recorded outputs again from its recorded inputs, and moves when its inputs move, also when the
move comes from an earlier op (the way a patch reaches an op in a bisection)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("paddle")

import bisectr  # noqa: E402
from bisectr.capture.trace import is_floating  # noqa: E402

CLASSIFIERS = ("resnet18", "mobilenet_v2")

MODEL_FILE = """
def _classifier(name):
    import numpy as np
    import paddle

    paddle.seed(0)
    model = getattr(paddle.vision.models, name)(num_classes=10)
    model.eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype("float32")
    return model, (paddle.to_tensor(x),)


def resnet18():
    return _classifier("resnet18")


def mobilenet_v2():
    return _classifier("mobilenet_v2")
"""


@pytest.fixture(scope="module", params=CLASSIFIERS)
def run(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    model_file = directory / "classifiers.py"
    model_file.write_text(MODEL_FILE)
    return bisectr.trace(model_file, reference=request.param, candidate=request.param, out=directory / "run")


def _perturbed(trace, values: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    return {
        tid: (v * 1.5 + 0.25).astype(v.dtype) if is_floating(trace.tensors[tid].dtype) else v
        for tid, v in values.items()
    }


def _live_outputs(trace) -> set[int]:
    """Op outputs that a later op reads or the model returns, and that hold values."""
    read = {tid for op in trace.ops for tid in op.inputs} | set(trace.outputs.values())
    return {
        tid
        for op in trace.ops
        for tid in op.outputs
        if tid in read and is_floating(trace.tensors[tid].dtype) and np.prod(trace.tensors[tid].shape) > 0
    }


def test_ops_read_only_tensors_the_trace_names(run):
    """An op input that no op produced and that is neither the model's input nor a parameter or
    buffer is a tensor the recording lost track of: patches and replays before it cannot reach it."""
    trace = run.traces["candidate"]
    unnamed = [
        (op.index, op.framework_op, trace.tensors[tid].leaf)
        for op in trace.ops
        for tid in op.inputs
        if trace.tensors[tid].producer is None
        and not trace.tensors[tid].leaf.startswith(("input:", "param:", "buffer:"))
    ]
    assert unnamed == []


def replayed(run, op, inputs: dict) -> list[np.ndarray]:
    """Op `op` of the candidate replayed on `inputs`: its outputs in recorded order."""
    computed = run.live.replay("candidate", [op.index], inputs)
    return [computed[tid] for tid in op.outputs]


def test_replay_on_recorded_inputs_reproduces_every_output(run):
    trace = run.traces["candidate"]
    failed = []
    for op in trace.ops:
        outputs = replayed(run, op, {tid: trace.value(tid) for tid in op.inputs})
        assert len(outputs) == len(op.outputs)
        failed += [
            (op.index, op.framework_op, k)
            for k, (values, tid) in enumerate(zip(outputs, op.outputs))
            if not np.array_equal(values, trace.value(tid), equal_nan=True)
        ]
    assert failed == []


def test_replay_on_perturbed_inputs_moves_every_live_output(run):
    trace = run.traces["candidate"]
    live = _live_outputs(trace)
    stuck = []
    for op in trace.ops:
        if not any(is_floating(trace.tensors[tid].dtype) for tid in op.inputs):
            continue
        outputs = replayed(run, op, _perturbed(trace, {tid: trace.value(tid) for tid in op.inputs}))
        stuck += [
            (op.index, op.framework_op, k)
            for k, (values, tid) in enumerate(zip(outputs, op.outputs))
            if tid in live and np.array_equal(values, trace.value(tid))
        ]
    assert stuck == []


def test_a_perturbed_input_reaches_every_op_through_replays(run):
    """Replay the ops in order, each on what the replays before it made, from a perturbed model
    input: every op of a classifier depends on its input, so every live output moves."""
    trace = run.traces["candidate"]
    (tid_in,) = (tid for name, tid in trace.leaves.items() if name.startswith("input:"))
    values = _perturbed(trace, {tid_in: trace.value(tid_in)})
    live = _live_outputs(trace)
    stuck = []
    for op in trace.ops:
        inputs = {tid: values[tid] if tid in values else trace.value(tid) for tid in op.inputs}
        for values_out, tid in zip(replayed(run, op, inputs), op.outputs):
            values[tid] = values_out
            if tid in live and np.array_equal(values_out, trace.value(tid)):
                stuck.append((op.index, op.framework_op, op.module))
    assert stuck == []
    assert all(not np.array_equal(values[tid], trace.value(tid)) for tid in trace.outputs.values())
