"""Helpers shared by the examples: numpy inputs, and the scaffolding of a torch model and its paddle port.

Importing this module needs numpy only: torch and paddle are imported inside the functions that use them.

The torch building blocks are in `_torch_blocks.py` and their PaddlePaddle ports in
`_paddle_blocks.py`, kept apart so that a side imports only its own framework. Example files
put this directory on `sys.path` and import these modules inside `reference()` / `candidate()`.
"""
from __future__ import annotations

import numpy as np


def token_ids(vocab: int, batch: int, length: int, seed: int = 0, padded_from: int | None = None) -> np.ndarray:
    """Random int64 token ids in [1, vocab); with `padded_from`, the last sequence is padded with
    id 0 from that position on."""
    ids = np.random.RandomState(seed).randint(1, vocab, size=(batch, length)).astype(np.int64)
    if padded_from is not None:
        ids[-1, padded_from:] = 0
    return ids


def normal(*shape: int, seed: int = 0, std: float = 1.0, dtype: str = "float32") -> np.ndarray:
    """Seeded normal samples."""
    return (np.random.RandomState(seed).normal(size=shape) * std).astype(dtype)


def sinusoidal_table(length: int, dim: int) -> np.ndarray:
    """The CTRL/Transformer position table (sines then cosines), computed in float64, as float32."""
    angles = np.arange(length)[:, None] / np.power(10000.0, (2 * (np.arange(dim)[None, :] // 2)) / dim)
    return np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], axis=-1).astype(np.float32)


# Scaffolding shared by the torch-vs-paddle examples. The frameworks are imported inside the
# functions, so this module stays importable (and each side imports only its own framework).

def torch_model(class_name: str, config: dict, scale: dict[str, float] | None = None, seed: int = 0):
    """`_torch_blocks.<class_name>(**config)` built right after `torch.manual_seed(seed)`, in eval mode.

    With `scale`, parameters get "trained-scale" magnitudes first (`_torch_blocks.scale_parameters`:
    every parameter whose name ends with a key is multiplied by its value).
    """
    import torch

    import _torch_blocks

    torch.manual_seed(seed)
    model = getattr(_torch_blocks, class_name)(**config)
    if scale:
        _torch_blocks.scale_parameters(model, scale)
    return model.eval()


def torch_side(model, *arrays):
    """`(model, inputs)` for a torch side: the numpy `arrays` wrapped with `torch.from_numpy`."""
    import torch

    return model, tuple(torch.from_numpy(a) for a in arrays)


def paddle_port(class_name: str, config: dict, source, **copy_options):
    """`_paddle_blocks.<class_name>(**config)` (same parameter names as the torch block) with the
    weights of the torch model `source` copied in by `bisectr.weights.torch_to_paddle(source,
    model, **copy_options).check()`, in eval mode."""
    import _paddle_blocks

    from bisectr.weights import torch_to_paddle

    model = getattr(_paddle_blocks, class_name)(**config)
    torch_to_paddle(source, model, **copy_options).check()
    model.eval()
    return model


def paddle_side(model, *arrays):
    """`(model, inputs)` for a paddle side: the numpy `arrays` wrapped with `paddle.to_tensor`."""
    import paddle

    return model, tuple(paddle.to_tensor(a) for a in arrays)
