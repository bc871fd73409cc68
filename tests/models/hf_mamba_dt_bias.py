"""Hugging Face Mamba against the same class whose selective scan adds the time-step (dt) bias once more.

Reference: `transformers.MambaForCausalLM` (3 layers, hidden 64, state 8, expand 2), `torch.manual_seed(0)`,
eval; input_ids (2, 8) from `default_rng(0)`. Candidate: the same weights; `candidate_dt_bias_twice()`
runs every mixer's selective scan with `dt + dt_bias` where the scan adds `dt_bias` itself (line marked
`# @twice`), as a port of the kernel's `delta_bias` into a hand-written scan does.

Measured here: outputs (magnitude 6.0) differ by 0.027 (4.5e-03 relative) with the bias twice.

bisectr should conclude: `match` for `candidate()`; `divergent` for `candidate_dt_bias_twice()`, culprit
the second add of the bias in `backbone.layers.0.mixer` (of the two, the first holds the reference's
values), the same difference in layers 1 and 2, confirmed.
"""
import inspect
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402

CONFIG = dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, state_size=8, expand=2)


def _mamba():
    hide_broken_torchcodec()
    import numpy as np
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(transformers.MambaConfig(**CONFIG)).eval()
    return model, {"input_ids": torch.from_numpy(np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (2, 8)))}


def _scan_with_dt_bias_twice(hidden_states, dt, *args, delta_bias=None, **kwargs):
    from transformers.models.mamba import modeling_mamba

    dt = dt + delta_bias.to(dt.dtype)[..., None]  # @twice
    return modeling_mamba.mamba_selective_scan(hidden_states, dt, *args, delta_bias=delta_bias, **kwargs)


def reference():
    return _mamba()


def candidate(dt_bias_twice: bool = False):
    model, inputs = _mamba()
    if dt_bias_twice:
        forward = inspect.unwrap(type(model.backbone.layers[0].mixer).forward)
        with_scan = types.FunctionType(forward.__code__, {**forward.__globals__, "mamba_selective_scan": _scan_with_dt_bias_twice},
                                       forward.__name__, forward.__defaults__, forward.__closure__)
        for layer in model.backbone.layers:
            layer.mixer.forward = types.MethodType(with_scan, layer.mixer)
    return model, inputs


def candidate_dt_bias_twice():
    """Every mixer's scan adds the dt bias twice."""
    return candidate(dt_bias_twice=True)
