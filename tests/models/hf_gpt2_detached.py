"""A tiny Hugging Face GPT-2 against itself with a registered attention function that cuts a gradient.

Reference: `transformers.GPT2Model` from a random seeded config (4 layers, n_embd 64, 4 heads,
vocab 128, n_positions 32, eager attention, all dropouts 0), non-zero biases and norm affines,
eval, input_ids (2, 16), `use_cache=False`.

Candidates are the same model (same seed, same weights) run through an attention function
registered with `transformers.AttentionInterface` as "probs_detached_in_layer_2" (with eager's
causal mask, registered under the same name): GPT-2's eager attention written out, except that in layer 2 the attention probabilities are `.detach()`ed (the
line marked `# @detached`) before they weigh the values.

- `candidate()`: the registered function without the detach (a correct custom attention).
- `candidate_detached()`: layer 2's probabilities detached. The forward is bit-equal; no gradient
  flows through layer 2's scores, so every parameter before them (layer 2's q/k, and through them
  every earlier layer) gets another gradient.

Measured here: forward outputs bit-equal; with `candidate_detached()` parameter gradients (seeded
from one random output gradient) differ by 0.6 relative (worst parameter).

bisectr should conclude: forward `match`; backward `noise` for `candidate()`, `divergent` for
`candidate_detached()`, culprit the `detach` in `h.2.attn`, confirmed.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import seeded_gpt2  # noqa: E402

CONFIG = dict(vocab_size=128, n_positions=32, n_embd=64, n_layer=4, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
              attn_pdrop=0.0, attn_implementation="eager")
DETACHED_LAYER = 2


def _inputs():
    import torch

    return {"input_ids": torch.from_numpy(np.random.default_rng(0).integers(0, CONFIG["vocab_size"], size=(2, 16))),
            "use_cache": False}


def _gpt2():
    return seeded_gpt2("GPT2Model", CONFIG)


def _attention(detach: bool):
    """GPT-2's eager attention, its probabilities detached in layer `DETACHED_LAYER` when `detach`."""
    import torch

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        scores = torch.matmul(query, key.transpose(-1, -2)) * (scaling or query.size(-1) ** -0.5)
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = torch.nn.functional.softmax(scores, dim=-1)
        if detach and module.layer_idx == DETACHED_LAYER:
            probs = probs.detach()  # @detached
        return torch.matmul(probs, value).transpose(1, 2), probs
    return attention


def _with_attention(detach: bool):
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = "probs_detached_in_layer_2" if detach else "eager_written_out"
    AttentionInterface.register(name, _attention(detach))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["eager"])  # the same additive causal mask
    model = _gpt2()
    model.set_attn_implementation(name)
    return model, _inputs()


def reference():
    return _gpt2(), _inputs()


def candidate():
    return _with_attention(detach=False)


def candidate_detached():
    return _with_attention(detach=True)
