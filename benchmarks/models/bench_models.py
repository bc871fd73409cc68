"""bisectr model file for the benchmarks: one pair of zero-argument functions per configuration.

`python benchmarks/run.py` picks functions by name (`bisectr.trace(..., reference=NAME, candidate=NAME)`,
or `record_side` on one of them). Sizes come from `SIZES` below; `BISECTR_BENCH_QUICK=1` in the
environment selects the small smoke-test sizes, `BISECTR_BENCH_BATCH_SCALE=K` multiplies every batch.

- `{torch,paddle}_small`: a small post-LN encoder on token ids.
- `{torch,paddle}_base`: a BERT-base-shaped encoder: 12 layers, d=768, 12 heads, FFN 3072, batch 2, seq 128;
  `*_base_tanh` the same (same seed) with the tanh GELU in layer `tanh_layer("base")`.
- `{torch,paddle}_deep`: a 48-layer narrow pre-LN stack (causal mask, final LayerNorm) on hidden states;
  `*_deep_tanh` is the same model (same seed, same weights) with the tanh GELU in block `tanh_layer("deep")`.
- `{torch,paddle}_shallow[_tanh]`: the same pair with few layers (for the exhaustive search).
- `paddle_deep_tanh_ported`: the paddle stack with `torch_deep`'s weights copied in (cross-framework pair).
- `torch_block`, `paddle_block_ported`: one pre-LN block (for the synthetic aligner traces).

The models are the examples' building blocks (`examples/_torch_blocks.py`, `examples/_paddle_blocks.py`:
`Encoder`, `PreLNStack`); the tanh GELU is planted the way `examples/tanh_gelu.py` plants it.
"""
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples")))

QUICK = os.environ.get("BISECTR_BENCH_QUICK") == "1"

SIZES = {
    "small": dict(vocab=1000, dim=128, heads=4, hidden=512, layers=4, batch=2, seq=32),
    "base": dict(vocab=1000, dim=768, heads=12, hidden=3072, layers=12, batch=2, seq=128),
    "deep": dict(dim=64, heads=4, hidden=256, layers=48, batch=2, seq=32),
    "shallow": dict(dim=64, heads=4, hidden=256, layers=6, batch=2, seq=32),
    "block": dict(dim=64, heads=4, hidden=256, layers=1, batch=2, seq=16),
}
QUICK_SIZES = {
    "small": dict(vocab=100, dim=32, heads=2, hidden=64, layers=2, batch=2, seq=8),
    "base": dict(vocab=100, dim=64, heads=4, hidden=256, layers=2, batch=2, seq=16),
    "deep": dict(dim=32, heads=2, hidden=64, layers=8, batch=2, seq=8),
    "shallow": dict(dim=32, heads=2, hidden=64, layers=2, batch=2, seq=8),
    "block": dict(dim=32, heads=2, hidden=64, layers=1, batch=2, seq=8),
}


def size(name: str) -> dict:
    """The configuration `name`; `BISECTR_BENCH_BATCH_SCALE=K` multiplies its batch (the memory benchmark
    records the same op graph with K times bigger tensors)."""
    cfg = dict((QUICK_SIZES if QUICK else SIZES)[name])
    cfg["batch"] *= int(os.environ.get("BISECTR_BENCH_BATCH_SCALE", "1"))
    return cfg


def tanh_layer(name: str = "deep") -> int:
    """The layer that gets the tanh GELU: past the middle, not on a power-of-two boundary."""
    return (size(name)["layers"] * 5) // 8


def _ids(cfg):
    import numpy as np

    return np.random.RandomState(0).randint(1, cfg["vocab"], size=(cfg["batch"], cfg["seq"]))


def _hidden(cfg):
    import numpy as np

    return np.random.RandomState(0).standard_normal((cfg["batch"], cfg["seq"], cfg["dim"])).astype("float32")


