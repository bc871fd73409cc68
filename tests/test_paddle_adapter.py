"""The Paddle adapter against real Paddle (and PyTorch for the cross-framework case); no mocks."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import bisectr  # noqa: E402
from bisectr.adapters.paddle import PaddleAdapter, patch_counts  # noqa: E402
from bisectr.errors import TraceMismatchError, UserModelError  # noqa: E402
from bisectr.capture.recording import RecordOptions, Recorder  # noqa: E402
from bisectr.engines.float64 import float64_replay  # noqa: E402
from bisectr.engines.values import ValuesInterpreter  # noqa: E402
from bisectr.sides.runner import Rerun  # noqa: E402
from bisectr.capture.trace import Trace  # noqa: E402
from conftest import assert_replay_matches_model_rerun  # noqa: E402

MODEL = Path(__file__).parent / "models" / "paddle_span.py"
LINES = {
    m.group(1): n for n, line in enumerate(MODEL.read_text().splitlines(), 1) if (m := re.search(r"# @(\w+)", line))
}
TRACKED = {"matmul", "linear", "layer_norm", "softmax", "gelu", "add"}


def _load_model_module():
    spec = importlib.util.spec_from_file_location("paddle_span_for_tests", MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected_tracked_ops() -> list[tuple[str, str, str]]:
    """(canonical op, module path, marker of the user line) of every tracked op, in order."""
    expected = []
    for i in range(2):
        layer, attn = f"layers.{i}", f"layers.{i}.attn"
        expected += [
            ("linear", f"{attn}.q_proj", "attn"),
            ("linear", f"{attn}.k_proj", "attn"),
            ("linear", f"{attn}.v_proj", "attn"),
            ("matmul", attn, "attn"),
            ("softmax", attn, "attn"),
            ("matmul", attn, "attn"),
            ("linear", f"{attn}.out_proj", "attn"),
            ("add", layer, "res1"),
            ("layer_norm", f"{layer}.norm1", "norm1"),
            ("linear", f"{layer}.ff1", "ff"),
            ("gelu", f"{layer}.act", "ff"),
            ("linear", f"{layer}.ff2", "ff"),
            ("add", layer, "res2"),
            ("layer_norm", f"{layer}.norm2", "norm2"),
        ]
    expected += [
        ("linear", "proj", "proj"),
        ("gelu", "", "gelu"),
        ("matmul", "", "bilinear1"),
        ("matmul", "", "bilinear2"),
        ("add", "", "bias"),
        ("softmax", "", "softmax"),
    ]
    return expected


def _op_at(trace: Trace, op: str, marker: str, occurrence: int = 0):
    found = [o for o in trace.ops if o.op == op and o.source.endswith(f"paddle_span.py:{LINES[marker]}")]
    return found[occurrence]


def _wrapped_objects() -> list[str]:
    """Anything of the adapter's still installed in any module, in Tensor or in Layer."""
    left = []
    for name, module in list(sys.modules.items()):
        if isinstance(module, types.ModuleType):
            for attr, value in list(vars(module).items()):
                if type(value) is types.FunctionType and hasattr(value, "_bisectr_original"):
                    left.append(f"{name}.{attr}")
    for cls in (paddle.Tensor, paddle.nn.Layer):
        left += [f"{cls.__name__}.{a}" for a, v in vars(cls).items() if hasattr(v, "_bisectr_original")]
    return left


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return bisectr.trace(MODEL, out=tmp_path_factory.mktemp("runs") / "span")


