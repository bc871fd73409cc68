"""The conformance test every framework adapter passes (each registered adapter whose framework
imports here): values in and out, in-place versions, float64 copies and memory addresses,
interception of a function of tensors with a recording and a patched re-run through the core,
gradients, the tables the core reads, and the optional interfaces asked for by type.
Everything is written with the adapter's own primitives and tensor operators, so a new framework
is tested by adding its module to `adapters/`."""

import importlib.util

import numpy as np
import pytest

import bisectr
from bisectr.adapters import Adapter, OpListener, Training, WeightConversion, adapter_named, facet, registered
from bisectr.adapters.base import IN_OUT, OUT_IN
from bisectr.capture.ops import canonical_op
from bisectr.sides.runner import Rerun
from bisectr.capture.trace import fingerprint, fingerprint_positions, reduced_stats, tensor_stats

ADAPTERS = [adapter for adapter in registered() if importlib.util.find_spec(adapter.name) is not None]


@pytest.fixture(params=ADAPTERS, ids=lambda adapter: adapter.name)
def adapter(request):
    __import__(request.param.name)
    return request.param


def values(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_every_adapter_module_registers_one_adapter():
    names = [adapter.name for adapter in registered()]
    assert sorted(names) == ["paddle", "torch"] and len(set(names)) == len(names)
    assert all(adapter.module_kind and adapter.repro is not None for adapter in registered())


def test_values_go_in_and_come_out_as_they_were(adapter):
    for dtype in ("float32", "float64", "int64"):
        data = (values(3, 4) * 10).astype(dtype)
        tensor = adapter.from_numpy(data, dtype, "cpu")
        assert adapter.is_tensor(tensor) and adapter.owns(tensor) and not adapter.is_tensor(data)
        assert adapter.dtype_name(tensor) == dtype and adapter.device_name(tensor).startswith("cpu")
        out = adapter.to_numpy(tensor)
        assert out.dtype == np.dtype(dtype) and np.array_equal(out, data)
    rounded = adapter.to_numpy(adapter.from_numpy(values(8), "bfloat16", "cpu"))
    assert rounded.dtype == np.float32 and 0 < np.abs(rounded - values(8)).max() <= 2**-8 * np.abs(values(8)).max()


def test_assign_writes_in_place_and_moves_the_version(adapter):
    tensor = adapter.from_numpy(values(2, 3), "float32", "cpu")
    before = adapter.version(tensor)
    adapter.assign(tensor, values(2, 3, seed=1))
    assert np.array_equal(adapter.to_numpy(tensor), values(2, 3, seed=1)) and adapter.version(tensor) != before


def test_a_float64_copy_is_cast_into_a_given_tensor_and_a_view_lies_inside_its_memory(adapter):
    for dtype in ("float32", "float16", "bfloat16"):
        tensor = adapter.from_numpy(values(5, 8), dtype, "cpu")
        into = adapter.float64_tensor(adapter.from_numpy(values(5, 8, seed=1), dtype, "cpu"))
        copy = adapter.float64_tensor(tensor, into)
        assert adapter.dtype_name(copy) == "float64"
        assert np.array_equal(adapter.to_numpy(copy), adapter.to_numpy(adapter.float64_tensor(tensor)))
        if dtype == "float32":  # the framework casts into it (bfloat16 may take a new tensor)
            assert adapter.data_address(copy) == adapter.data_address(into)
    start = adapter.data_address(into)
    assert start < adapter.data_address(into[2:]) < start + 5 * 8 * 8 and adapter.data_address(into[:1]) == start


def test_reductions_describe_a_tensor_as_its_host_values_do(adapter):
    """What a recording computes where an accelerator's tensor lives (here on the host, since the
    path is the same code) gives the statistics and fingerprint the host's values give."""
    special = values(40)
    special[[3, 7, 11]] = [np.nan, np.inf, -np.inf]
    cases = [
        (values(7, 33), "float32"),
        (values(300), "bfloat16"),
        (special, "float32"),
        (np.full(5, np.nan), "float32"),
        (np.arange(-5, 40).reshape(5, 9), "int64"),
        (values(30) > 0, "bool"),
        (np.array(2.5), "float32"),
        (values(20000) * 1e30, "float32"),
        (values(64), "float64"),
    ]
    for data, dtype in cases:
        tensor = adapter.from_numpy(data, dtype, "cpu")
        host = adapter.to_numpy(tensor)
        reductions = adapter.reductions(tensor, fingerprint_positions(host.size))
        assert adapter.on_host(tensor)
        assert reduced_stats(reductions).to_json() == pytest.approx(
            tensor_stats(host).to_json(), rel=1e-6, nan_ok=True
        ), dtype
        assert np.array_equal(reductions.picked, fingerprint(host), equal_nan=True), dtype


class Listener(OpListener):
    """Records the names of the ops an intercepted function calls."""

    def __init__(self):
        self.names: list[str] = []

    def call(self, name, fn, args, kwargs):
        self.names.append(name)
        return fn(*args, **kwargs)

    def enter_module(self, path):
        pass

    def exit_module(self):
        pass


def test_intercept_hands_every_op_to_the_listener_and_leaves_nothing_behind(adapter):
    x, w = (
        adapter.from_numpy(values(2, 3), "float32", "cpu"),
        adapter.from_numpy(values(3, 3, seed=1), "float32", "cpu"),
    )
    listener = Listener()
    with adapter.intercept(lambda a, b: (a @ b + a) * a, listener):
        out = (x @ w + x) * x
    assert [canonical_op(name) for name in listener.names] == ["matmul", "add", "mul"]
    np.testing.assert_allclose(
        adapter.to_numpy(out), (values(2, 3) @ values(3, 3, seed=1) + values(2, 3)) * values(2, 3), rtol=1e-5
    )
    _ = x + x  # nothing intercepts once the context has exited
    assert len(listener.names) == 3


def test_a_function_of_tensors_records_and_reruns_with_a_patch(adapter, tmp_path):
    x, w = (
        adapter.from_numpy(values(2, 3), "float32", "cpu"),
        adapter.from_numpy(values(3, 3, seed=1), "float32", "cpu"),
    )
    run = bisectr.compare(
        reference=(lambda a, b: (a @ b) * a, (x, w)), candidate=(lambda a, b: (a @ b) * a, (x, w)), out=tmp_path / "run"
    )
    assert run.verdict == "match" and [op.op for op in run.run.candidate.ops] == ["matmul", "mul"]
    product = run.run.candidate.ops[0].outputs[0]
    rerun = run.run.live.ask("candidate", Rerun({product: np.zeros((2, 3), np.float32)}, frozenset({product})))
    assert np.array_equal(rerun.outputs["output"], np.zeros((2, 3), np.float32)) and product in rerun.captured


def test_gradients_are_those_of_the_ops_run(adapter):
    x = adapter.gradient_leaf(adapter.from_numpy(values(4), "float64", "cpu"))
    with adapter.enable_grad():
        y = x * x
    assert adapter.requires_grad(y)
    (grad,) = adapter.gradients([y], [adapter.from_numpy(np.ones(4), "float64", "cpu")], [x])
    np.testing.assert_allclose(adapter.to_numpy(grad), 2 * values(4).astype(np.float64), rtol=1e-12)


def test_the_tables_the_core_reads_use_the_shared_vocabulary(adapter):
    assert not isinstance(adapter, WeightConversion) or adapter.linear_layout in (OUT_IN, IN_OUT)
    assert set(adapter.norm_statistics.values()) <= {"mean", "variance", "count"}
    assert all(canonical == canonical_op(canonical) for canonical in adapter.op_synonyms.values())
    assert not adapter.is_module(object()) and not adapter.owns(np.zeros(2))


def test_an_optional_interface_is_asked_for_by_type():
    torch = adapter_named("torch")
    assert facet(torch, Training) is torch and facet(torch, WeightConversion) is torch
    core_only = type("CoreOnly", (Adapter,), dict.fromkeys(Adapter.__abstractmethods__, lambda *args: None))()
    core_only.name = "other"
    with pytest.raises(TypeError, match=r"the other adapter does not implement Training \(clear_gradients, copy_model"):
        facet(core_only, Training)
