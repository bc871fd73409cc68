"""How each framework spells what a port writes: one `Dialect` per framework, each method returning source text.

The writer composes a port from these spellings, so that one description of a family gives a torch port and a
paddle port that differ as a porter's two ports would: paddle's `Linear` stores its weight (in, out), `axis=` where
torch says `dim=`, `transpose` takes a permutation, `matmul` transposes its second operand itself,
`scaled_dot_product_attention` reads [batch, seq, heads, dim]. Expressions only: the writer owns the statements.
"""

from __future__ import annotations

from dataclasses import dataclass


def _listed(shape: str) -> str:
    """A shape written as the torch call's arguments, as the list paddle takes."""
    return f"[{shape}]"


@dataclass(frozen=True)
class Dialect:
    """One framework's spellings (a subclass per framework fills in what differs)."""

    name: str  # "torch" or "paddle"
    lib: str  # the framework's module name in the port's source
    module: str  # the module base class
    module_list: str
    linear_stores_in_out: bool  # does its Linear keep the weight (in, out)?
    axis: str  # the keyword naming an axis: dim or axis
    sdpa_keeps_heads_second: bool  # does its fused attention give [batch, heads, seq, dim] (else [batch, seq, ...])?

    def imports(self) -> list[str]:
        return ["import math", "", "import numpy as np", f"import {self.lib}", f"import {self.lib}.nn.functional as F",
                f"from {self.lib} import nn"]

    # -- building ---------------------------------------------------------------------------------------------
    def embedding(self, count: str, dim: str) -> str:
        return f"nn.Embedding({count}, {dim})"

    def bool_dtype(self) -> str:
        raise NotImplementedError

    # -- computing: shapes ---------------------------------------------------------------------------------------
    def cat(self, parts: str, axis: int | str) -> str:
        raise NotImplementedError

    def stack(self, parts: str, axis: int | str) -> str:
        return f"{self.lib}.stack({parts}, {self.axis}={axis})"

    def split(self, x: str, sizes: str, axis: int) -> str:
        return f"{self.lib}.split({x}, {sizes}, {self.axis}={axis})"

    def chunk(self, x: str, count: int, axis: int) -> str:
        return f"{self.lib}.chunk({x}, {count}, {self.axis}={axis})"

    def swap(self, x: str, a: int, b: int, rank: int) -> str:
        """`x` with axes `a` and `b` exchanged (`rank`: its number of axes)."""
        raise NotImplementedError

    def permute(self, x: str, order: tuple[int, ...]) -> str:
        raise NotImplementedError

    def reshape(self, x: str, shape: str) -> str:
        raise NotImplementedError

    def expand(self, x: str, shape: str) -> str:
        raise NotImplementedError

    def repeat_interleave(self, x: str, repeats: str, axis: int) -> str:
        raise NotImplementedError

    # -- computing: values -----------------------------------------------------------------------------------------
    def matmul_t(self, a: str, b: str) -> str:
        """a @ b^T over the last two axes."""
        raise NotImplementedError

    def softmax(self, x: str, axis: int) -> str:
        return f"F.softmax({x}, {self.axis}={axis})"

    def arange(self, stop: str, dtype: str | None = None) -> str:
        return f"{self.lib}.arange({stop})" if dtype is None else f"{self.lib}.arange({stop}, dtype={dtype})"

    def arange_step(self, start: str, stop: str, step: str, dtype: str) -> str:
        return f"{self.lib}.arange({start}, {stop}, {step}, dtype={dtype})"

    def full(self, shape: str, value: str, dtype: str) -> str:
        raise NotImplementedError

    def ones(self, shape: str, dtype: str) -> str:
        raise NotImplementedError

    def zeros(self, shape: str, dtype: str) -> str:
        raise NotImplementedError

    def to(self, x: str, dtype: str) -> str:
        raise NotImplementedError

    def finfo_min(self, dtype: str) -> str:
        return f"{self.lib}.finfo({dtype}).min"

    def clamp(self, x: str, low: str | None = None, high: str | None = None) -> str:
        raise NotImplementedError

    def where(self, condition: str, x: str, y: str) -> str:
        return f"{self.lib}.where({condition}, {x}, {y})"

    def gelu(self, x: str, tanh: bool) -> str:
        raise NotImplementedError

    def gelu_module(self, tanh: bool) -> str:
        raise NotImplementedError

    def sdpa(self, q: str, k: str, v: str, mask: str, scale: str, grouped: bool) -> str:
        """Fused attention of q, k, v laid out [batch, heads, seq, dim] (transposed for paddle's call, whose output
        stays [batch, seq, heads, dim]: `sdpa_keeps_heads_second`); `grouped`: k and v hold fewer heads than q."""
        raise NotImplementedError

    def topk(self, x: str, k: str) -> str:
        return f"{self.lib}.topk({x}, {k}, {self.axis}=-1)"

    def one_hot(self, x: str, count: str, dtype: str) -> str:
        raise NotImplementedError

    def nonzero(self, condition: str) -> str:
        """The indices of `condition`'s true entries, one tensor per axis."""
        raise NotImplementedError

    def index_add(self, x: str, index: str, values: str) -> str:
        """`x` with `values` added at rows `index`."""
        raise NotImplementedError

    # -- layers ---------------------------------------------------------------------------------------------------
    def linear(self, fan_in: str, fan_out: str, bias: bool) -> str:
        raise NotImplementedError

    def parameter(self, shape: str, fill: float | None) -> str:
        """A parameter of `shape` (the torch call's arguments), filled with `fill` (None: left to the loader)."""
        raise NotImplementedError

    def buffer(self, name: str, value: str) -> str:
        """The statement registering a buffer the state dict holds."""
        raise NotImplementedError

    def layer_norm_module(self, dim: str, eps: str) -> str:
        raise NotImplementedError

    def layer_norm(self, x: str, dim: str, weight: str, bias: str, eps: str) -> str:
        raise NotImplementedError

    def rms_norm(self, x: str, dim: str, weight: str, eps: str) -> str:
        raise NotImplementedError

    def conv2d_module(self, cin: str, cout: str, kernel: str, stride: str, padding: str, bias: bool) -> str:
        raise NotImplementedError

    def conv2d(self, x: str, weight: str, bias: str | None, stride: str, padding: str) -> str:
        tail = "" if bias is None else f", {bias}"
        return f"F.conv2d({x}, {weight}{tail}, stride={stride}, padding={padding})"

    def batch_norm_module(self, channels: str, eps: str) -> str:
        raise NotImplementedError

    def batch_norm(self, x: str, mean: str, var: str, weight: str, bias: str, eps: str) -> str:
        raise NotImplementedError

    def max_pool_module(self, kernel: int, stride: int, padding: int) -> str:
        raise NotImplementedError

    def max_pool(self, x: str, kernel: int, stride: int, padding: int) -> str:
        return f"F.max_pool2d({x}, {kernel}, stride={stride}, padding={padding})"

    def state_dict_loader(self) -> list[str]:
        """The port's `load(model, weights)`: numpy arrays into the model, every name and shape checked."""
        raise NotImplementedError


