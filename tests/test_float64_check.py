"""The float64 check runs the model's own code in float64 without a float64 copy of the model: an op
reading a parameter reads a float64 copy made for it and freed after it."""
import weakref

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
