"""Framework-free helpers shared by the examples (numpy only).

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
