"""A correct PaddlePaddle port of an encoder + bilinear span head with trained-scale weights.

Reproduces seed 004: after bisecting by hand, the author found one `paddle.matmul` in the span
head whose inputs differ from torch's by ~3.7e-7 while its output (the start logits) differs by
~1.2e-3, and blamed the matmul.

Reference (torch): 2 post-LN encoder layers built from explicit ops, then
    temp = matmul(query_start_reps, start_classifier); start_logits = matmul(temp, start_reps^T)
(and the same for the end logits). Candidate: the same model in paddle (`paddle.matmul`,
`paddle.transpose(perm=[0, 2, 1])`), weights copied with `bisectr.weights.torch_to_paddle`.
The weights are scaled like a trained checkpoint (LayerNorm gains x10, span projections x1.5):
hidden states reach ~40 and logits ~1.6e3.

Measured here (torch 2.13 / paddle 3.3.1 CPU), max abs difference at magnitude (relative):
- hidden states entering the span head: 4.8e-5 at 42 (1.1e-6)
- the inputs of `start_logits = matmul(temp, start_reps^T)`: temp 3.3e-5 at 23 (1.4e-6),
  start_reps^T 5.8e-5 at 31 (1.9e-6)
- its output, the start logits: 2.1e-3 at 1.6e3 (1.3e-6)
- paddle's matmul replayed on torch's inputs: 2.4e-4 from torch's output (1.5e-7); against a
  float64 matmul torch is off by 3.1e-4 and paddle by 3.7e-4.
The relative error does not grow: the matmul carries its inputs' rounding to a large absolute
scale, and that is all (seed 004's "3.7e-7 in, 1.2e-3 out").

bisectr should conclude: verdict `noise`. Culprit: one of the two span-head matmuls producing the
logits (`matmul(temp, start_reps)` or `matmul(temp, end_reps)` in `span_head`; on this input
the end one amplifies slightly more, ~40x vs ~36x), the ops that amplify absolute error the
most, while replayed on the same inputs and against float64 both frameworks' matmuls are
equally accurate.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _blocks import paddle_port, paddle_side, token_ids, torch_model, torch_side  # noqa: E402

CONFIG = dict(vocab=100, dim=64, heads=4, hidden=256, layers=2)
TRAINED_SCALE = {"norm.weight": 10.0, "span_head.start.weight": 1.5, "span_head.end.weight": 1.5}


def input_ids():
    """Two sequences of 32 tokens; the second is padded (id 0) after 24 tokens."""
    return token_ids(CONFIG["vocab"], batch=2, length=32, padded_from=24)


def build_torch():
    return torch_model("SpanModel", CONFIG, TRAINED_SCALE)


def reference():
    return torch_side(build_torch(), input_ids())


def candidate():
    return paddle_side(paddle_port("SpanModel", CONFIG, build_torch()), input_ids())
