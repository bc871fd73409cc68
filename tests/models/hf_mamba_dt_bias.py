"""Hugging Face Mamba against the same class whose selective scan adds the time-step (dt) bias once more.

Reference: `transformers.MambaForCausalLM` (3 layers, hidden 64, state 8, expand 2), `torch.manual_seed(0)`,
eval; input_ids (2, 8) from `default_rng(0)`. Candidate: the same weights; `candidate_dt_bias_twice()`
adds every mixer's time-step (dt) bias once more (lines marked `# @twice`), as a port of the kernel's
`delta_bias` into a hand-written scan does: where transformers' mixer hands the bias to its selective scan
(transformers 5.24), the scan runs on `dt + dt_bias`; where it calls `dt_proj` (transformers 5.3), the
projection's output gets its bias again.

Measured here: outputs (magnitude 6.0) differ by 0.027 (4.5e-03 relative) with the bias twice.

bisectr should conclude: `match` for `candidate()`; `divergent` for `candidate_dt_bias_twice()`, culprit
the extra add of the bias in `backbone.layers.0.mixer` (with the scan, the second of the two adds: the
first holds the reference's values), the same difference in layers 1 and 2, confirmed.
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
        if "mamba_selective_scan" in forward.__globals__:
            with_scan = types.FunctionType(forward.__code__, {**forward.__globals__, "mamba_selective_scan": _scan_with_dt_bias_twice},
                                           forward.__name__, forward.__defaults__, forward.__closure__)
            for layer in model.backbone.layers:
                layer.mixer.forward = types.MethodType(with_scan, layer.mixer)
        else:
            for layer in model.backbone.layers:
                layer.mixer.dt_proj.register_forward_hook(lambda module, args, out: out + module.bias)  # @twice
    return model, inputs


def candidate_dt_bias_twice():
    """Every mixer's scan adds the dt bias twice."""
    return candidate(dt_bias_twice=True)
