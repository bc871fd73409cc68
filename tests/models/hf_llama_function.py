"""A tiny Hugging Face Llama against itself with one RMSNorm computed by a custom autograd function.

Reference: `transformers.LlamaForCausalLM` from a random seeded config (4 layers, hidden 64, 4 query /
2 key-value heads, intermediate 128, vocab 128, eager attention), `torch.manual_seed(0)`, RMSNorm
weights drawn around 1, eval, input_ids (2, 12), `use_cache=False`.

Candidates are a `copy.deepcopy` whose `model.layers.1.post_attention_layernorm` is a `FusedRMSNorm`
(same weight), computed by a `torch.autograd.Function` as fused kernels are: the forward is
HF's formula; the backward is written out by hand.

- `candidate()`: the backward right, d/dx of w * x * r with r = rsqrt(mean(x^2) + eps):
  r * (w g - x r^2 mean(w g x)).
- `candidate_dropped_term()`: the backward drops the variance term (`r * w g` only; the line marked
  `# @dropped`), as a fused kernel that forgets that r depends on x.

Measured here: forward outputs bit-equal to the reference's; with `candidate_dropped_term()`, parameter
gradients (seeded from one random output gradient) differ by 0.3 (relative, worst parameter).

bisectr should conclude: forward `match`; backward `noise` for `candidate()`, `divergent` for
`candidate_dropped_term()`, culprit the function in `model.layers.1.post_attention_layernorm`,
confirmed.
"""
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_llama_weights import _inputs, _llama  # noqa: E402  (the same reference model and inputs)


def reference():
    return _llama(), _inputs()


def _fused_rms_norm(norm, drop_variance_term: bool):
    import torch

    class RMSNormFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            ctx.save_for_backward(x, weight, r)
            return weight * (x * r)

        @staticmethod
        def backward(ctx, grad):
            x, weight, r = ctx.saved_tensors
            wg = weight * grad
            if drop_variance_term:
                grad_x = r * wg  # @dropped
            else:
                grad_x = r * (wg - x * r.pow(2) * (wg * x).mean(-1, keepdim=True))
            grad_weight = (grad * x * r).reshape(-1, x.shape[-1]).sum(0)
            return grad_x, grad_weight, None

    class FusedRMSNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = norm.weight
            self.variance_epsilon = norm.variance_epsilon

        def forward(self, hidden_states):
            return RMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon)

    return FusedRMSNorm()


def candidate(drop_variance_term: bool = False):
    model = copy.deepcopy(_llama())
    layer = model.model.layers[1]
    layer.post_attention_layernorm = _fused_rms_norm(layer.post_attention_layernorm, drop_variance_term)
    return model, _inputs()


def candidate_dropped_term():
    return candidate(drop_variance_term=True)
