"""A PaddlePaddle port whose RMSNorm epsilon is 1e-6 where the reference uses 1e-5, in every layer.

The epsilon inside rsqrt(mean(x^2) + eps) only matters when mean(x^2) is not much larger than
eps, which is exactly the case for a Llama-style model's small embeddings (std ~0.01, so
mean(x^2) ~ 1e-4): the first norm's output scale changes by ~5%. Later norms see a larger
residual stream, so the same slip changes them less, but still far above float32 rounding.

Reference (torch): Llama-like causal LM (`_torch_blocks.DecoderLM`, style "llama": RMSNorm,
4 pre-norm blocks, dim 64, embeddings scaled to std 0.01), `eps=1e-5`. Candidate: the paddle port
with weights copied by `bisectr.weights.torch_to_paddle`, built with `eps=1e-6`: every RMSNorm
(`blocks.N.attn_norm`, `blocks.N.ffn_norm`, `final_norm`) has the wrong epsilon.
`candidate_fixed()` is the same port with `eps=1e-5`.

Measured here: logits differ by 5.2e-2 at magnitude 1.7 (3.0e-2 relative); with
`candidate_fixed()`, by 9.5e-7 (5.6e-7 relative). Each norm's own error (eps 1e-6 instead of
1e-5 on the reference's input): `blocks.0.attn_norm` 0.2 (input rms 0.01), then 1.1e-3,
4.4e-4, ... down to 3.2e-5 for `final_norm` (input rms 0.66), against float32 rounding of
~4e-7: every one of the nine is 100x-500000x above rounding.

bisectr should conclude: verdict `divergent`; culprit the first norm, `blocks.0.attn_norm`
(its `rsqrt(variance + eps)` add, or the fused block standing for the norm), with the eight
later norms reported as recurrences of the same difference.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _blocks import paddle_port, paddle_side, token_ids, torch_model, torch_side  # noqa: E402

CONFIG = dict(vocab=64, dim=64, heads=4, hidden=256, layers=4, style="llama")
SMALL_EMBEDDINGS = {"embed.weight": 0.01}
REFERENCE_EPS = 1e-5
CANDIDATE_EPS = 1e-6


def input_ids():
    return token_ids(CONFIG["vocab"], batch=2, length=16)


def build_torch():
    return torch_model("DecoderLM", dict(CONFIG, eps=REFERENCE_EPS), SMALL_EMBEDDINGS)


def reference():
    return torch_side(build_torch(), input_ids())


def candidate(eps: float = CANDIDATE_EPS):
    return paddle_side(paddle_port("DecoderLM", dict(CONFIG, eps=eps), build_torch()), input_ids())


def candidate_fixed():
    return candidate(eps=REFERENCE_EPS)
