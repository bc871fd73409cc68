"""torch's `nn.TransformerEncoder` with a boolean padding mask against paddle's, whose boolean mask means
the other thing.

Reference: `transformer_encoder.py`'s torch encoder called with `src_key_padding_mask=pad` (True: a
padded key, blocked); the last 3 of batch row 0's 8 tokens are padding. Candidate: its paddle port
called with `src_mask=keep` shaped (batch, 1, 1, keys), where paddle's boolean mask is True where a key
is kept, so the port passes `~pad`. `candidate_mask_as_is()` passes torch's mask unchanged (line marked
`# @as_is`): paddle then attends to the padding only, and to no key of the rows without any.

Measured here: outputs (magnitude 3.5) differ by 7.2e-07 (2.1e-07 relative); with
`candidate_mask_as_is()`, by 1.58 (0.45 relative).

bisectr should conclude: `noise` for `candidate()` (torch masks with -inf, paddle with -1e9);
`divergent` for `candidate_mask_as_is()`, culprit the ops that make paddle's additive mask from the
boolean one, paired with the reference's `masked_fill_` of -inf, confirmed.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_encoder as encoder  # noqa: E402


def _padding() -> np.ndarray:
    pad = np.zeros((encoder.BATCH, encoder.SEQ), dtype=bool)
    pad[0, -3:] = True
    return pad


def reference():
    import torch

    class Padded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder.reference()[0]

        def forward(self, x, pad):
            return self.encoder(x, src_key_padding_mask=pad)

    return Padded().eval(), (encoder.reference()[1][0], torch.from_numpy(_padding()))


def candidate(as_is: bool = False):
    import paddle

    class Padded(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.encoder = encoder.candidate()[0]

        def forward(self, x, pad):
            keep = pad if as_is else paddle.logical_not(pad)  # @as_is
            return self.encoder(x, src_mask=keep.unsqueeze([1, 2]))

    model = Padded()
    model.eval()
    return model, (encoder.candidate()[1][0], paddle.to_tensor(_padding()))


def candidate_mask_as_is():
    """The port hands paddle torch's padding mask as it is: True now keeps the padding."""
    return candidate(as_is=True)
