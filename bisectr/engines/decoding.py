"""A side decoded step by step where its model lives (`bisectr generate`, through the side's `DecodeStep`
and `OpenStep` requests): the model (or a float64 copy) called as a generation loop calls it, its own cache
carried from step to step, every step fed the token it is given (teacher forcing).

Step 0 is the prefill (the prompt); step n feeds one token per row and the attention mask grown by one
column. The model is called with the keywords its forward names: `input_ids`, `attention_mask`,
`position_ids` (from the mask, as Hugging Face's `generate` makes them for left-padded rows), `use_cache`,
and its cache under `cache` (newer Hugging Face, a port's own) or `past_key_values` (older Hugging Face,
PaddleFormers); it returns the logits and the cache (an object with `.logits` and `.cache` or
`.past_key_values`, a mapping, or a tuple `(logits, cache)`). A cache is whatever holds its tensors: an HF
`DynamicCache`, tuples of (k, v), a port's lists; its entries are its floating tensors in the order they are
found, named by where they sit.

`StepSide` is the side at one step as a forward pass of its own, for the search inside that step: its
inputs are the step's tokens and the cache the earlier steps wrote (leaves, named `cache.<where>`), its
outputs the step's last-position logits and the cache it leaves.
"""

from __future__ import annotations

import copy
import inspect
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..capture.modelfile import BuiltSide, run_user_code
from ..capture.trace import is_floating
from ..adapters import Adapter
from ..errors import BisectrError, ModelFileError

CACHE_KEYWORDS = ("cache", "past_key_values", "past", "kv_cache", "caches")
STEP_KEYWORDS = ("attention_mask", "position_ids", "use_cache")
_MAX_CACHE_DEPTH = 6


@dataclass
class StepOutputs:
    """What one decoding step computed, as float64 arrays: the last position's logits (batch, vocab) and
    each cache entry after the step, by where it sits in the cache; at the prefill, the prompt's ids and the
    cache entries' dtypes."""

    logits: np.ndarray
    cache: dict[str, np.ndarray]
    prompt: np.ndarray | None = None
    cache_dtypes: dict[str, str] | None = None  # at the prefill: each cache entry's dtype as the model keeps it


@dataclass(frozen=True)
class CallConvention:
    """How a causal LM is called for one step: the keyword its cache goes under and the step keywords
    its forward names."""

    cache_keyword: str
    keywords: frozenset[str]

    @classmethod
    def of(cls, side: BuiltSide) -> CallConvention:
        forward = getattr(side.model, "forward", side.model)
        try:
            parameters = inspect.signature(forward).parameters
        except (TypeError, ValueError):
            parameters = {}
        cache_keyword = next((name for name in CACHE_KEYWORDS if name in parameters), None)
        if cache_keyword is None or "input_ids" not in parameters:
            raise ModelFileError(
                f"{side.model_file}: the {side.role} model returned by {side.function}() is not a causal LM with a "
                f"cache: bisectr generate calls forward(input_ids=..., past_key_values=... or cache=...) and reads "
                f"the logits and the cache it returns, but its forward takes ({', '.join(parameters) or '?'})"
            )
        return cls(cache_keyword, frozenset(name for name in STEP_KEYWORDS if name in parameters))

    def call(self, model: Any, inputs: dict[str, Any], cache: Any) -> Any:
        return model(**inputs, **{self.cache_keyword: cache})


@dataclass
class Prompt:
    """A side's prompt: its ids (batch, length) and attention mask (None: every position counts), as
    given and as numpy arrays."""

    ids: Any
    mask: Any | None
    ids_values: np.ndarray
    mask_values: np.ndarray | None

    @classmethod
    def of(cls, side: BuiltSide) -> Prompt:
        inputs = side.inputs
        if isinstance(inputs, dict):
            ids, mask = inputs.get("input_ids"), inputs.get("attention_mask")
            extra = sorted(set(inputs) - {"input_ids", "attention_mask"})
        else:
            ids, mask = (list(inputs) + [None, None])[:2]
            extra = [str(i) for i in range(2, len(inputs))]
        adapter = side.adapter
        where = f"{side.model_file}: the {side.role} inputs returned by {side.function}()"
        if not adapter.is_tensor(ids) or len(adapter.to_numpy(ids).shape) != 2:
            raise ModelFileError(f"{where} hold no prompt: bisectr generate needs input_ids of shape (batch, length)")
        if extra:
            raise ModelFileError(f"{where} hold {', '.join(extra)} beside input_ids and attention_mask")
        ids_values = adapter.to_numpy(ids).astype(np.int64)
        mask_values = None if mask is None else adapter.to_numpy(mask).astype(np.int64)
        if mask_values is not None and mask_values.shape != ids_values.shape:
            raise ModelFileError(
                f"{where}: attention_mask {mask_values.shape} does not match input_ids {ids_values.shape}"
            )
        return cls(ids, mask, ids_values, mask_values)


