"""`backward_ports.py`'s stack trained with AdamW, and ports whose training differs in one way each.

The reference: torch `AdamW(lr=1e-2, weight_decay=0.1)`; `candidate`: the paddle port with paddle's
`AdamW` of the same settings. Each other candidate differs in one thing only:

- `candidate_adam_l2`: paddle `Adam(weight_decay=0.1)`: the decay added to the gradient (coupled L2).
- `candidate_eps`: `AdamW(epsilon=1e-6)` against torch's default 1e-8.
- `candidate_warmup` against `reference_warmup`: a 5-step linear warm-up, torch's `LambdaLR` at
  (step + 1) / 5 of the rate, paddle's `LinearWarmup` from 0: one step behind.
- `candidate_pylayer`: the port whose block 1 GELU has a wrong backward (a backward bug).
- `torch_adam_l2`: torch `Adam(weight_decay=0.1)` (torch against torch); `torch_port`: the reference again.
- `reference_grouped`: the reference with Hugging Face's convention, two parameter groups: LayerNorm
  weights and biases exempt from the decay. Against it, `candidate_decay_all` decays every parameter
  (paddle's `AdamW` as built above) and `candidate_exempt` exempts the same ones through
  `apply_decay_param_fun`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_ports import _paddle_side, reference, torch_model, _inputs  # noqa: E402,F401

LR, DECAY, WARMUP = 1e-2, 0.1, 5


def reference_optimizer(model):
    import torch

    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=DECAY)


def candidate():
    return _paddle_side("")


def candidate_optimizer(model):
    import paddle

    return paddle.optimizer.AdamW(learning_rate=LR, parameters=model.parameters(), weight_decay=DECAY)


def candidate_adam_l2():
    return _paddle_side("")


def candidate_adam_l2_optimizer(model):
    import paddle

    return paddle.optimizer.Adam(learning_rate=LR, parameters=model.parameters(), weight_decay=DECAY)


def candidate_eps():
    return _paddle_side("")


def candidate_eps_optimizer(model):
    import paddle

    return paddle.optimizer.AdamW(learning_rate=LR, parameters=model.parameters(), weight_decay=DECAY, epsilon=1e-6)


def reference_warmup():
    return reference()


def reference_warmup_optimizer(model):
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=DECAY)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP))


def candidate_warmup():
    return _paddle_side("")


def candidate_warmup_optimizer(model):
    import paddle

    schedule = paddle.optimizer.lr.LinearWarmup(LR, WARMUP, 0.0, LR)
    return paddle.optimizer.AdamW(learning_rate=schedule, parameters=model.parameters(), weight_decay=DECAY), schedule


def candidate_pylayer():
    return _paddle_side("pylayer")


def torch_adam_l2():
    return reference()


def torch_adam_l2_optimizer(model):
    import torch

    return torch.optim.Adam(model.parameters(), lr=LR, weight_decay=DECAY)


def torch_port():
    return reference()


def torch_port_optimizer(model):
    return reference_optimizer(model)


def _exempt(name: str) -> bool:
    """Hugging Face's rule: no weight decay on biases and LayerNorm weights."""
    return name.endswith("bias") or "norm" in name


def reference_grouped():
    return reference()


def reference_grouped_optimizer(model):
    import torch

    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if not _exempt(n)], "weight_decay": DECAY},
              {"params": [p for n, p in named if _exempt(n)], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR)


def candidate_decay_all():
    return _paddle_side("")


def candidate_decay_all_optimizer(model):
    return candidate_optimizer(model)


def candidate_exempt():
    return _paddle_side("")


def candidate_exempt_optimizer(model):
    import paddle

    decayed = {p.name for n, p in model.named_parameters() if not _exempt(n)}
    return paddle.optimizer.AdamW(learning_rate=LR, parameters=model.parameters(), weight_decay=DECAY,
                                  apply_decay_param_fun=lambda name: name in decayed)