class Torch(Dialect):
    """torch's spellings."""

    def __init__(self):
        super().__init__("torch", "torch", "nn.Module", "nn.ModuleList", False, "dim", True)

    def bool_dtype(self):
        return "torch.bool"

    def cat(self, parts, axis):
        return f"torch.cat({parts}, dim={axis})"

    def chunk(self, x, count, axis):
        return f"{x}.chunk({count}, dim={axis})"

    def swap(self, x, a, b, rank):
        return f"{x}.transpose({a}, {b})"

    def permute(self, x, order):
        return f"{x}.permute({', '.join(map(str, order))})"

    def reshape(self, x, shape):
        return f"{x}.reshape({shape})"

    def expand(self, x, shape):
        return f"{x}.expand({shape})"

    def repeat_interleave(self, x, repeats, axis):
        return f"{x}.repeat_interleave({repeats}, dim={axis})"

    def matmul_t(self, a, b):
        return f"{a} @ {b}.transpose(-2, -1)"

    def full(self, shape, value, dtype):
        return f"torch.full(({shape}), {value}, dtype={dtype})"

    def ones(self, shape, dtype):
        return f"torch.ones({shape}, dtype={dtype})"

    def zeros(self, shape, dtype):
        return f"torch.zeros({shape}, dtype={dtype})"

    def to(self, x, dtype):
        return f"{x}.to({dtype})"

    def clamp(self, x, low=None, high=None):
        bounds = ([f"min={low}"] if low is not None else []) + ([f"max={high}"] if high is not None else [])
        return f"torch.clamp({x}, {', '.join(bounds)})"

    def gelu(self, x, tanh):
        return f"F.gelu({x}, approximate='tanh')" if tanh else f"F.gelu({x})"

    def gelu_module(self, tanh):
        return "nn.GELU(approximate='tanh')" if tanh else "nn.GELU()"

    def sdpa(self, q, k, v, mask, scale, grouped):
        gqa = ", enable_gqa=True" if grouped else ""
        return f"F.scaled_dot_product_attention({q}, {k}, {v}, attn_mask={mask}, scale={scale}{gqa})"

    def one_hot(self, x, count, dtype):
        return f"F.one_hot({x}, {count}).to({dtype})"

    def nonzero(self, condition):
        return f"torch.where({condition})"

    def index_add(self, x, index, values):
        return f"{x}.index_add(0, {index}, {values})"

    def linear(self, fan_in, fan_out, bias):
        return f"nn.Linear({fan_in}, {fan_out}, bias={bias})"

    def parameter(self, shape, fill):
        if fill is None:
            return f"nn.Parameter(torch.empty({shape}))"
        return f"nn.Parameter(torch.full(({shape},), {fill}))"

    def buffer(self, name, value):
        return f"self.register_buffer({name!r}, {value})"

    def layer_norm_module(self, dim, eps):
        return f"nn.LayerNorm({dim}, eps={eps})"

    def layer_norm(self, x, dim, weight, bias, eps):
        return f"F.layer_norm({x}, ({dim},), {weight}, {bias}, {eps})"

    def rms_norm(self, x, dim, weight, eps):
        return f"F.rms_norm({x}, ({dim},), {weight}, {eps})"

    def rms_norm_module(self, dim, eps):
        return f"nn.RMSNorm({dim}, eps={eps})"

    def conv2d_module(self, cin, cout, kernel, stride, padding, bias):
        return f"nn.Conv2d({cin}, {cout}, {kernel}, stride={stride}, padding={padding}, bias={bias})"

    def batch_norm_module(self, channels, eps):
        return f"nn.BatchNorm2d({channels}, eps={eps})"

    def batch_norm(self, x, mean, var, weight, bias, eps):
        return f"F.batch_norm({x}, {mean}, {var}, {weight}, {bias}, training=False, eps={eps})"

    def max_pool_module(self, kernel, stride, padding):
        return f"nn.MaxPool2d({kernel}, stride={stride}, padding={padding})"

    def state_dict_loader(self):
        return [
            "def load(model, weights):",
            '    """The converted weights into `model`, every name and shape as the model holds it."""',
            "    tensors = {name: torch.from_numpy(np.ascontiguousarray(values)) for name, values in weights.items()}",
            "    model.load_state_dict({name: values.to(torch.get_default_dtype()) if values.is_floating_point() else"
            " values for name, values in tensors.items()}, strict=True)",
            "    return model",
        ]


