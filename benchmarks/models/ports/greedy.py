"""Greedy decoding step by step, as `bisectr generate` drives a causal LM: a Hugging Face reference with its own
`DynamicCache`, or a decoding port (`decoding.py`) with its own cache class.

Step 0 is the prefill of the prompt, then one step per token fed (teacher forcing: every run of a case is fed the
tokens of the reference's float32 run, so that their steps stay comparable). The model is called with the keywords
its forward names among `attention_mask` (the prompt's, grown by one column a step), `position_ids` (counted over
it) and `use_cache`, and its cache under the first of `CACHE_KEYWORDS` it names (None at the prefill); it returns the
logits and the cache, as an object with `.logits` and `.cache` (or `.past_key_values`) or a dict. `decoded` records,
per step, the last position's logits and the cache's floating tensors, as float64 numpy.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

CACHE_KEYWORDS = ("cache", "past_key_values", "kv_cache")
STEP_KEYWORDS = ("attention_mask", "position_ids", "use_cache")


@dataclass
class Decoded:
    """One run's steps: the last position's logits (batch, vocab) and the cache's floating tensors after each."""

    logits: list[np.ndarray]
    caches: list[list[np.ndarray]]

    def tokens(self) -> list[np.ndarray]:
        """The top-1 token of each step (what the next step is fed)."""
        return [logits.argmax(-1) for logits in self.logits]


def decoded(model, framework: str, prompt: dict[str, np.ndarray], steps: int,
            fed: list[np.ndarray] | None = None) -> Decoded:
    """`model` (torch or paddle: `framework`) decoding `prompt` (numpy `input_ids` and `attention_mask`), then
    `steps` tokens: those of `fed` in turn (one per row), or its own top-1 tokens; its own cache carried from step to
    step."""
    lib = __import__(framework)
    parameters = inspect.signature(model.forward).parameters
    cache_keyword = next(name for name in CACHE_KEYWORDS if name in parameters)
    keywords = [name for name in STEP_KEYWORDS if name in parameters]
    ids, mask = prompt["input_ids"], prompt["attention_mask"]
    cache, run = None, Decoded([], [])
    with lib.no_grad():
        for number in range(steps + 1):
            if number:
                token = run.tokens()[-1] if fed is None else fed[number - 1]
                ids, mask = token.reshape(-1, 1), np.concatenate([mask, np.ones_like(mask[:, :1])], 1)
            inputs = _step_inputs(framework, ids, mask, keywords)
            logits, cache = _logits_and_cache(model(**inputs, **{cache_keyword: cache}))
            run.logits.append(_numpy(logits[:, -1], framework))
            run.caches.append([_numpy(t, framework) for t in floating_tensors(cache, framework)])
    return run


def _step_inputs(framework: str, ids: np.ndarray, mask: np.ndarray, keywords: list[str]) -> dict:
    """One step's keyword inputs: its ids, and those of `keywords` the model names."""
    positions = (np.cumsum(mask, axis=1) - 1)[:, -ids.shape[1]:]
    values = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    inputs = {name: _tensor(values[name], framework) for name in ["input_ids", *keywords] if name in values}
    if "use_cache" in keywords:
        inputs["use_cache"] = True
    return inputs


def _tensor(values: np.ndarray, framework: str):
    if framework == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(values))
    import paddle

    return paddle.to_tensor(values)


def _logits_and_cache(output) -> tuple:
    if isinstance(output, dict):
        return output["logits"], output["cache"]
    cache = getattr(output, "cache", None)
    return output.logits, output.past_key_values if cache is None else cache


def _numpy(tensor, framework: str) -> np.ndarray:
    if framework == "torch":
        return tensor.detach().double().cpu().numpy()
    return tensor.astype("float64").numpy()


def floating_tensors(cache, framework: str) -> list:
    """The floating tensors a cache holds, depth first, each once (its keys and values; integer bookkeeping aside)."""
    lib = __import__(framework)
    found, seen = [], set()

    def walk(item) -> None:
        if id(item) in seen:
            return
        seen.add(id(item))
        if isinstance(item, lib.Tensor):
            if lib.is_floating_point(item):
                found.append(item)
        elif isinstance(item, (tuple, list)):
            for value in item:
                walk(value)
        elif isinstance(item, dict):
            for value in item.values():
                walk(value)
        elif hasattr(item, "__dict__") and not callable(item):
            for value in vars(item).values():
                walk(value)

    walk(cache)
    return found
