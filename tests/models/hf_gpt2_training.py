"""`hf_gpt2_paddle.py`'s pair, a tiny Hugging Face GPT-2 LM (torch) and its PaddlePaddle port, trained
with AdamW as Hugging Face's `Trainer` sets it up: weight decay on every parameter but the biases and
the LayerNorm weights, which a second parameter group exempts.

Step N trains both sides on the same batch of input ids (2, 16), seeded by N, with bisectr's default
loss (the logits against a fixed random gradient). The reference: torch `AdamW(lr=1e-3,
weight_decay=0.01)` over the two groups; `candidate()`: the port with paddle's `AdamW` of the same
settings, exempting the same parameters through `apply_decay_param_fun` (PaddleNLP's convention).
Each other candidate differs in one thing only:

- `candidate_beta2`: `beta2=0.99` against the default 0.999.
- `candidate_decay_all`: no exemption: paddle's `AdamW(weight_decay=0.01)` decays all 52 parameters,
  the 25 biases and 9 LayerNorm weights (of 4 blocks' `ln_1`/`ln_2` and `ln_f`) included.

Measured here over 3 steps: `candidate()` is rounding, losses within 8.5e-07 (relative), the float64
runs' updates within 9e-08; as run, the updates of `attn.c_attn.bias` differ by up to 0.3 of the
update, in its key part, whose gradient softmax cancels (float64: 2e-18, float32: 2e-9) and Adam
scales up. `candidate_beta2`: Adam's bias correction leaves the first update alone (the second
moment differs 10x); the second step's updates differ by 0.18%. `candidate_decay_all`: the first
step's updates differ by up to 1.3% (lr * 0.01 * a LayerNorm weight of 1.27, against lr).

bisectr should conclude: `noise` for `candidate()`; `divergent` at step 2, stage `optimizer`, beta2
(0.999 against 0.99) for `candidate_beta2`; `divergent` at step 1, stage `optimizer`, weight decay on
the 34 parameters the reference exempts (9 norm weights, 25 biases) for `candidate_decay_all`.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_gpt2_paddle import CONFIG, candidate, reference  # noqa: E402,F401

LR, DECAY, BETA2 = 1e-3, 0.01, 0.999


def _exempt_from_decay(name: str) -> bool:
    """Hugging Face's rule: no weight decay on biases and LayerNorm weights (GPT-2's `ln_1`, `ln_2`, `ln_f`)."""
    return name.endswith("bias") or ".ln_" in name


def _batch(step: int):
    return np.random.default_rng(step).integers(0, CONFIG["vocab_size"], size=(2, 16))


def reference_batch(step):
    import torch

    return {"input_ids": torch.from_numpy(_batch(step)), "use_cache": False}


def candidate_batch(step):
    import paddle

    return {"input_ids": paddle.to_tensor(_batch(step))}


def reference_optimizer(model):
    import torch

    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if not _exempt_from_decay(n)], "weight_decay": DECAY},
              {"params": [p for n, p in named if _exempt_from_decay(n)], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, betas=(0.9, BETA2))


def candidate_optimizer(model, beta2: float = BETA2):
    import paddle

    exempt = {p.name for n, p in model.named_parameters() if _exempt_from_decay(n)}
    return paddle.optimizer.AdamW(learning_rate=LR, parameters=model.parameters(), weight_decay=DECAY, beta2=beta2,
                                  apply_decay_param_fun=lambda name: name not in exempt)


def candidate_beta2():
    return candidate()


def candidate_beta2_optimizer(model):
    return candidate_optimizer(model, beta2=0.99)


def candidate_decay_all():
    return candidate()


def candidate_decay_all_optimizer(model):
    import paddle

    return paddle.optimizer.AdamW(learning_rate=LR, parameters=model.parameters(), weight_decay=DECAY, beta2=BETA2)
