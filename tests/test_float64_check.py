"""The float64 check runs the model in float64 without a float64 copy of the model: an op
reading a parameter reads a float64 copy made for it and freed after it, whose memory the next
copy of its shape reuses unless a view of it may still read it."""

import textwrap
import weakref

import numpy as np
import pytest

import bisectr
from bisectr.adapters.torch import TorchAdapter
from bisectr.sides.runner import Float64Outputs
from bisectr.engines.float64 import Float64Copies, float64_forward, float64_replay
from conftest import MODELS


def test_the_float64_forward_holds_the_float64_parameters_of_one_op_at_a_time(monkeypatch, tmp_path):
    run = bisectr.trace(MODELS / "torch_stack.py", out=tmp_path / "run")  # 48 layers, 96 weight matrices
    alive: set[int] = set()
    most, made, fresh = [0], [0], [0]
    upcast = TorchAdapter.float64_tensor

    def counted(self, tensor, into=None):
        copy = upcast(self, tensor, into)
        if into is None:
            alive.add(id(copy))
            fresh[0] += 1
            weakref.finalize(copy, alive.discard, id(copy))
        made[0] += 1
        most[0] = max(most[0], len(alive))
        return copy

    monkeypatch.setattr(TorchAdapter, "float64_tensor", counted)
    float64 = run.live.ask("candidate", Float64Outputs({}))
    parameters = [name for name in run.candidate.leaves if name.startswith("param:")]
    assert len(parameters) == 96 and made[0] == 1 + 96  # the input, and each weight as its op reads it
    assert most[0] <= 3  # the input, and one op's weight (and bias): never the model's
    assert fresh[0] == 3  # the input, and one of each weight shape: the others are cast into released ones
    assert float64.values["output"].dtype.name == "float64"
    # the same outputs as the float32 run's, to float32 rounding
    recorded = run.candidate.value(run.candidate.outputs["output"])
    assert abs(float64.values["output"] - recorded).max() <= 1e-5 * abs(recorded).max()


@pytest.mark.parametrize(
    "model_file, candidate",
    [
        ("torch_stack.py", "candidate"),
        ("transformer_encoder.py", "candidate"),  # nn.TransformerEncoder against its paddle port
        ("hf_gpt2_paddle.py", "candidate"),  # HF's GPT-2 (reading a mask made from integer positions) vs a paddle port
        ("paddle_resnet.py", "candidate_bn_eps"),  # BatchNorm buffers
        ("torch_mha.py", "candidate"),
    ],
)
def test_the_recorded_calls_in_float64_compute_what_the_model_code_does_in_float64(model_file, candidate, tmp_path):
    run = bisectr.trace(MODELS / model_file, "reference", candidate, out=tmp_path / "run")
    for role, side in run.live.runners.items():
        first_parameter = next(name for name in run.traces[role].leaves if name.startswith("param:"))
        values = {first_parameter: 2 * run.traces[role].value(run.traces[role].leaves[first_parameter])}
        assert side.recorded.replayable(side.side.adapter)
        replayed, replayed_calls = float64_replay(side.side.adapter, side.trace, side.recorded, values)
        own, own_calls = float64_forward(side.side, side.trace, values)
        assert replayed.keys() == own.keys() and replayed_calls.narrow == own_calls.narrow
        for key, expected in own.items():
            assert replayed[key].dtype == expected.dtype == np.float64
            scale = max(float(np.abs(expected).max()), 1e-30)
            assert float(np.abs(replayed[key] - expected).max()) <= 1e-12 * scale, (role, key)


def test_the_released_float64_copies_kept_hold_at_most_four_times_the_largest():
    import torch

    adapter = TorchAdapter()
    copies = Float64Copies(adapter, {})
    addresses = {}
    for rows in range(1, 21):  # 20 weights of 20 shapes, each released after its op
        weight = torch.full((rows, 64), float(rows))
        copy = copies.make(weight, f"param:w{rows}")
        assert copy.dtype == torch.float64 and bool((copy == rows).all())
        addresses[rows] = adapter.data_address(copy)
        copies.release(copy)
        assert copies.kept_bytes <= 4 * copies.largest == 4 * rows * 64 * 8
    assert [key[0] for _, key, _ in copies.kept.values()] == [
        (17, 64),
        (18, 64),
        (19, 64),
        (20, 64),
    ]  # the oldest dropped
    again = copies.make(torch.full((20, 64), 7.0), "param:again")  # a kept shape: cast into its memory
    assert adapter.data_address(again) == addresses[20] and bool((again == 7.0).all())


VIEWED_WEIGHT = textwrap.dedent("""
    # The view of `a` is read after `b`, a weight of a's shape, is read: b's float64 copy must not
    # be cast into the memory of a's, which a's view still reads.
    def _model(framework):
        import numpy as np
        rng = np.random.default_rng(0)
        a, b, x = rng.standard_normal((8, 8)), rng.standard_normal((8, 8)), rng.standard_normal((2, 8))
        if framework == "torch":
            import torch

            class Model(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.a = torch.nn.Parameter(torch.tensor(a, dtype=torch.float32))
                    self.b = torch.nn.Parameter(torch.tensor(b, dtype=torch.float32))

                def forward(self, x):
                    a_t = self.a.t()
                    return (x @ self.b) @ a_t
            return Model(), (torch.tensor(x, dtype=torch.float32),)
        import paddle

        class Layer(paddle.nn.Layer):
            def __init__(self):
                super().__init__()
                self.a = self.create_parameter(
                    [8, 8], default_initializer=paddle.nn.initializer.Assign(a.astype("float32"))
                )
                self.b = self.create_parameter(
                    [8, 8], default_initializer=paddle.nn.initializer.Assign(b.astype("float32"))
                )

            def forward(self, x):
                a_t = self.a.T
                return paddle.matmul(paddle.matmul(x, self.b), a_t)
        return Layer(), (paddle.to_tensor(x.astype("float32")),)

    def reference():
        return _model("torch")

    def candidate():
        return _model("paddle")
""")


def test_a_float64_copy_a_view_still_reads_is_not_reused(tmp_path):
    model_file = tmp_path / "viewed_weight.py"
    model_file.write_text(VIEWED_WEIGHT)
    run = bisectr.trace(model_file, out=tmp_path / "run")
    rng = np.random.default_rng(0)
    a, b, x = (rng.standard_normal(shape).astype(np.float32).astype(np.float64) for shape in ((8, 8), (8, 8), (2, 8)))
    expected = (x @ b) @ a.T
    for role, side in run.live.runners.items():
        replayed, _ = float64_replay(side.side.adapter, side.trace, side.recorded, {})
        own, _ = float64_forward(side.side, side.trace, {})
        for outputs in (replayed, own):
            assert np.abs(outputs["output"] - expected).max() <= 1e-12 * np.abs(expected).max(), role
