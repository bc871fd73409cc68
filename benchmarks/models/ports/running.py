"""Running a port: its source as a module, the model built and loaded from the reference's weights, the reference's
inputs in its framework, its first output as numpy, and the same in float64.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np


def from_source(source: str, filename: str) -> types.ModuleType:
    """The port's module, compiled from `source` as if read from `filename` (not imported: nothing is cached)."""
    module = types.ModuleType(Path(filename).stem)
    module.__file__ = filename
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def imported(path: Path) -> types.ModuleType:
    """The port's module imported from its file, once per file (its name is unique to the file)."""
    name = f"port_{path.parent.name}_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def built(port: types.ModuleType, weights: dict[str, np.ndarray]):
    """The port's model, built and loaded with `weights` (its converter's output)."""
    return port.load(port.build(), weights)


def framework_inputs(inputs: dict, framework: str) -> dict:
    """The reference's tensor inputs as the port's framework holds them (non-tensor options dropped)."""
    import torch

    tensors = {name: value for name, value in inputs.items() if torch.is_tensor(value)}
    if framework == "torch":
        return tensors
    import paddle

    return {name: paddle.to_tensor(value.numpy()) for name, value in tensors.items()}


def outputs(model, inputs: dict, framework: str) -> dict[str, np.ndarray]:
    """The port's outputs by name (the logits, or the last hidden state first), float64 numpy."""
    with _no_grad(framework):
        out = model(**inputs)
    if framework == "torch":
        return {name: value.double().cpu().numpy() for name, value in out.items()}
    return {name: value.astype("float64").numpy() for name, value in out.items()}


def first_output(model, inputs: dict, framework: str) -> np.ndarray:
    """The port's first output (what the benchmark compares), float64 numpy."""
    return next(iter(outputs(model, inputs, framework).values()))


def reference_outputs(model, inputs: dict) -> dict[str, np.ndarray]:
    """The reference's tensor outputs by name (its first, the logits or the last hidden state), float64 numpy."""
    import torch

    with torch.no_grad():
        out = model(**inputs)
    return {name: value.double().numpy() for name, value in out.items() if torch.is_tensor(value)}


def reference_output(model, inputs: dict) -> np.ndarray:
    """The reference's first output, float64 numpy."""
    return next(iter(reference_outputs(model, inputs).values()))


def in_float64(model, inputs: dict, framework: str):
    """A float64 copy of the model and its inputs (run it under `float64_defaults`)."""
    if framework == "torch":
        import torch

        return copy.deepcopy(model).double(), {k: v.double() if torch.is_floating_point(v) else v
                                                for k, v in inputs.items()}
    import paddle

    upcast = copy.deepcopy(model)
    upcast.to(dtype="float64")
    return upcast, {k: v.astype("float64") if paddle.is_floating_point(v) else v for k, v in inputs.items()}


@contextlib.contextmanager
def float64_defaults(framework: str):
    """Tensors made without a dtype are float64, as in bisectr's float64 runs."""
    lib = __import__(framework)
    default = lib.get_default_dtype()
    lib.set_default_dtype(lib.float64 if framework == "torch" else "float64")
    try:
        yield
    finally:
        lib.set_default_dtype(default)


def _no_grad(framework: str):
    return __import__(framework).no_grad()


def relative(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over max |b| (infinite where the shapes differ or a is not finite)."""
    if a.shape != b.shape or not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
