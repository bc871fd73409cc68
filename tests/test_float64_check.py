"""The float64 check runs the model in float64 without a float64 copy of the model: an op
reading a parameter reads a float64 copy made for it and freed after it."""
import weakref

import numpy as np
import pytest

import bisectr
from bisectr.adapters.torch import TorchAdapter
from bisectr.sides import Float64Outputs
from conftest import MODELS


def test_the_float64_forward_holds_the_float64_parameters_of_one_op_at_a_time(monkeypatch, tmp_path):
    run = bisectr.trace(MODELS / "torch_stack.py", out=tmp_path / "run")  # 48 layers, 96 weight matrices
    alive: set[int] = set()
    most, made = [0], [0]
    upcast = TorchAdapter.float64_tensor

    def counted(self, tensor):
        copy = upcast(self, tensor)
        alive.add(id(copy))
        made[0] += 1
        weakref.finalize(copy, alive.discard, id(copy))
        most[0] = max(most[0], len(alive))
        return copy

    monkeypatch.setattr(TorchAdapter, "float64_tensor", counted)
    float64 = run.sides.run("candidate", Float64Outputs({}))
    parameters = [name for name in run.candidate.leaves if name.startswith("param:")]
    assert len(parameters) == 96 and made[0] == 1 + 96  # the input, and each weight as its op reads it
    assert most[0] <= 3  # the input, and one op's weight (and bias): never the model's
    assert float64.values["output"].dtype.name == "float64"
    # the same outputs as the float32 run's, to float32 rounding
    recorded = run.candidate.value(run.candidate.outputs["output"])
    assert abs(float64.values["output"] - recorded).max() <= 1e-5 * abs(recorded).max()


@pytest.mark.parametrize("model_file, candidate", [
    ("torch_stack.py", "candidate"),
    ("transformer_encoder.py", "candidate"),  # nn.TransformerEncoder against its paddle port
    ("hf_gpt2_paddle.py", "candidate"),  # HF's GPT-2 (reading a mask made from integer positions) vs a paddle port
    ("paddle_resnet.py", "candidate_bn_eps"),  # BatchNorm buffers
    ("torch_mha.py", "candidate"),
])
def test_the_recorded_calls_in_float64_compute_what_the_model_code_does_in_float64(model_file, candidate, tmp_path):
    run = bisectr.trace(MODELS / model_file, "reference", candidate, out=tmp_path / "run")
    for role, side in run.sides.runners.items():
        first_parameter = next(name for name in run.traces[role].leaves if name.startswith("param:"))
        values = {first_parameter: 2 * run.traces[role].value(run.traces[role].leaves[first_parameter])}
        assert side.recording.replayable(side.side.adapter)
        replayed, replayed_narrow = side.float64_replay(values)
        own, own_narrow = side.float64_forward(values)
        assert replayed.keys() == own.keys() and replayed_narrow == own_narrow
        for key, expected in own.items():
            assert replayed[key].dtype == expected.dtype == np.float64
            scale = max(float(np.abs(expected).max()), 1e-30)
            assert float(np.abs(replayed[key] - expected).max()) <= 1e-12 * scale, (role, key)