def test_tracked_ops_are_recorded_once_with_module_and_source(run):
    for trace in (run.reference, run.candidate):
        assert trace.framework == "paddle" and trace.device == "cpu" and trace.dtype == "float32"
        got = [(o.op, o.module, o.source) for o in trace.ops if o.op in TRACKED]
        expected = _expected_tracked_ops()
        assert [(op, module) for op, module, _ in got] == [(op, module) for op, module, _ in expected]
        for (op, module, source), (_, _, marker) in zip(got, expected):
            assert source.endswith(f"{MODEL.name}:{LINES[marker]}"), (op, module, source, marker)
    names = {o.framework_op for o in run.candidate.ops}
    assert {
        "_C_ops.linear",
        "_C_ops.matmul",
        "_C_ops.layer_norm",
        "_C_ops.softmax",
        "_C_ops.gelu",
        "_C_ops.add_",
        "Tensor.__add__",
        "Tensor.__mul__",
        "Tensor.__getitem__",
        "Tensor.__setitem__",
    } <= names
    # In-place ops are flagged and write a new version of the tensor they modify.
    bias_op, mask_op = _op_at(run.candidate, "add", "bias"), _op_at(run.candidate, "setitem", "mask")
    assert bias_op.inplace and mask_op.inplace and mask_op.inputs == bias_op.outputs
    # The transposed operand of the span head's second matmul comes from the user's `paddle.transpose`.
    transpose = run.candidate.producer_op(_op_at(run.candidate, "matmul", "bilinear2").inputs[1])
    assert transpose.op == "transpose" and transpose.source.endswith(f":{LINES['bilinear2']}")
    leaves = run.candidate.leaves
    assert {"input:0", "param:classifier", "param:layers.0.attn.q_proj.weight", "buffer:logit_bias"} <= set(leaves)


def test_nothing_is_missing_compared_with_paddles_own_api_log():
    """Paddle logs every C++ forward API it runs ("Forward Debug Info", the log behind
    `paddle.utils.capture_forward_subgraph_guard`). Markers written to the same stream around
    each op the adapter routes to bisectr's Recorder show which recorded op ran each API:
    none may run outside one."""
    from paddle.base.framework import vlog_guard
    from paddle.utils.fwd_graph_utils import capture_stderr, parse_debug_info

    model, inputs = _load_model_module().reference()
    adapter = PaddleAdapter()
    trace = Trace("candidate", "paddle", "cpu", "float32")
    recorder = Recorder(adapter, model, [("0", inputs[0])], trace, None, RecordOptions(store_values=False))

    class Marking:
        def call(self, name, fn, args, kwargs):
            os.write(2, f"\n@@bisectr-begin {name}\n".encode())
            try:
                return recorder.call(name, fn, args, kwargs)
            finally:
                os.write(2, b"\n@@bisectr-end\n")

        def enter_module(self, path):
            recorder.enter_module(path)

        def exit_module(self):
            recorder.exit_module()

    pytest_stderr, sys.stderr = sys.stderr, sys.__stderr__  # Paddle's helper redirects sys.stderr's descriptor: fd 2
    try:
        with capture_stderr() as log, vlog_guard(3):
            with adapter.intercept(model, Marking()):
                model(*inputs)
    finally:
        sys.stderr = pytest_stderr
    log = log.getvalue()

    token = re.compile(r"@@bisectr-begin (\S+)|@@bisectr-end|\nForward Debug Info \{.*? \] \} ", re.DOTALL)
    ours: list[tuple[str, list[str]]] = []
    outside, current = [], None
    for match in token.finditer(log):
        if match.group(1):
            current = (match.group(1), [])
            ours.append(current)
        elif match.group(0) == "@@bisectr-end":
            current = None
        else:
            api = re.sub(r"\d+$", "", parse_debug_info(match.group(0))["API_Name"])  # drop the unique-name counter
            (current[1] if current else outside).append(api)
    assert log.count("Forward Debug Info {") == sum(len(apis) for _, apis in ours) + len(outside) > 60
    assert outside == []
    assert [name for name, _ in ours] == [op.framework_op for op in trace.ops]
    # Each recorded op ran the API of its own name; the exceptions are systematic:
    # the CPU `linear` kernel logs as matmul + add, `x * scalar` as scale, indexing as slice / set_value_.
    composite = {
        "_C_ops.linear": ["matmul", "add"],
        "Tensor.__mul__": ["scale"],
        "Tensor.__add__": ["add"],
        "Tensor.__getitem__": ["slice"],
        "Tensor.__setitem__": ["set_value_"],
    }
    for name, apis in ours:
        assert apis == composite.get(name, [name.removeprefix("_C_ops.")]), (name, apis)


