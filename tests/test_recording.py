"""Recording torch models: what is captured, where, and patched re-runs."""

import os

import numpy as np
import pytest

import bisectr
from bisectr.adapters import registered
from bisectr.errors import TraceMismatchError, UserModelError
from bisectr.sides.runner import Rerun
from bisectr.capture.trace import PENDING_STATS, StatsBatch, TensorInfo, TensorStats, fingerprint, tensor_stats
from bisectr.engines.patched import rerun_model
from conftest import EXAMPLES, MODELS, assert_replay_matches_model_rerun, line_of

OPS_FILE = MODELS / "torch_ops.py"


@pytest.fixture(scope="module")
def ops_run(tmp_path_factory):
    return bisectr.trace(OPS_FILE, out=tmp_path_factory.mktemp("runs") / "ops")


def _op_at(trace, marker, op):
    line = line_of(OPS_FILE, marker)
    found = [o for o in trace.ops if o.source == f"{OPS_FILE}:{line}" and o.op == op]
    assert len(found) == 1, (marker, op, [(o.op, o.source) for o in trace.ops])
    return found[0]


@pytest.mark.parametrize(
    "marker, op, module",
    [
        ("LINE_MATMUL", "matmul", ""),
        ("LINE_ADD", "add", ""),
        ("LINE_NEG", "neg", ""),
        ("LINE_LAYERS", "linear", "proj"),
        ("LINE_LAYERS", "layer_norm", "norm"),
        ("LINE_SOFTMAX", "softmax", ""),
        ("LINE_GELU", "gelu", ""),
        ("LINE_INPLACE", "mul", ""),
        ("LINE_GETITEM", "getitem", ""),
        ("LINE_SETITEM", "setitem", ""),
        ("LINE_ATTN", "attention", "attn"),
    ],
)
def test_every_kind_of_call_is_recorded_once_with_module_and_line(ops_run, marker, op, module):
    node = _op_at(ops_run.candidate, marker, op)
    assert node.module == module
    assert ops_run.candidate.graph.nodes[node.index]["op"] == op


def test_inplace_ops_write_a_new_version_of_their_input(ops_run):
    trace = ops_run.candidate
    mul = _op_at(trace, "LINE_INPLACE", "mul")
    setitem = _op_at(trace, "LINE_SETITEM", "setitem")
    assert mul.inplace and setitem.inplace
    # the in-place mul reads the GELU output and the buffer, and writes a new tensor id
    gelu = _op_at(trace, "LINE_GELU", "gelu")
    assert mul.inputs[0] == gelu.outputs[0] and mul.outputs[0] not in mul.inputs
    assert trace.tensors[mul.inputs[1]].leaf == "buffer:scale"


def test_leaves_are_named_and_graph_edges_follow_data(ops_run):
    trace = ops_run.candidate
    leaves = trace.leaves
    assert {"input:0", "param:w", "param:proj.weight", "param:norm.bias", "buffer:scale"} <= set(leaves)
    graph = trace.graph
    matmul = _op_at(trace, "LINE_MATMUL", "matmul")
    assert set(graph.predecessors(matmul.index)) == {"input:0", "param:w"}
    add = _op_at(trace, "LINE_ADD", "add")
    assert graph.has_edge(matmul.index, add.index)


def test_tensor_statistics_are_recorded(ops_run):
    trace = ops_run.candidate
    softmax = _op_at(trace, "LINE_SOFTMAX", "softmax")
    info = trace.tensors[softmax.outputs[0]]
    values = trace.value(info.tid)
    assert info.shape == (2, 3, 8) and info.dtype == "float32"
    assert info.stats.max == pytest.approx(float(values.max()))
    assert info.stats.mean == pytest.approx(1 / 8, rel=1e-5)  # rows of a softmax average 1/8
    assert info.stats.nan == 0 and info.stats.inf == 0


def test_statistics_and_fingerprints_describe_each_tensor_as_it_was_produced(ops_run):
    """Small tensors are described in batches after the forward; the GELU output is changed in
    place by a later op, and its statistics must still be those of the values it was produced with."""
    trace = ops_run.candidate
    gelu = _op_at(trace, "LINE_GELU", "gelu")
    described = [info for info in trace.tensors.values() if trace.has_value(info.tid)]  # parameters: from the model
    assert gelu.outputs[0] in {info.tid for info in described} and len(described) == len(trace.tensors)
    for info in described:
        values = trace.value(info.tid)
        expected = tensor_stats(values)
        assert info.stats.to_json() == pytest.approx(expected.to_json(), rel=1e-5, abs=1e-6), (info.tid, info.leaf)
        assert info.fingerprint == fingerprint(values), (info.tid, info.leaf)