class Decoder:
    """One side decoding greedily, teacher-forced, and its cache. With `float64` a float64 copy of the model
    runs with every cast below float64 kept at float64 (`Widened`, as the float64 check calls each op): a
    model that computes its softmax in float32 would turn a fully masked row of padding (the float64 mask's
    most negative number, cast down to -inf) into NaN."""

    def __init__(self, side: BuiltSide, float64: bool):
        self.side, self.float64 = side, float64
        self.model = side.adapter.float64_model(side.model) if float64 else side.model
        self.convention = CallConvention.of(side)
        self.prompt = Prompt.of(side)
        self.cache: Any = None
        self.next = 0

    def step(self, number: int, token: np.ndarray | None, steps: int) -> StepOutputs:
        """Step `number` (0: the prefill) feeding `token` (one per row; None at the prefill), of `steps`."""
        if number != self.next:
            raise BisectrError(f"decoding step {number} asked after step {self.next - 1}")
        if number == 0:
            self._check_positions(steps)
        inputs = self.inputs(token)
        adapter = self.side.adapter
        in_float64 = adapter.intercept(self.model, Widened(adapter)) if self.float64 else nullcontext()
        with adapter.no_grad(), in_float64, adapter.float64_defaults() if self.float64 else nullcontext():
            logits, self.cache = run_step(self.side, self.convention, self.model, inputs, self.cache, number)
        self.next += 1
        entries = cache_entries(self.cache, adapter)
        return StepOutputs(
            adapter.to_numpy(last_position(logits)).astype(np.float64),
            {where: adapter.to_numpy(t).astype(np.float64) for where, t in entries},
            self.prompt.ids_values if number == 0 else None,
            {where: adapter.dtype_name(t) for where, t in entries} if number == 0 else None,
        )

    def inputs(self, token: np.ndarray | None) -> dict[str, Any]:
        """The keyword inputs of the next step, the cache aside: the prompt at the prefill, else `token`."""
        adapter, prompt = self.side.adapter, self.prompt
        batch, prompt_length = prompt.ids_values.shape
        if token is None:
            ids, new = prompt.ids, prompt_length
        else:
            ids, new = adapter.like(prompt.ids, np.asarray(token, dtype=np.int64).reshape(batch, 1)), 1
        mask = None
        if prompt.mask_values is not None:
            mask = np.concatenate([prompt.mask_values, np.ones((batch, self.next), np.int64)], axis=1)
        inputs: dict[str, Any] = {"input_ids": ids}
        keywords = self.convention.keywords
        if "attention_mask" in keywords and mask is not None:
            inputs["attention_mask"] = prompt.mask if token is None else adapter.like(prompt.mask, mask)
        if "position_ids" in keywords:
            inputs["position_ids"] = adapter.like(
                prompt.ids, positions(mask, batch, prompt_length + self.next)[:, -new:]
            )
        if "use_cache" in keywords:
            inputs["use_cache"] = True
        return inputs

    def _check_positions(self, steps: int) -> None:
        config = getattr(self.side.model, "config", None)
        limit = getattr(config, "max_position_embeddings", None)
        needed = self.prompt.ids_values.shape[1] + steps
        if isinstance(limit, int) and needed > limit:
            raise ModelFileError(
                f"{self.side.model_file}: the {self.side.role} model holds {limit} positions, but a prompt of "
                f"{self.prompt.ids_values.shape[1]} tokens and {steps} generated need {needed}: give a shorter "
                "prompt or fewer --tokens"
            )

    def step_side(self, token: np.ndarray | None) -> StepSide:
        """The side at its next step as a forward pass of its own, from the cache the steps before wrote."""
        side = self.side
        inputs = self.inputs(token)
        entries = cache_entries(self.cache, side.adapter) if self.cache is not None else []
        inputs.update((f"cache.{where}", t) for where, t in entries)
        return StepSide(
            side.role,
            side.function,
            side.model_file,
            side.model,
            inputs,
            side.adapter,
            convention=self.convention,
            cache=self.cache,
            cache_keys=tuple(f"cache.{where}" for where, _ in entries),
            number=self.next,
        )


class Widened:
    """Calls each op with its casts below float64 kept at float64 (`Adapter.float64_call`)."""

    def __init__(self, adapter: Adapter):
        self.adapter = adapter

    def call(self, name: str, fn: Any, args: tuple, kwargs: dict) -> Any:
        fn, args, kwargs = self.adapter.float64_call(name, fn, args, kwargs)
        return fn(*args, **kwargs)

    def enter_module(self, path: str) -> None:
        pass

    def exit_module(self) -> None:
        pass


