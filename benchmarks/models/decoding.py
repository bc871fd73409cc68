"""A port's own greedy decoding loop around a causal LM, with a KV cache: the benchmark's `decode` form.

`GreedyDecoding(lm)` prefills the prompt into a `DynamicCache`, then runs `STEPS` greedy decode steps, each
feeding the last step's argmax token with its position id and a 2-D attention mask it extends by one; its
output is the last position's logits of every step, (batch, STEPS + 1, vocab). The decode steps' position ids
and mask come from two small modules (`DecodePositions`, `DecodeMask`), so that a mistake in them is
named at a module. The `decode` operators of `mutations.py` plant the mistakes porters make in such a loop
by setting the attributes below, each from one decode step on:

- `DecodePositions.stuck_from`: the position id stops advancing (the rotary offset is not advanced);
- `DecodeMask.self_blocked_from`: the mask's new entry is 0 (each new token is kept from itself);
- `GreedyDecoding.swapped_write`: `(layer, step)`: from that step on, the layer's cache is handed the new values as keys and
  the new keys as values (a port's `cache.update(v, k)`).
"""
from __future__ import annotations

STEPS = 4


def decodes(model) -> bool:
    """Can `model` run in the loop: a causal LM whose forward takes a `DynamicCache` (Mamba keeps its own)."""
    return model.__class__.__name__.endswith(("ForCausalLM", "LMHeadModel")) and "Mamba" not in model.__class__.__name__


def greedy_decoding(lm):
    import torch
    from transformers import DynamicCache

    class DecodePositions(torch.nn.Module):
        stuck_from: int | None = None

        def forward(self, prompt_length: int, step: int):
            if self.stuck_from is not None and step > self.stuck_from:
                step = self.stuck_from  # @positions_stuck
            return torch.tensor([[prompt_length + step - 1]])

    class DecodeMask(torch.nn.Module):
        self_blocked_from: int | None = None

        def forward(self, mask, step: int):
            if self.self_blocked_from is not None and step >= self.self_blocked_from:
                return torch.cat([mask, torch.zeros_like(mask[:, :1])], dim=1)  # @self_blocked
            return torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)

    class GreedyDecoding(torch.nn.Module):
        swapped_write: tuple[int, int] | None = None

        def __init__(self, lm):
            super().__init__()
            self.lm = lm
            self.positions = DecodePositions()
            self.mask = DecodeMask()

        def forward(self, input_ids, **_):
            cache = DynamicCache(config=self.lm.config)
            batch, length = input_ids.shape
            mask = torch.ones(batch, length, dtype=torch.long)
            out = self.lm(input_ids, attention_mask=mask, position_ids=torch.arange(length)[None],
                          past_key_values=cache, use_cache=True)
            logits = [out.logits[:, -1]]
            for step in range(1, STEPS + 1):
                if self.swapped_write is not None and step == self.swapped_write[1]:
                    cache.update = _swapped_update(cache, self.swapped_write[0])
                token = logits[-1].argmax(-1, keepdim=True)
                mask = self.mask(mask, step)
                out = self.lm(token, attention_mask=mask, position_ids=self.positions(length, step),
                              past_key_values=cache, use_cache=True)
                logits.append(out.logits[:, -1])
            return torch.stack(logits, 1)

    return GreedyDecoding(lm)


def _swapped_update(cache, layer: int):
    """`cache.update` that, for `layer`, writes the new values as keys and the new keys as values."""
    update = cache.update

    def swapped(key_states, value_states, layer_idx, *args, **kwargs):
        if layer_idx == layer:
            return update(value_states, key_states, layer_idx, *args, **kwargs)  # @swapped_write
        return update(key_states, value_states, layer_idx, *args, **kwargs)

    return swapped