# fc1 weights x3, so GELU inputs reach |x| ~ 1-3, where the tanh and exact GELU differ.
FFN_SCALE = {"fc1.weight": 3.0}


def _plant_tanh(model, name, tanh):
    """The planted bug (as in examples/tanh_gelu.py): layer `tanh_layer(name)` gets the tanh GELU."""
    if tanh:
        model.layers[tanh_layer(name)].ffn.activation = "gelu_tanh"
    return model


# -- torch -------------------------------------------------------------------------------------
def _torch_encoder(name, tanh=False):
    import torch
    from _torch_blocks import Encoder

    cfg = size(name)
    torch.manual_seed(0)
    model = Encoder(cfg["vocab"], cfg["dim"], cfg["heads"], cfg["hidden"], cfg["layers"], max_len=cfg["seq"])
    return _plant_tanh(model, name, tanh).eval(), (torch.from_numpy(_ids(cfg)),)


def _torch_stack(name, tanh=False, causal=True, final_norm=True):
    import torch
    from _torch_blocks import PreLNStack, scale_parameters

    cfg = size(name)
    torch.manual_seed(0)
    model = PreLNStack(cfg["dim"], cfg["heads"], cfg["hidden"], cfg["layers"], causal=causal, final_norm=final_norm)
    scale_parameters(_plant_tanh(model, name, tanh), FFN_SCALE)
    return model.eval(), (torch.from_numpy(_hidden(cfg)),)


def torch_small():
    return _torch_encoder("small")


def torch_base():
    return _torch_encoder("base")


def torch_base_tanh():
    return _torch_encoder("base", tanh=True)


def torch_deep():
    return _torch_stack("deep")


def torch_deep_tanh():
    return _torch_stack("deep", tanh=True)


def torch_shallow():
    return _torch_stack("shallow")


def torch_shallow_tanh():
    return _torch_stack("shallow", tanh=True)


def torch_block():
    return _torch_stack("block", causal=False, final_norm=False)


# -- paddle ------------------------------------------------------------------------------------
def _paddle_encoder(name, tanh=False):
    import paddle
    from _paddle_blocks import Encoder

    cfg = size(name)
    paddle.seed(0)
    model = Encoder(cfg["vocab"], cfg["dim"], cfg["heads"], cfg["hidden"], cfg["layers"], max_len=cfg["seq"])
    _plant_tanh(model, name, tanh).eval()
    return model, (paddle.to_tensor(_ids(cfg)),)


def _paddle_stack(name, tanh=False, causal=True, final_norm=True, port_from_torch=False):
    import paddle
    from _paddle_blocks import PreLNStack, scale_parameters

    cfg = size(name)
    paddle.seed(0)
    model = PreLNStack(cfg["dim"], cfg["heads"], cfg["hidden"], cfg["layers"], causal=causal, final_norm=final_norm)
    _plant_tanh(model, name, tanh)
    if port_from_torch:
        from bisectr.weights import torch_to_paddle

        torch_model, _ = _torch_stack(name, causal=causal, final_norm=final_norm)
        torch_to_paddle(torch_model, model).check()
    else:
        scale_parameters(model, FFN_SCALE)
    model.eval()
    return model, (paddle.to_tensor(_hidden(cfg)),)


def paddle_small():
    return _paddle_encoder("small")


def paddle_base():
    return _paddle_encoder("base")


def paddle_base_tanh():
    return _paddle_encoder("base", tanh=True)


def paddle_deep():
    return _paddle_stack("deep")


def paddle_deep_tanh():
    return _paddle_stack("deep", tanh=True)


def paddle_shallow():
    return _paddle_stack("shallow")


def paddle_shallow_tanh():
    return _paddle_stack("shallow", tanh=True)


def paddle_deep_tanh_ported():
    return _paddle_stack("deep", tanh=True, port_from_torch=True)


def paddle_block_ported():
    return _paddle_stack("block", causal=False, final_norm=False, port_from_torch=True)