@dataclass
class StepSide(BuiltSide):
    """One decoding step of a side as a forward pass (see the module docstring)."""

    convention: CallConvention | None = None
    cache: Any = None  # the cache as the earlier steps left it: its tensors are the inputs `cache_keys`
    cache_keys: tuple[str, ...] = ()
    number: int = 0

    def forward(self) -> Any:
        inputs = dict(self.inputs)
        cache = with_tensors(self.cache, [inputs.pop(key) for key in self.cache_keys], self.adapter)
        logits, cache = run_step(self, self.convention, self.model, inputs, cache, self.number)
        return {"logits": last_position(logits), "cache": dict(cache_entries(cache, self.adapter))}


def positions(mask: np.ndarray | None, batch: int, length: int) -> np.ndarray:
    """Each position's index (batch, length): counted over the attention mask (a left-padded row starts at
    its first real token; padding gets 1, as `generate` gives it), else 0, 1, 2, ..."""
    if mask is None:
        return np.broadcast_to(np.arange(length, dtype=np.int64), (batch, length))
    return np.where(mask == 0, 1, np.cumsum(mask, axis=1) - 1)


def run_step(
    side: BuiltSide, convention: CallConvention, model: Any, inputs: dict[str, Any], cache: Any, number: int
) -> tuple[Any, Any]:
    """The logits and the cache of `model` (the side's, or its float64 copy) run on one step's `inputs` from
    `cache`; what the model raises is the user's, said with the step."""
    output = run_user_code(
        lambda: convention.call(model, inputs, cache),
        f"{side.model_file}: the {side.role} model returned by {side.function}() raised at decoding step {number}:",
        side.adapter.internal_paths(),
    )
    return split_output(side, output)


def split_output(side: BuiltSide, output: Any) -> tuple[Any, Any]:
    """The logits and the cache a causal LM's step returned."""
    if isinstance(output, dict) or hasattr(output, "logits"):  # a mapping, an HF or PaddleFormers model output
        read = output.get if isinstance(output, dict) else lambda key: getattr(output, key, None)
        logits, cache = read("logits"), next((read(key) for key in ("cache", "past_key_values") if read(key)), None)
    elif isinstance(output, (tuple, list)) and len(output) >= 2:
        logits, cache = output[0], output[1]
    else:
        logits, cache = output, None
    where = f"{side.model_file}: the {side.role} model returned by {side.function}()"
    if not side.adapter.is_tensor(logits):
        raise ModelFileError(f"{where} returned no logits (got {type(output).__name__})")
    if cache is None or not cache_entries(cache, side.adapter):
        raise ModelFileError(
            f"{where} returned no cache: bisectr generate needs a model that returns the cache it wrote "
            "(.past_key_values, or (logits, cache)), to carry from one step to the next"
        )
    return logits, cache


def last_position(logits: Any) -> Any:
    """The last position's logits (batch, vocab) of logits (batch, length, vocab); logits (batch, vocab) as they are."""
    return logits[:, -1] if len(logits.shape) == 3 else logits


def cache_entries(cache: Any, adapter: Adapter) -> list[tuple[str, Any]]:
    """The floating tensors a cache holds (its keys and values; integer bookkeeping such as a sliding window's
    positions is structure), depth first, each once, named by where it sits ("layers.0.keys", "0.1")."""
    return [(where, t) for where, t in _tensors_in(cache, adapter) if is_floating(adapter.dtype_name(t))]


def with_tensors(cache: Any, tensors: list[Any], adapter: Adapter) -> Any:
    """A copy of `cache`'s containers holding `tensors` in place of its entries, in `cache_entries`' order, and
    its other tensors as they are (the cache left as it was, so that the step can run again from it; no tensor
    is copied, so no op runs)."""
    if cache is None:
        return cache
    kept = {id(t): t for _, t in _tensors_in(cache, adapter)}
    kept.update((id(old), new) for (_, old), new in zip(cache_entries(cache, adapter), tensors))
    return copy.deepcopy(cache, kept)


def _tensors_in(cache: Any, adapter: Adapter) -> list[tuple[str, Any]]:
    """Every tensor a cache holds, depth first, each once, named by where it sits."""
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()

    def walk(obj: Any, where: str, depth: int) -> None:
        if id(obj) in seen or depth > _MAX_CACHE_DEPTH:
            return
        seen.add(id(obj))
        if adapter.is_tensor(obj):
            found.append((where, obj))
            return
        if isinstance(obj, (tuple, list)):
            children = [(str(i), v) for i, v in enumerate(obj)]
        elif isinstance(obj, dict):
            children = [(str(k), v) for k, v in obj.items()]
        elif hasattr(obj, "__dict__") and not isinstance(obj, type) and not callable(obj):
            children = list(vars(obj).items())
        else:
            return
        for key, value in children:
            walk(value, f"{where}.{key}" if where else key, depth + 1)

    walk(cache, "", 0)
    return found
