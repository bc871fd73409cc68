"""A PaddlePaddle reference against its PyTorch port `torch.compile`d: the encoder pair of
`examples/paddle_vs_torch.py` (paddle's BERT-like encoder, the torch port with its weights copied by
`bisectr.weights.paddle_to_torch`), the torch side compiled by inductor. Correct, it is `noise` as
the eager torch port is. `COMPILE_BUG=gelu_decomposition` plants a compiler bug: a decomposition
registered for `aten.gelu` that ignores its `approximate` argument and always takes the tanh
approximation, where the port's MLP asks for the exact erf form.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import paddle_vs_torch  # noqa: E402


def _plant_gelu_decomposition():
    import math

    import torch
    import torch._inductor.config
    from torch._inductor.decomposition import decompositions

    def tanh_gelu(x, approximate="none"):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    decompositions[torch.ops.aten.gelu.default] = tanh_gelu
    # inductor's cache keys do not include a decomposition registered at run time
    torch._inductor.config.force_disable_caches = True


def reference():
    return paddle_vs_torch.reference()


def candidate():
    import torch

    if os.environ.get("COMPILE_BUG") == "gelu_decomposition":
        _plant_gelu_decomposition()
    model, inputs = paddle_vs_torch.candidate()
    return torch.compile(model), inputs