def test_tensors_off_the_host_are_described_where_they_live_and_only_stored_ones_are_copied(tmp_path, monkeypatch):
    """A side on an accelerator is described there (`Adapter.reductions`): no GPU here, so both
    adapters are told their host tensors live elsewhere, which runs the same code. The run holds the
    statistics and fingerprints the host path gives, copies to the host only the tensors it stores
    (a run keeping no op output: one copy fewer per tensor it does not store) and finds the same culprit."""
    copies = {"count": 0}
    for adapter in registered():
        original = type(adapter).to_numpy

        def counted(self, tensor, original=original):
            copies["count"] += 1
            return original(self, tensor)

        monkeypatch.setattr(type(adapter), "to_numpy", counted)
    runs, counts = {}, {}
    for where in ("host", "device"):
        if where == "device":
            for adapter in registered():
                monkeypatch.setattr(type(adapter), "on_host", lambda self, tensor: False)
        copies["count"] = 0
        runs[where] = bisectr.trace(EXAMPLES / "tanh_gelu.py", out=tmp_path / where, value_budget=0)
        counts[where] = copies["count"]
    host, device = runs["host"], runs["device"]
    unstored = 0
    for role in ("reference", "candidate"):
        for tid, info in device.traces[role].tensors.items():
            expected = host.traces[role].tensors[tid]
            assert info.fingerprint == pytest.approx(expected.fingerprint, nan_ok=True)
            assert info.stats.to_json() == pytest.approx(expected.stats.to_json(), rel=1e-5, abs=1e-6)
            unstored += not info.stored
    assert unstored > 100 and counts["host"] - counts["device"] == unstored
    culprits = [run.bisect().culprit for run in (host, device)]
    assert culprits[0].op == culprits[1].op == "gelu" and culprits[0].candidate.source == culprits[1].candidate.source


@pytest.mark.parametrize("size", [8, StatsBatch.SMALL + 8], ids=["batched", "one by one"])
def test_statistics_skip_nan_and_inf_and_count_them(size):
    """min/max/mean/std over the finite values only, whether a tensor is described in a batch or alone."""
    values = np.zeros(size, np.float32)
    values[:6] = [1.0, -2.0, np.nan, np.inf, 3.0, -np.inf]
    info = TensorInfo(0, (size,), "float32", PENDING_STATS, [])
    batch = StatsBatch()
    batch.add(info, values)
    batch.flush()
    finite = np.concatenate([[1.0, -2.0, 3.0], np.zeros(size - 6)])
    assert info.stats.nan == 1 and info.stats.inf == 2
    assert (info.stats.min, info.stats.max, info.stats.absmax) == (-2.0, 3.0, 3.0)
    assert info.stats.mean == pytest.approx(finite.mean()) and info.stats.std == pytest.approx(finite.std())
    assert tensor_stats(np.full(4, np.nan, np.float32)) == TensorStats(0.0, 0.0, 0.0, 0.0, 0.0, nan=4, inf=0)


def test_recording_twice_gives_the_same_graph(ops_run, tmp_path):
    again = bisectr.trace(OPS_FILE, out=tmp_path / "again")
    first = [(o.framework_op, o.module, o.source, o.inputs, o.outputs) for o in ops_run.candidate.ops]
    second = [(o.framework_op, o.module, o.source, o.inputs, o.outputs) for o in again.candidate.ops]
    assert first == second


def test_rerun_with_own_values_reproduces_outputs_and_a_patch_changes_them(ops_run):
    trace = ops_run.candidate
    own = {tid: np.array(trace.value(tid)) for op in trace.ops for tid in op.outputs}
    same = ops_run.live.ask("candidate", Rerun(own)).outputs["output"]
    np.testing.assert_array_equal(same, trace.value(trace.outputs["output"]))
    mul = _op_at(trace, "LINE_INPLACE", "mul")  # patch an in-place op's result
    zeros = {mul.outputs[0]: np.zeros(trace.tensors[mul.outputs[0]].shape, np.float32)}
    captured_after = _op_at(trace, "LINE_GETITEM", "getitem").outputs[0]
    result = ops_run.live.ask("candidate", Rerun(zeros, {captured_after}))
    np.testing.assert_array_equal(result.captured[captured_after], 0.0)
    assert not np.allclose(result.outputs["output"], trace.value(trace.outputs["output"]))


def test_parameter_patch_is_used_where_the_parameter_is_read(ops_run):
    trace = ops_run.candidate
    w = trace.leaves["param:w"]
    matmul = _op_at(trace, "LINE_MATMUL", "matmul")
    result = ops_run.live.ask("candidate", Rerun({w: np.zeros((8, 8), np.float32)}, {matmul.outputs[0]}))
    np.testing.assert_array_equal(result.captured[matmul.outputs[0]], 0.0)


def test_executing_the_recorded_calls_matches_rerunning_the_model(ops_run):
    assert_replay_matches_model_rerun(ops_run, "candidate")


