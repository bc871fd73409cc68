"""A side trained step by step where its model lives (`bisectr train`, through the side's `TrainStep`
requests): a copy of the model (float64 when asked), the model file's optimizer, batches and loss."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from ..adapters import CannotUpcast, Training, facet
from ..errors import ModelFileError
from ..leafref import leaf_kind
from ..capture.modelfile import BuiltSide, loss_of, run_user_code
from ..capture.recording import output_pairs
from ..capture.structure import map_tensors
from ..capture.trace import is_floating


@dataclass
class StepFacts:
    """What one training step computed: the loss, the learning rate it stepped with, and the names of
    the parameters whose gradient, update and moments can then be read (`Trainer.read`)."""

    loss: float
    learning_rate: float
    parameters: list[str]


class Trainer:
    """One side trained step by step: a copy of its model (float64 when asked), its optimizer and batches."""

    def __init__(self, side: BuiltSide, module: Any, seeds: dict[str, np.ndarray], float64: bool):
        self.side, self.float64, self.seeds = side, float64, seeds
        adapter = side.adapter
        self.training = facet(adapter, Training)
        try:
            self.model = adapter.float64_model(side.model) if float64 else self.training.copy_model(side.model)
        except CannotUpcast as exc:
            raise ModelFileError(f"{side.model_file}: the {side.role} cannot be trained here: {exc}") from None
        factory = _function(module, side, "optimizer", required=True)
        built = run_user_code(lambda: factory(self.model), f"{side.model_file}: {side.role}_optimizer() raised")
        self.optimizer, self.scheduler = built if isinstance(built, tuple) else (built, None)
        self.batch = _function(module, side, "batch", required=False)
        self.parameters = {name: t for name, t in adapter.named_leaves(self.model) if leaf_kind(name) == "param"}
        self._before: dict[str, np.ndarray] = {}  # each parameter's values before the last step

    def settings(self) -> dict[str, Any]:
        return self.training.optimizer_settings(self.optimizer)

    def weight_decays(self) -> dict[str, float]:
        """Each parameter's weight decay coefficient, by leaf name."""
        return self.training.weight_decays(self.optimizer, self.parameters)

    def step(self, number: int) -> StepFacts:
        side, adapter = self.side, self.side.adapter
        inputs = (
            side.inputs
            if self.batch is None
            else run_user_code(lambda: self.batch(number), f"{side.model_file}: {side.role}_batch({number}) raised")
        )
        if self.float64:
            inputs = map_tensors(
                inputs,
                adapter.is_tensor,
                lambda t: adapter.float64_tensor(t) if is_floating(adapter.dtype_name(t)) else t,
            )
        learning_rate = self.training.learning_rate(self.optimizer)
        self.training.clear_gradients(self.optimizer)
        with adapter.enable_grad():
            outputs = replace(side, model=self.model, inputs=inputs).forward()
            loss = self._loss(outputs)
        self.training.backward(loss)
        self._before = {name: np.array(adapter.to_numpy(t)) for name, t in self.parameters.items()}
        self.training.optimizer_step(self.optimizer, self.scheduler)
        return StepFacts(float(adapter.to_numpy(loss).reshape(())), learning_rate, list(self.parameters))

    def read(self, measure: str, name: str) -> np.ndarray | None:
        """The last step's gradient, update or Adam moment ("gradient", "update", "moment1", "moment2")
        of one parameter, as float64 (None: it has none, or no such parameter)."""
        adapter, parameter = self.side.adapter, self.parameters.get(name)
        if parameter is None:
            return None
        if measure == "gradient":
            values = self.training.gradient(parameter)
        elif measure == "update":
            values = adapter.to_numpy(parameter).astype(np.float64) - self._before[name]
        else:
            values = self.training.optimizer_moments(self.optimizer, parameter).get(measure)
        return None if values is None else values.astype(np.float64, copy=False)

    def _loss(self, outputs: Any) -> Any:
        side, adapter = self.side, self.side.adapter
        if side.loss is not None:
            return loss_of(side, outputs)
        total = None
        for key, tensor in output_pairs(adapter, outputs):
            if key in self.seeds:
                term = (tensor * adapter.like(tensor, self.seeds[key])).sum()
                total = term if total is None else total + term
        if total is None:
            raise ModelFileError(f"{side.model_file}: the {side.role} model has no floating output to train on")
        return total


def _function(module: Any, side: BuiltSide, what: str, required: bool) -> Callable | None:
    """The model file's `<side function>_<what>` (`candidate_eps_optimizer` for `--candidate candidate_eps`),
    else its `<role>_<what>` (`candidate_optimizer`)."""
    for name in dict.fromkeys((f"{side.function}_{what}", f"{side.role}_{what}")):
        found = getattr(module, name, None)
        if found is not None:
            if not callable(found):
                raise ModelFileError(f"{side.model_file}: {name} is not a function")
            return found
    if required:
        raise ModelFileError(
            f"{side.model_file}: defines no function {side.role}_{what}(model) returning the {side.role}'s "
            "optimizer (or (optimizer, scheduler)): bisectr train needs one per side"
        )
    return None
