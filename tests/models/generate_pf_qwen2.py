"""Greedy generation: a tiny Hugging Face Qwen2 (torch) against PaddleFormers' Qwen2 (paddle), one checkpoint.

The sides of `pf_qwen2.py` (the same config, random checkpoint and q/k/v fusing converter; PaddleFormers'
`Qwen2ForCausalLMDeprecated` with `fuse_rms_norm=False`), called as causal LMs with their own caches: Hugging
Face's `DynamicCache` ([batch, kv heads, seq, head dim]) and PaddleFormers' tuples of (k, v) per layer
([batch, seq, kv heads, head dim]). The prompt is a left-padded batch of 2: input_ids (2, 16) from
`default_rng(0)`, row 1's first 5 positions padding (attention_mask 0).

Run it with each side in its own environment (paddlecodec breaks transformers' torch models beside PaddleFormers):

    bisectr generate tests/models/generate_pf_qwen2.py --tokens 32 --reference-python HF_VENV/bin/python

bisectr should conclude: `noise` over the 33 steps (the prefill and 32 decode steps): the float64 runs agree
at every step, logits and caches; `candidate_k_bias_missing()` is `divergent` at step 0 (the prefill), in
layer 2's `self_attn.qkv_proj`.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pf_qwen2  # noqa: E402

PADDING = 5  # row 1's left padding


def _prompt() -> tuple[np.ndarray, np.ndarray]:
    ids = pf_qwen2._input_ids()
    mask = np.ones_like(ids)
    mask[1, :PADDING] = 0
    ids = np.where(mask == 1, ids, 0)
    return ids, mask


def reference():
    import torch

    model, _ = pf_qwen2.reference()
    ids, mask = _prompt()
    return model, {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}


def candidate(k_bias_missing: bool = False):
    import paddle

    model, _ = pf_qwen2.candidate(k_bias_missing=k_bias_missing)
    ids, mask = _prompt()
    return model, {"input_ids": paddle.to_tensor(ids), "attention_mask": paddle.to_tensor(mask)}


def candidate_k_bias_missing():
    """The port with layer 2's k bias left zero in its fused qkv bias (`pf_qwen2.py`'s `@k_bias`)."""
    return candidate(k_bias_missing=True)