def test_patches_are_removed_after_recording_and_after_the_model_raises(tmp_path):
    import paddle.nn.layer.transformer as transformer

    tensor_module = sys.modules["paddle.tensor"]
    originals = (
        paddle._C_ops.matmul,
        paddle.Tensor.__matmul__,
        paddle.nn.Layer.__call__,
        paddle.tensor.matmul,
        tensor_module.matmul,
        transformer.tensor.matmul,
        paddle.Tensor.__getitem__,
    )
    tensor_dict, c_ops = dict(vars(paddle.Tensor)), dict(vars(paddle._C_ops))

    def unchanged():
        now = (
            paddle._C_ops.matmul,
            paddle.Tensor.__matmul__,
            paddle.nn.Layer.__call__,
            paddle.tensor.matmul,
            tensor_module.matmul,
            transformer.tensor.matmul,
            paddle.Tensor.__getitem__,
        )
        assert all(a is b for a, b in zip(now, originals))
        assert tensor_module.matmul is paddle._C_ops.matmul and type(paddle._C_ops.matmul) is types.BuiltinFunctionType
        assert all(vars(paddle.Tensor).get(k) is v for k, v in tensor_dict.items())
        assert all(vars(paddle._C_ops).get(k) is v for k, v in c_ops.items())
        assert _wrapped_objects() == []

    bisectr.trace(MODEL, out=tmp_path / "ok", store_values=False)
    unchanged()
    with pytest.raises(UserModelError, match="ValueError: the model gave up halfway"):
        bisectr.trace(MODEL, candidate="raising", out=tmp_path / "raises")
    unchanged()
    assert not (tmp_path / "raises").exists()
    # Inside the context the wrappers are installed, and the model's own error passes through.
    model, inputs = _load_model_module().raising()
    seen = []

    class Listener:
        def call(self, name, fn, args, kwargs):
            seen.append(name)
            return fn(*args, **kwargs)

        def enter_module(self, path):
            pass

        def exit_module(self):
            pass

    with pytest.raises(ValueError):
        with PaddleAdapter().intercept(model, Listener()):
            assert paddle._C_ops.matmul is not originals[0] and tensor_module.matmul is not originals[4]
            assert paddle.nn.Layer.__call__ is not originals[2]
            model(*inputs)
    assert "_C_ops.layer_norm" in seen
    unchanged()
    counts = patch_counts()
    assert (
        counts["_C_ops"] > 800 and counts["module_bindings"] > 200 and counts["Tensor"] >= 40 and counts["Layer"] == 1
    )


def test_recording_twice_gives_the_same_ops(tmp_path, run):
    again = bisectr.trace(MODEL, out=tmp_path / "again", store_values=False)

    def sequence(trace):
        shapes = lambda tids: [trace.tensors[t].shape for t in tids]  # noqa: E731
        return [(o.framework_op, o.module, o.source, shapes(o.inputs), shapes(o.outputs)) for o in trace.ops]

    assert sequence(again.candidate) == sequence(run.candidate) == sequence(run.reference)
    assert len(run.candidate.ops) == 55


def test_rerun_with_patches_replaces_outputs_including_in_place_ops(run):
    trace = run.candidate
    recorded = {key: trace.value(tid) for key, tid in trace.outputs.items()}
    all_outputs = {tid: trace.value(tid) for op in trace.ops for tid in op.outputs}
    same = run.live.ask("candidate", Rerun(all_outputs))
    for key in recorded:
        assert np.array_equal(same.outputs[key], recorded[key])

    middle = _op_at(trace, "layer_norm", "norm1", 1)  # layers.1.norm1
    zeroed = run.live.ask(
        "candidate", Rerun({middle.outputs[0]: np.zeros(trace.tensors[middle.outputs[0]].shape, np.float32)})
    )
    for key in recorded:
        assert not np.allclose(zeroed.outputs[key], recorded[key])

    rng = np.random.default_rng(0)
    bias_op, mask_op = _op_at(trace, "add", "bias"), _op_at(trace, "setitem", "mask")

    def softmax(v):
        return np.exp(v - v.max(-1, keepdims=True)) / np.exp(v - v.max(-1, keepdims=True)).sum(-1, keepdims=True)

    values = rng.standard_normal(trace.tensors[bias_op.outputs[0]].shape).astype(np.float32)
    # `logits.add_(bias)` patched: the later `logits[:, :, 0] = -5` still applies to the patched tensor.
    patched = run.live.ask("candidate", Rerun({bias_op.outputs[0]: values}, {bias_op.outputs[0]}))
    expected = values.copy()
    expected[:, :, 0] = -5.0
    assert np.array_equal(patched.outputs["logits"], expected)
    np.testing.assert_allclose(patched.outputs["probs"], softmax(expected), rtol=1e-5, atol=1e-7)
    assert np.array_equal(patched.captured[bias_op.outputs[0]], values)
    # `logits[:, :, 0] = -5` patched: the returned logits are exactly the patch.
    patched = run.live.ask("candidate", Rerun({mask_op.outputs[0]: values}))
    assert np.array_equal(patched.outputs["logits"], values)
    np.testing.assert_allclose(patched.outputs["probs"], softmax(values), rtol=1e-5, atol=1e-7)
    # A patched leaf (the classifier parameter) changes what reads it, not the model.
    model = run.live.runners["candidate"].side.model
    before = model.classifier.numpy()
    classifier = run.candidate.leaves["param:classifier"]
    patched = run.live.ask("candidate", Rerun({classifier: np.zeros_like(before)}))
    logit_bias = model.logit_bias.numpy()
    assert np.array_equal(patched.outputs["logits"][:, :, 1:], np.broadcast_to(logit_bias[1:], (2, 4, 7)))
    assert np.array_equal(model.classifier.numpy(), before)


