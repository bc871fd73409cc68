"""A tiny Hugging Face BERT against itself with gradient checkpointing on.

Reference: `transformers.BertModel` from a random seeded config (3 layers, hidden 64, 4 heads,
intermediate 128, vocab 128, all dropouts 0), `torch.manual_seed(0)`, in training mode (gradient
checkpointing acts only there; with no dropout the forward is deterministic), input_ids and an
attention mask with padding (2, 16). Candidate: a `copy.deepcopy` with
`activation_checkpointing_enable()` (gradient checkpointing): each layer's forward runs again inside the backward pass.

`candidate_reentrant()` uses torch's reentrant checkpoint (`use_reentrant=True`): the layers' first
forward runs without autograd, and their ops' outputs get no gradient of their own. transformers up
to 5.23 checkpoints with gradients off too; from 5.24 only with gradients on, so a forward
recorded without gradients takes another path than one run with them.

Measured here: outputs bit-equal; parameter gradients equal up to rounding (both variants).

bisectr should conclude: forward `match`, backward `noise` (or `match`) for `candidate()`, and for
`candidate_reentrant()` where transformers checkpoints with gradients off too (else exit 2, saying
why and what to pass instead).
"""
import copy
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402


CONFIG = dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
              max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _inputs():
    import torch

    ids = np.random.default_rng(0).integers(1, CONFIG["vocab_size"], size=(2, 16))
    mask = np.ones((2, 16), dtype=np.int64)
    mask[1, 12:] = 0
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}


def _bert():
    hide_broken_torchcodec()
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(BertConfig(**CONFIG)).train()


def reference():
    return _bert(), _inputs()


def candidate(use_reentrant: bool = False):
    model = copy.deepcopy(_bert())
    options = {"use_reentrant": use_reentrant}
    if hasattr(model, "activation_checkpointing_enable"):  # newer transformers; 5.3 has gradient_checkpointing_enable
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
    return model, _inputs()


def candidate_reentrant():
    return candidate(use_reentrant=True)
