"""A paddle recording that ends in a fault leaves paddle as it found it: every function and method
bisectr replaces while it records is the original again, whatever ended the recording."""

import sys

import pytest

import bisectr
from bisectr.errors import RunWriteError, UserModelError
from bisectr.capture.store import TensorWriter

MODEL = """
import os

import paddle

FAULT = os.environ.get("BISECTR_TEST_FAULT", "")

class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(8, 8)

    def forward(self, x):
        y = paddle.nn.functional.gelu(self.fc(x))
        if FAULT == "raise":
            raise ValueError("the user's bug")
        if FAULT == "interrupt":
            raise KeyboardInterrupt
        return y.sum(axis=-1)

def reference():
    paddle.seed(0)
    return Net(), (paddle.ones([2, 8]),)

candidate = reference
"""


def paddle_callables() -> dict[tuple[str, str], int]:
    """(module or class, attribute) -> id of every callable in paddle's loaded modules and in the
    classes bisectr patches (Tensor methods, Layer.__call__)."""
    import paddle

    owners = {
        name: vars(module)
        for name, module in list(sys.modules.items())
        if module is not None and (name == "paddle" or name.startswith("paddle."))
    }
    owners.update({"paddle.Tensor": vars(paddle.Tensor), "paddle.nn.Layer": vars(paddle.nn.Layer)})
    return {
        (owner, attr): id(value)
        for owner, namespace in owners.items()
        for attr, value in list(namespace.items())
        if callable(value)
    }


def write_fails(self, tid, values):
    raise RunWriteError("injected: no space left on device")


@pytest.mark.parametrize(
    "fault, expected", [("raise", UserModelError), ("interrupt", KeyboardInterrupt), ("disk full", RunWriteError)]
)
def test_paddle_is_restored_after_a_fault_while_recording(fault, expected, tmp_path, monkeypatch):
    model = tmp_path / "paddle_fault.py"
    model.write_text(MODEL)
    bisectr.trace(model, out=tmp_path / "warm")  # paddle's lazily loaded modules are loaded now
    before = paddle_callables()
    monkeypatch.setenv("BISECTR_TEST_FAULT", fault)
    if fault == "disk full":
        monkeypatch.setattr(TensorWriter, "write", write_fails)
    with pytest.raises(expected):
        bisectr.trace(model, out=tmp_path / "run")
    monkeypatch.undo()
    after = paddle_callables()
    changed = [key for key, value in before.items() if after.get(key) != value]
    assert len(before) > 5000 and not changed, changed[:10]
    assert not (tmp_path / "run").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["paddle_fault.py", "warm"]
