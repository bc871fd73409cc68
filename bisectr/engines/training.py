"""A side trained step by step where its model lives (`bisectr train`, through the side's `TrainStep`
requests): a copy of the model (float64 when asked), the model file's optimizer, batches and loss.

On a rank of a side on several processes (DDP, FSDP2, tensor parallel), the model is not copied: the side's
function builds it again, wrapped and sharded as the model file does it (under float64 defaults for a
float64 run), and the recorded model's values are copied into it. Each rank then also says what it held of
each parameter it holds whole (`StepFacts.replicas`), so that a replicated parameter whose gradient the ranks
never reduced can be told from one they did."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..adapters import CannotUpcast, Training, facet
from ..errors import ModelFileError
from ..leafref import leaf_kind, leaf_name
from ..capture.modelfile import BuiltSide, build_side, loss_of, run_user_code
from ..capture.recording import output_pairs
from ..capture.structure import map_tensors
from ..capture.trace import is_floating
from .gradient import fingerprint


@dataclass
class StepFacts:
    """What one training step computed: the loss (summed over its micro-batches), the learning rate it
    stepped with, and the names of the parameters whose gradient, update and moments can then be read
    (`Trainer.read`); the shapes of its batch's tensors; on a rank, for each parameter it holds whole, a
    fingerprint of its values before the step and of its gradient (`replicas`)."""

    loss: float
    learning_rate: float
    parameters: list[str]
    micro_batches: int = 1
    batch: list[tuple[int, ...]] = field(default_factory=list)
    replicas: dict[str, tuple[str, str]] = field(default_factory=dict)


class Trainer:
    """One side trained step by step: a copy of its model (float64 when asked), its optimizer and batches.
    `on_ranks`: this process is one rank of the side, whose model is built again rather than copied."""

    def __init__(
        self, side: BuiltSide, module: Any, seeds: dict[str, np.ndarray], float64: bool, on_ranks: bool = False
    ):
        self.side, self.float64, self.seeds, self.on_ranks = side, float64, seeds, on_ranks
        adapter = side.adapter
        self.training = facet(adapter, Training)
        try:
            if on_ranks:
                self.model = self._rebuilt(module)
            else:
                self.model = adapter.float64_model(side.model) if float64 else self.training.copy_model(side.model)
        except CannotUpcast as exc:
            raise ModelFileError(f"{side.model_file}: the {side.role} cannot be trained here: {exc}") from None
        factory = _function(module, side, "optimizer", required=True)
        built = run_user_code(lambda: factory(self.model), f"{side.model_file}: {side.role}_optimizer() raised")
        self.optimizer, self.scheduler = built if isinstance(built, tuple) else (built, None)
        self.batch = _function(module, side, "batch", required=False)
        self.micro_batches = _function(module, side, "micro_batches", required=False)
        self.parameters = {name: t for name, t in adapter.named_leaves(self.model) if leaf_kind(name) == "param"}
        self._before: dict[str, Any] = {}  # each parameter's values before the last step, as the model holds them

    def _rebuilt(self, module: Any) -> Any:
        """The side's model built again by its function (under float64 defaults for a float64 run), holding
        the recorded model's values. Raises `CannotUpcast` where a float64 build keeps a parameter narrower."""
        side, adapter = self.side, self.side.adapter
        with adapter.float64_defaults() if self.float64 else nullcontext():
            model = build_side(module, Path(side.model_file), side.role, side.function).model
        if self.float64:
            adapter.full_precision(model)
        recorded = dict(adapter.named_leaves(side.model))
        for name, leaf in adapter.named_leaves(model):
            if name not in recorded:
                raise ModelFileError(
                    f"{side.model_file}: {side.function}() built again holds {leaf_name(name)}, which its first "
                    "build does not: a side trained on several processes is built once per trainer"
                )
            self.training.copy_values(leaf, recorded[name])
            dtype = adapter.dtype_name(leaf)
            # A buffer may keep the dtype its code gives it (a rotary table's float32); a parameter is trained.
            if self.float64 and leaf_kind(name) == "param" and is_floating(dtype) and dtype != "float64":
                raise CannotUpcast(
                    f"built under float64 defaults, its {leaf_name(name)} is still {dtype} (a dtype given explicitly)"
                )
        return model

    def settings(self) -> dict[str, Any]:
        return self.training.optimizer_settings(self.optimizer)

    def weight_decays(self) -> dict[str, float]:
        """Each parameter's weight decay coefficient, by leaf name."""
        return self.training.weight_decays(self.optimizer, self.parameters)

    def step(self, number: int) -> StepFacts:
        side, adapter = self.side, self.side.adapter
        batches = self._batches(number)
        learning_rate = self.training.learning_rate(self.optimizer)
        self.training.clear_gradients(self.optimizer)
        self._before = {name: self.training.snapshot(t) for name, t in self.parameters.items()}
        total = 0.0
        for inputs in batches:  # gradients accumulate over the micro-batches
            with adapter.enable_grad():
                outputs = replace(side, model=self.model, inputs=inputs).forward()
                loss = self._loss(outputs)
            if self.on_ranks and self.training.waits_for_every_gradient(self.model):
                self._refuse_unused(loss, number)
            self.training.backward(loss)
            total += float(adapter.to_numpy(loss).reshape(()))
        replicas = self._replicas() if self.on_ranks else {}
        self.training.optimizer_step(self.optimizer, self.scheduler)
        shapes = [shape for inputs in batches for shape in _shapes(adapter, inputs)]
        return StepFacts(total, learning_rate, list(self.parameters), len(batches), shapes, replicas)

    def _refuse_unused(self, loss: Any, number: int) -> None:
        """Raise, on every rank, where some rank's forward left out parameters another used: the backward's
        reduction would wait for their gradients on that rank forever."""
        every = self.training.gathered(self.training.unreached(loss, self.parameters))
        unused = {rank: set(names) for rank, names in enumerate(every)}
        named = sorted(set().union(*unused.values()) - set.intersection(*unused.values()))
        if named:
            ranks = sorted(rank for rank, names in unused.items() if names & set(named))
            raise ModelFileError(
                f"{self.side.model_file}: at step {number}, the {self.side.role}'s {', '.join(map(leaf_name, named))} "
                f"{'is' if len(named) == 1 else 'are'} unused on rank {', '.join(map(str, ranks))} (its forward never "
                "reaches them) and used on the others: its data-parallel wrapping waits in the backward for their "
                "gradients on every rank and would hang (DistributedDataParallel(..., find_unused_parameters=True) "
                "reduces without them)"
            )

    def _batches(self, number: int) -> list[Any]:
        """The step's micro-batches (`<role>_micro_batches(step)`), else its one batch (`<role>_batch(step)`,
        else the side's inputs), floating tensors made float64 for a float64 run."""
        side, adapter = self.side, self.side.adapter
        if self.micro_batches is not None:
            batches = run_user_code(
                lambda: self.micro_batches(number), f"{side.model_file}: {self.micro_batches.__name__}({number}) raised"
            )
            if not isinstance(batches, (list, tuple)) or not batches:
                raise ModelFileError(
                    f"{side.model_file}: {self.micro_batches.__name__}({number}) returned {type(batches).__name__}, "
                    "not a non-empty list of batches"
                )
        elif self.batch is not None:
            batches = [
                run_user_code(lambda: self.batch(number), f"{side.model_file}: {self.batch.__name__}({number}) raised")
            ]
        else:
            batches = [side.inputs]
        if not self.float64:
            return list(batches)
        return [
            map_tensors(
                inputs,
                adapter.is_tensor,
                lambda t: adapter.float64_tensor(t) if is_floating(adapter.dtype_name(t)) else t,
            )
            for inputs in batches
        ]

    def _replicas(self) -> dict[str, tuple[str, str]]:
        """For each parameter this rank holds whole (not a DTensor's shard): fingerprints of its values before
        the step and of its gradient."""
        adapter = self.side.adapter
        return {
            name: (fingerprint(adapter.to_numpy(self._before[name])), fingerprint(self.training.gradient(t)))
            for name, t in self.parameters.items()
            if adapter.layout(t) is None
        }

    def read(self, measure: str, name: str) -> np.ndarray | None:
        """The last step's gradient, update or Adam moment ("gradient", "update", "moment1", "moment2")
        of one parameter, as float64 (None: it has none, or no such parameter)."""
        adapter, parameter = self.side.adapter, self.parameters.get(name)
        if parameter is None:
            return None
        if measure == "gradient":
            values = self.training.gradient(parameter)
        elif measure == "update":
            values = adapter.to_numpy(parameter).astype(np.float64) - adapter.to_numpy(self._before[name])
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


def _shapes(adapter: Any, inputs: Any) -> list[tuple[int, ...]]:
    """The shape of each tensor in a batch, in order."""
    shapes: list[tuple[int, ...]] = []
    map_tensors(inputs, adapter.is_tensor, lambda t: shapes.append(tuple(t.shape)) or t)
    return shapes


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
