"""A padded-batch classifier whose two sides represent the padding mask differently: additive float against boolean.

Reference: two self-attention blocks (`blocks.N`: `norm` = `nn.LayerNorm(32)`, `qkv` 32 -> 96, 4 heads,
`out` 32 -> 32, residual) over inputs (2, 8, 32), then masked mean pooling and a `classifier` 32 -> 5.
The padding mask is additive float: `(1 - attention_mask) * -1e9` of shape (2, 1, 1, 8), added to the
scores; the pooling multiplies by the float mask and divides by its sum. `torch.manual_seed(0)`, biases
0.1 N(0, 1), norms 1 + 0.1 N(0, 1); eval. Inputs: `x` (2, 8, 32) from `torch.manual_seed(1)` and an
integer `attention_mask` whose second row has its last 3 positions padded.

Candidates: the same model loaded from the reference's state dict, with its mask made another way:
`"boolean"`, the scores `masked_fill`ed with -inf where `~attention_mask.bool()` (shape (2, 1, 1, 8)), the
pooling `masked_fill`ing padded positions with 0 and dividing by the count of kept ones (`_pool`);
`"padded"`, an additive float mask made from the padded positions, `(attention_mask == 0).float() * -1e9`,
whose cast holds the complement of the reference's `.float()` (1 where padded, not where kept): the two
casts pair, a pairing their values refute.

- `candidate()` (boolean) and `candidate_padded_mask()`: correct ports.
- `candidate_pool_full_length()` (boolean) and `candidate_padded_mask_pool_full_length()`: the pooling
  divides by the full length (8) instead of the count of kept positions (the line tagged
  `@full_length`), so the padded row's pooled vector is 5/8 of the reference's.
- `candidate_padded_mask_scaled_by_model_width()` ("padded"): every block adds the mask to the scores,
  then scales them by 32 ** -0.5 where the reference scales by the head width's 8 ** -0.5 before adding
  the mask (the line tagged `@scale_after_mask`): the two sides' add and mul come in the other order.

Measured here (CPU, float32; relative = max abs difference / max abs of the reference), logits of
magnitude 0.51: the correct ports bit-identical (0), the pooling bugs 8.3e-02 (0.16 relative), the scale
1.9e-02 (0.037 relative).

bisectr should conclude: `match` (or `noise`) for the correct ports; `divergent` for the pooling bugs,
culprit the pooling's division (at the top level, the line tagged `@full_length`; the reference's count of kept
positions, which the candidate lacks, compared with it), confirmed; for the scale, the attention compared as one
block, entered at the candidate's add at `@scale_after_mask` in `blocks.0` (against the reference's mask add),
both blocks listed, confirmed; the masks' values must not steer the search.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _weights import draw_biases_and_norms, loaded_from  # noqa: E402

D, HEADS, SEQ, BATCH, BLOCKS, CLASSES = 32, 4, 8, 2, 2, 5
PADDED = 3  # padded positions at the end of the second row


def _inputs():
    import torch

    torch.manual_seed(1)
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
    attention_mask[1, SEQ - PADDED:] = 0
    return {"x": torch.randn(BATCH, SEQ, D), "attention_mask": attention_mask}


def _model(mask_kind: str, pool_full_length: bool = False, scale_after_mask: bool = False):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(D)
            self.qkv = nn.Linear(D, 3 * D)
            self.out = nn.Linear(D, D)

        def forward(self, x, mask):
            q, k, v = self.qkv(self.norm(x)).view(BATCH, SEQ, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
            if scale_after_mask:
                scores = (q @ k.transpose(-1, -2) + mask) * D ** -0.5  # @scale_after_mask
            else:
                scores = q @ k.transpose(-1, -2) * (D // HEADS) ** -0.5
                if mask_kind == "boolean":
                    scores = scores.masked_fill(~mask, float("-inf"))
                else:
                    scores = scores + mask
            a = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(BATCH, SEQ, D)
            return x + self.out(a)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
            self.classifier = nn.Linear(D, CLASSES)

        def forward(self, x, attention_mask):
            if mask_kind == "boolean":
                mask = attention_mask.bool()[:, None, None, :]
            elif mask_kind == "padded":
                mask = (attention_mask[:, None, None, :] == 0).float() * -1e9
            else:
                mask = (1.0 - attention_mask[:, None, None, :].float()) * -1e9
            for block in self.blocks:
                x = block(x, mask)
            return self.classifier(self._pool(x, attention_mask))

        def _pool(self, x, attention_mask):
            if mask_kind == "additive":
                weights = attention_mask[..., None].float()
                return (x * weights).sum(1) / weights.sum(1)
            keep = attention_mask.bool()[..., None]
            total = x.masked_fill(~keep, 0.0).sum(1)
            if pool_full_length:
                return total / x.shape[1]  # @full_length
            return total / keep.sum(1)

    return Model()


def _reference_model():
    import torch

    torch.manual_seed(0)
    return draw_biases_and_norms(_model("additive"))


def reference():
    return _reference_model(), _inputs()


def _port(mask_kind: str = "boolean", **bug):
    return loaded_from(_model(mask_kind, **bug), _reference_model()), _inputs()


def candidate():
    return _port()


def candidate_pool_full_length():
    return _port(pool_full_length=True)


def candidate_padded_mask():
    return _port("padded")


def candidate_padded_mask_pool_full_length():
    return _port("padded", pool_full_length=True)


def candidate_padded_mask_scaled_by_model_width():
    return _port("padded", scale_after_mask=True)