class Paddle(Dialect):
    """paddle's spellings."""

    def __init__(self):
        super().__init__("paddle", "paddle", "nn.Layer", "nn.LayerList", True, "axis", False)

    def bool_dtype(self):
        return "'bool'"

    def cat(self, parts, axis):
        return f"paddle.concat({parts}, axis={axis})"

    def swap(self, x, a, b, rank):
        order = list(range(rank))
        a, b = a % rank, b % rank
        order[a], order[b] = order[b], order[a]
        return f"{x}.transpose({order})"

    def permute(self, x, order):
        return f"{x}.transpose({list(order)})"

    def reshape(self, x, shape):
        return f"{x}.reshape({_listed(shape)})"

    def expand(self, x, shape):
        return f"{x}.expand({_listed(shape)})"

    def repeat_interleave(self, x, repeats, axis):
        return f"paddle.repeat_interleave({x}, {repeats}, axis={axis})"

    def matmul_t(self, a, b):
        return f"paddle.matmul({a}, {b}, transpose_y=True)"

    def full(self, shape, value, dtype):
        return f"paddle.full({_listed(shape)}, {value}, dtype={dtype})"

    def ones(self, shape, dtype):
        return f"paddle.ones({_listed(shape)}, dtype={dtype})"

    def zeros(self, shape, dtype):
        return f"paddle.zeros({_listed(shape)}, dtype={dtype})"

    def to(self, x, dtype):
        return f"{x}.astype({dtype})"

    def clamp(self, x, low=None, high=None):
        bounds = ([f"min={low}"] if low is not None else []) + ([f"max={high}"] if high is not None else [])
        return f"paddle.clip({x}, {', '.join(bounds)})"

    def gelu(self, x, tanh):
        return f"F.gelu({x}, approximate=True)" if tanh else f"F.gelu({x})"

    def gelu_module(self, tanh):
        return "nn.GELU(approximate=True)" if tanh else "nn.GELU()"

    def sdpa(self, q, k, v, mask, scale, grouped):
        def bshd(t):
            return f"{t}.transpose([0, 2, 1, 3])"

        return f"F.scaled_dot_product_attention({bshd(q)}, {bshd(k)}, {bshd(v)}, attn_mask={mask}, scale={scale}, " \
               "training=False)"

    def one_hot(self, x, count, dtype):
        return f"F.one_hot({x}, {count}).astype({dtype})"

    def nonzero(self, condition):
        return f"paddle.nonzero({condition}, as_tuple=True)"

    def index_add(self, x, index, values):
        return f"paddle.index_add({x}, {index}, 0, {values})"

    def linear(self, fan_in, fan_out, bias):
        return f"nn.Linear({fan_in}, {fan_out})" if bias else f"nn.Linear({fan_in}, {fan_out}, bias_attr=False)"

    def parameter(self, shape, fill):
        if fill is None:
            return f"self.create_parameter({_listed(shape)})"
        return f"self.create_parameter({_listed(shape)}, default_initializer=nn.initializer.Constant({fill}))"

    def buffer(self, name, value):
        return f"self.register_buffer({name!r}, {value})"

    def layer_norm_module(self, dim, eps):
        return f"nn.LayerNorm({dim}, epsilon={eps})"

    def layer_norm(self, x, dim, weight, bias, eps):
        return f"F.layer_norm({x}, [{dim}], {weight}, {bias}, {eps})"

    def rms_norm(self, x, dim, weight, eps):
        return f"F.rms_norm({x}, [{dim}], {weight}, {eps})[0]"

    def conv2d_module(self, cin, cout, kernel, stride, padding, bias):
        tail = "" if bias else ", bias_attr=False"
        return f"nn.Conv2D({cin}, {cout}, {kernel}, stride={stride}, padding={padding}{tail})"

    def batch_norm_module(self, channels, eps):
        return f"nn.BatchNorm2D({channels}, epsilon={eps})"

    def batch_norm(self, x, mean, var, weight, bias, eps):
        return f"F.batch_norm({x}, {mean}, {var}, {weight}, {bias}, training=False, epsilon={eps})"

    def max_pool_module(self, kernel, stride, padding):
        return f"nn.MaxPool2D({kernel}, stride={stride}, padding={padding})"

    def state_dict_loader(self):
        return [
            "def load(model, weights):",
            '    """The converted weights into `model`, every name and shape as the model holds it."""',
            "    held = {name: tuple(values.shape) for name, values in model.state_dict().items()}",
            "    given = {name: tuple(values.shape) for name, values in weights.items()}",
            "    if held != given:",
            "        raise KeyError(f'the converter gives {sorted(set(given.items()) ^ set(held.items()))} otherwise"
            " than the port holds them')",
            "    model.set_state_dict({name: paddle.to_tensor(values.astype(paddle.get_default_dtype())) for name,"
            " values in weights.items()})",
            "    return model",
        ]


DIALECTS = {"torch": Torch(), "paddle": Paddle()}