def test_executing_the_recorded_calls_matches_rerunning_the_model(run):
    assert_replay_matches_model_rerun(run, "candidate")


def test_values_read_into_python_are_counted_and_the_model_is_rerun(tmp_path):
    """`float(t)` bakes a value into the calls after it: the recorder counts it, and re-runs
    go through the model's code, where a patch changes what is read (and so the multiply
    no longer reproduces its recorded values from its recorded tensor inputs)."""
    path = tmp_path / "paddle_reads.py"
    path.write_text(
        "def _model():\n"
        "    import paddle\n"
        "    def forward(x):\n"
        "        scale = float(x.max()) + x.mean().item()\n"
        "        return x * scale\n"
        "    return forward, (paddle.to_tensor([1.0, 2.0]),)\n"
        "reference = candidate = _model\n"
    )
    run = bisectr.trace(path, out=tmp_path / "run")
    side = run.live.runners["candidate"]
    assert side.recorded.value_reads == 2 and not side.recorded.replayable(side.side.adapter)
    # the float64 check runs the model's code too
    assert float64_replay(side.side.adapter, side.trace, side.recorded, {}) is None
    maximum = next(op for op in run.candidate.ops if op.op == "max").outputs[0]
    np.testing.assert_allclose(
        run.live.ask("candidate", Rerun({maximum: np.array(2.0, np.float32)})).outputs["output"], [3.5, 7.0]
    )
    with pytest.raises(TraceMismatchError, match=r"at op 2 \(Tensor.__mul__ .*computes other values"):
        run.live.ask("candidate", Rerun({maximum: np.array(4.0, np.float32)}))


def test_replay_in_float64_matches_numpy_truth(run):
    trace, calls, adapter = run.candidate, run.live.runners["candidate"].recorded.calls, PaddleAdapter()

    def replay(op, float64=True):
        values = {tid: trace.value(tid) for tid in op.inputs}
        interpreter = ValuesInterpreter(adapter, trace, calls, values, float64)
        interpreter.run([op.index])
        (out,) = (interpreter.computed[tid] for tid in op.outputs)
        assert out.dtype == (np.float64 if float64 else np.float32)
        return out, [values[t].astype(np.float64) for t in op.inputs]

    matmul = _op_at(trace, "matmul", "bilinear1")
    out, (query_reps, classifier) = replay(matmul)
    truth = query_reps @ classifier
    assert np.max(np.abs(out - truth)) <= 1e-12 * np.max(np.abs(truth))
    assert np.max(np.abs(trace.value(matmul.outputs[0]) - truth)) > 1e-10 * np.max(np.abs(truth))  # fp32 is not

    norm = _op_at(trace, "layer_norm", "norm2", 1)
    out, (x, weight, bias) = replay(norm)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    truth = (x - mean) / np.sqrt(var + 1e-5) * weight + bias
    assert np.max(np.abs(out - truth)) <= 1e-11 * np.max(np.abs(truth))  # eps is kept as float32: ~1e-13
    # Replaying with the recorded float32 values reproduces the recorded output bitwise.
    out32, _ = replay(norm, float64=False)
    assert np.array_equal(out32, trace.value(norm.outputs[0]))