def test_dropout_in_training_mode_is_reported_not_mis_patched(models, tmp_path):
    run = bisectr.trace(models / "torch_dropout.py", out=tmp_path / "run")
    assert [op.op for op in run.candidate.ops] == ["linear", "dropout", "linear"]
    with pytest.raises(TraceMismatchError, match=r"at op 1 .*computes other values from the same inputs.*dropout"):
        run.live.ask("candidate", Rerun({}))
    # With dropout's output patched, neither dropout nor the linear feeding it runs again.
    dropped = run.candidate.ops[1].outputs[0]
    values = run.candidate.value(dropped)
    result = run.live.ask("candidate", Rerun({dropped: values}))
    np.testing.assert_array_equal(result.outputs["output"], run.candidate.value(run.candidate.outputs["output"]))
    with pytest.raises(TraceMismatchError, match=r"at op 1 .*dropout"):
        side = run.live.runners["candidate"]
        rerun_model(side.side, side.trace, {dropped: values})


def test_a_patch_that_takes_the_code_down_another_branch_runs_it(models, tmp_path):
    """A patched value decides a branch the recording never took: the re-run leaves the recorded path there
    and computes the other branch (a router's top-k after patched inputs, in a mixture of experts)."""
    run = bisectr.trace(models / "torch_data_dependent.py", out=tmp_path / "run")
    recorded = run.live.runners["candidate"].recorded
    assert recorded.value_reads == 1 and not recorded.replayable(run.live.runners["candidate"].side.adapter)
    doubled = run.candidate.ops[0].outputs[0]
    result = run.live.ask("candidate", Rerun({doubled: -np.ones(4, np.float32)}))
    np.testing.assert_allclose(next(iter(result.outputs.values())), np.tanh(-1.0) + 1, rtol=1e-6)


def test_a_patch_ahead_of_another_branch_still_wants_its_capture(models, tmp_path):
    """Where a tensor asked for lies past the branch, the re-run cannot number it: it departs, saying where."""
    run = bisectr.trace(models / "torch_data_dependent.py", out=tmp_path / "run")
    doubled, exponential = run.candidate.ops[0].outputs[0], run.candidate.ops[-1].outputs[0]
    with pytest.raises(TraceMismatchError, match="at op 2 .*calls Tensor.tanh where the recording called Tensor.exp"):
        run.live.ask("candidate", Rerun({doubled: -np.ones(4, np.float32)}, frozenset({exponential})))


def test_a_value_read_made_from_integers_only_keeps_the_recorded_calls(tmp_path):
    """Hugging Face's GPT-2 reads `bool((mask == 0).all())` of a mask made from the integer positions
    to build its causal mask: no patch and no float64 run can change it, so the recorded calls still
    stand in for the model's code, and give what its code gives."""
    run = bisectr.trace(MODELS / "hf_gpt2.py", out=tmp_path / "run")
    assert run.live.runners["reference"].recorded.value_reads == 0
    assert_replay_matches_model_rerun(run, "reference")


def test_autocast_around_the_calls_makes_the_model_rerun(tmp_path):
    """Under autocast the recorded calls make float32 where the forward made bfloat16: the
    replay notices and the model's code is re-run instead, with the same results."""
    run = bisectr.trace(EXAMPLES / "torch_vs_torch_bf16.py", out=tmp_path / "run")
    side = run.live.runners["candidate"]
    assert side.recorded.replayable(side.side.adapter)
    patches = {tid: run.candidate.value(tid) for tid in run.candidate.ops[10].outputs}
    result = run.live.ask("candidate", Rerun(patches))
    assert not side.recorded.faithful
    expected = rerun_model(side.side, side.trace, patches).outputs["output"]
    np.testing.assert_array_equal(result.outputs["output"], expected)
    np.testing.assert_array_equal(expected, run.candidate.value(run.candidate.outputs["output"]))


def test_user_exception_shows_user_frames_and_leaves_no_run(models, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(UserModelError) as caught:
        bisectr.trace(models / "torch_raises.py", out=out)
    assert "candidate model returned by candidate() raised RuntimeError" in str(caught.value)
    frames = caught.value.user_traceback
    assert "torch_raises.py" in frames and "cannot reshape" not in frames.splitlines()[0]
    package = os.path.dirname(bisectr.__file__) + os.sep  # the checkout itself may be a directory named bisectr
    assert package not in frames and "recording.py" not in frames
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_failure_inside_bisectr_is_not_blamed_on_the_users_model(tmp_path, monkeypatch):
    monkeypatch.setattr("bisectr.capture.recording.canonical_op", int)  # int("Tensor.matmul") fails inside the recorder
    with pytest.raises(ValueError, match="invalid literal for int"):
        bisectr.trace(OPS_FILE, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()