def test_torch_reference_and_paddle_candidate_agree(tmp_path):
    run = bisectr.trace(MODEL, reference="torch_reference", out=tmp_path / "cross")
    assert run.reference.framework == "torch" and run.candidate.framework == "paddle"
    assert set(run.reference.outputs) == set(run.candidate.outputs) == {"logits", "probs"}
    for trace in (run.reference, run.candidate):
        ops = [o.op for o in trace.ops]
        assert (ops.count("matmul"), ops.count("linear"), ops.count("layer_norm"), ops.count("softmax")) == (
            6,
            13,
            4,
            3,
        )
    assert run.output_error().max_rel < 1e-5
    for pair in run.output_pairs:
        assert pair.metrics.max_rel < 1e-5


def test_plain_function_with_copy_into_a_tensor():
    """A function model (no Layer): `copy_` writes in place without bumping Paddle's inplace
    version; the adapter makes it visible, so the op is recorded in place and patchable."""
    from bisectr.engines.patched import PatchedRerun

    def forward(x):
        out = paddle.zeros_like(x)
        out.copy_(x * 2.0, False)
        return -out + 1.0

    adapter = PaddleAdapter()
    x = paddle.to_tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    trace = Trace("candidate", "paddle", "cpu", "float32")
    recorder = Recorder(adapter, forward, [("0", x)], trace, None, RecordOptions(store_values=False))
    with adapter.intercept(forward, recorder):
        recorded = forward(x)
    recorder.finish([("output", recorded)])
    assert [o.framework_op for o in trace.ops] == [
        "_C_ops.full_like",
        "Tensor.__mul__",
        "Tensor.copy_",
        "Tensor.__neg__",
        "Tensor.__add__",
    ]
    assert [o.op for o in trace.ops] == ["full", "mul", "copy", "neg", "add"]
    copy_op = trace.ops[2]
    assert copy_op.inplace and copy_op.inputs[0] == trace.ops[0].outputs[0] and len(copy_op.outputs) == 1
    assert {o.module for o in trace.ops} == {""}
    runner = PatchedRerun(adapter, trace, {copy_op.outputs[0]: np.full((2, 3), 7.0, np.float32)})
    with adapter.intercept(forward, runner):
        out = forward(x)
    assert np.array_equal(runner.finish([("output", out)]).outputs["output"], np.full((2, 3), -6.0, np.float32))


def test_tensor_primitives():
    adapter = PaddleAdapter()
    x = paddle.to_tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert adapter.owns(x) and adapter.is_tensor(x) and not adapter.owns(np.zeros(2))
    assert adapter.owns(paddle.nn.Linear(2, 2)) and not adapter.is_tensor(paddle.nn.Linear(2, 2))
    assert (adapter.dtype_name(x), adapter.device_name(x)) == ("float32", "cpu")
    values = adapter.to_numpy(x)
    values[0, 0] = 42  # a host copy
    assert float(x[0, 0]) == 0.0
    for dtype in ("float64", "int64", "bool", "bfloat16", "float16"):
        t = adapter.from_numpy(np.array([[1.5, 0.0], [2.0, -3.0]]), dtype, "cpu")
        assert adapter.dtype_name(t) == dtype and adapter.device_name(t) == "cpu"
    bf16 = adapter.from_numpy(np.array([1.5, 2.25], np.float32), "bfloat16", "cpu")
    assert adapter.to_numpy(bf16).dtype == np.float32 and np.array_equal(adapter.to_numpy(bf16), [1.5, 2.25])
    version = adapter.version(x)
    adapter.assign(x, np.ones((2, 3), np.float32))
    assert adapter.version(x) != version and np.array_equal(x.numpy(), np.ones((2, 3)))
    layer = paddle.nn.Linear(3, 2)
    layer.register_buffer("scale", paddle.ones([2]))
    names = [name for name, _ in adapter.named_leaves(paddle.nn.Sequential(layer))]
    assert names == ["param:0.weight", "param:0.bias", "buffer:0.scale"]
    assert adapter.internal_paths()[0] == os.path.dirname(paddle.__file__) + os.sep


def test_owns_does_not_import_paddle():
    code = (
        "import sys; from bisectr.adapters.paddle import PaddleAdapter; a = PaddleAdapter(); "
        "assert not a.owns(object()) and not a.is_tensor(1.0); assert 'paddle' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
