"""PaddlePaddle adapter: wrapped `_C_ops` and Tensor methods see every op, a patched `Layer.__call__` gives paths.

Paddle has no TorchFunctionMode and no global layer hook. What reaches every
dygraph op (checked against Paddle's own C++ API log) is: the forward callables
of `paddle._C_ops` (and `_legacy_C_ops`), the module attributes anywhere in
`sys.modules` that *are* those builtins (`paddle.tensor.matmul`, used by
`nn.MultiHeadAttention`), and the Tensor methods that call C++ directly (the
arithmetic dunders, `__getitem__`/`__setitem__`, `clone`, `copy_`, ...). All of
them are replaced by thin wrappers for the duration of `intercept` only; a
wrapper hands the outermost call to the listener and lets every nested call
(Paddle internals, the listener's own work) go straight to the original.
"""

from __future__ import annotations

import copy
import ctypes
import math
import os
import re
import sys
import types
from _thread import get_ident
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from ..leafref import LeafRef
from .base import (
    API,
    CALLER,
    IN_OUT,
    OUT_IN,
    PLUMBING,
    VALUE_READ_METHODS,
    Adapter,
    CannotUpcast,
    Determinism,
    DeterminismFixes,
    ModulePaths,
    OpListener,
    Reductions,
    ReproSnippets,
    Training,
    WeightConversion,
)


# Paddle's flags that change its numbers, where its build has them (a CPU build lacks the cuDNN ones).
_NUMERICS_FLAGS = (
    "FLAGS_cudnn_deterministic",
    "FLAGS_embedding_deterministic",
    "FLAGS_cudnn_exhaustive_search",
    "FLAGS_use_autotune",
    "FLAGS_gemm_use_half_precision_compute_type",
    "FLAGS_low_precision_op_list",
    "FLAGS_paddle_num_threads",
)


def _version_or_none(found: Any) -> str:
    """A CUDA or cuDNN version as paddle gives it ("False" in a CPU build)."""
    return "none" if found in (False, "False", None, "") else str(found)


def _paddle():
    import paddle

    return paddle


class _State:
    """Shared by all wrappers: who listens, from which thread, and whether a call is in progress."""

    __slots__ = ("depth", "listener", "thread", "paths")

    def __init__(self) -> None:
        self.depth = 0
        self.listener: OpListener | None = None
        self.thread = -1
        self.paths: ModulePaths | None = None


_state = _State()


@contextmanager
def _quiet() -> Iterator[None]:
    """Adapter work that must not be routed to a listener (reading, creating, writing tensors)."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1


def _op_wrapper(name: str, fn: Callable[..., Any], replay: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Routes an outermost call of `fn` to the listener as `name`; `replay` (default `fn`) is what
    the listener calls and keeps: an unbound callable taking the tensor as first argument."""
    state = _state
    target = fn if replay is None else replay

    def wrapper(*args, **kwargs):
        if state.depth or state.thread != get_ident():
            return fn(*args, **kwargs)
        state.depth = 1
        try:
            return state.listener.call(name, target, args, kwargs)
        finally:
            state.depth = 0

    wrapper.__name__ = getattr(fn, "__name__", name.rsplit(".", 1)[-1])
    wrapper.__qualname__ = name
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    wrapper.__wrapped__ = fn
    wrapper._bisectr_original = fn
    return wrapper


def _routed_apply(apply: Any) -> classmethod:
    """`PyLayer.apply` (a C classmethod) routed to the listener as one op named after the layer's
    class: its backward is the class's own, and its forward's ops are inside it."""
    state = _state

    def routed(cls, *args, **kwargs):
        bound = apply.__get__(None, cls)
        if state.depth or state.thread != get_ident():
            return bound(*args, **kwargs)
        state.depth = 1
        try:
            return state.listener.call(f"{cls.__qualname__}.apply", bound, args, kwargs)
        finally:
            state.depth = 0

    return classmethod(routed)


def _layer_call_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    state = _state

    def __call__(self, *args, **kwargs):
        if state.depth or state.thread != get_ident():
            return original(self, *args, **kwargs)
        listener = state.listener
        listener.enter_module(state.paths.path(self))
        try:
            return original(self, *args, **kwargs)
        finally:
            listener.exit_module()

    __call__.__wrapped__ = original
    __call__._bisectr_original = original
    return __call__


# Where an op no user code called gets its source line (see `Adapter.frame_role`), by file relative
# to paddle's directory. Plumbing: `Layer.__call__` and paddle's decorators (argument aliases,
# dygraph-only and in-place checks: `__impl__`, `wrapper`). API: the public functions and Tensor
# methods that pass a call on to its `_C_ops` op (`F.linear`, `paddle.reshape`, `x.matmul`), whose
# caller is the line to show: `nn.Linear.forward`'s `F.linear(...)`, not `_C_ops.linear(...)`.
_PLUMBING_FILES = frozenset(
    {"utils/decorator_utils.py", "base/wrapped_decorator.py", "utils/inplace_utils.py", "utils/deprecated.py"}
)
_PLUMBING_FUNCTIONS = {
    "nn/layer/layers.py": frozenset({"__call__", "_dygraph_call_func"}),
    "base/framework.py": frozenset({"__impl__"}),
    "base/dygraph/base.py": frozenset({"__impl__"}),
}
_API_PREFIXES = ("tensor/", "nn/functional/", "incubate/nn/functional/", "base/dygraph/")

# `_C_ops` names that are not forward ops of a model: gradients and backward passes.
_BACKWARD = re.compile(r"(^|_)(grad|double_grad|triple_grad|backward)(_|$)")

# C-level Tensor methods (method descriptors) that compute without going through `_C_ops`.
_TENSOR_C_METHODS = (
    "__add__",
    "__radd__",
    "__sub__",
    "__rsub__",
    "__mul__",
    "__rmul__",
    "__div__",
    "__rdiv__",
    "__truediv__",
    "__rtruediv__",
    "__floordiv__",
    "__rfloordiv__",
    "__mod__",
    "__rmod__",
    "__matmul__",
    "__rmatmul__",
    "__pow__",
    "__rpow__",
    "__eq__",
    "__ne__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "clone",
    "contiguous",
    "copy_",
    "detach",
    "detach_",
    "_copy_to",
    # New Tensor objects over an existing tensor's data (`adaptive_avg_pool2d` runs
    # `x._use_gpudnn(False)`). Unrecorded, the next op reads an unknown tensor: a leaf that
    # holds the recorded values, so replays and patches before it do not reach that op.
    "_tensor_use_gpudnn",
    "_new_shared_tensor",
)
# Python-level Tensor methods recorded under their own name, as torch names them: their inner
# call is a C++ method (`x[i]`, `x.cpu()`) or another op (`-x` is `scale`, `~x` is `bitwise_not`).
_TENSOR_PY_METHODS = (
    "__getitem__",
    "__setitem__",
    "__neg__",
    "__pos__",
    "__abs__",
    "__invert__",
    "__and__",
    "__rand__",
    "__or__",
    "__ror__",
    "__xor__",
    "__rxor__",
    "__lshift__",
    "__rlshift__",
    "__rshift__",
    "__rrshift__",
    "to",
    "cpu",
    "cuda",
)


class _Patches:
    """What `intercept` replaces. Wrappers are made once per original object and reused."""

    def __init__(self, paddle: Any):
        self.paddle = paddle
        self._wrappers: dict[int, tuple[Any, Callable[..., Any]]] = {}  # id(original) -> (original, wrapper)
        self.op_tables = [
            (
                prefix,
                table,
                [
                    attr
                    for attr, fn in vars(table).items()
                    if not attr.startswith("_")
                    and not _BACKWARD.search(attr)
                    and isinstance(fn, types.BuiltinFunctionType)
                ],
            )
            for prefix, table in (("_C_ops", paddle._C_ops), ("_legacy_C_ops", paddle._legacy_C_ops))
        ]
        self._bindings: list[tuple[Any, str, Any, Any]] = []
        self._bindings_key = -1

    def _wrapper(self, name: str, original: Any, replay: Callable[..., Any] | None = None) -> Callable[..., Any]:
        entry = self._wrappers.get(id(original))
        if entry is None or entry[0] is not original:
            entry = self._wrappers[id(original)] = (original, _op_wrapper(name, original, replay))
        return entry[1]

    def plan(self) -> list[tuple[Any, str, Any, Any]]:
        """(owner, attribute, current value, replacement) of everything to replace now."""
        paddle = self.paddle
        plan: list[tuple[Any, str, Any, Any]] = []
        builtins: dict[int, tuple[Any, Callable[..., Any]]] = {}
        for prefix, table, names in self.op_tables:
            namespace = vars(table)
            for attr in names:
                fn = namespace.get(attr)
                if isinstance(fn, types.BuiltinFunctionType):
                    replay = _zero_unwritten_stats(fn) if prefix == "_C_ops" and attr in _BATCH_NORMS else None
                    wrapper = self._wrapper(f"{prefix}.{attr}", fn, replay)
                    builtins.setdefault(id(fn), (fn, wrapper))
                    plan.append((table, attr, fn, wrapper))
        if self._bindings_key != len(sys.modules):  # rescan only when modules were imported
            self._bindings = self._module_bindings(builtins, {id(table) for _, table, _ in self.op_tables})
            self._bindings_key = len(sys.modules)
        plan += [entry for entry in self._bindings if getattr(entry[0], entry[1], None) is entry[2]]
        tensor = paddle.Tensor
        for attr in (
            _TENSOR_C_METHODS + _TENSOR_PY_METHODS + VALUE_READ_METHODS
        ):  # value reads: for the recorder's count
            original = tensor.__dict__.get(attr)
            if original is not None:
                replay = _copy_and_bump(original) if attr == "copy_" else None
                plan.append((tensor, attr, original, self._wrapper(f"Tensor.{attr}", original, replay)))
        layer_call = paddle.nn.Layer.__dict__["__call__"]
        entry = self._wrappers.get(id(layer_call))
        if entry is None or entry[0] is not layer_call:
            entry = self._wrappers[id(layer_call)] = (layer_call, _layer_call_wrapper(layer_call))
        plan.append((paddle.nn.Layer, "__call__", layer_call, entry[1]))
        return plan

    @staticmethod
    def _module_bindings(builtins: dict[int, tuple[Any, Any]], tables: set[int]) -> list[tuple[Any, str, Any, Any]]:
        """Module attributes, anywhere, that are raw op builtins (`from paddle._C_ops import matmul`
        style bindings, e.g. `paddle.tensor.matmul`). Paddle's own op tables are left alone."""
        found = []
        ids = frozenset(builtins)
        for name, module in list(sys.modules.items()):
            if (
                not isinstance(module, types.ModuleType)
                or id(module) in tables
                or name.startswith(("paddle._pir_ops", "paddle.base.libpaddle"))
            ):
                continue
            try:
                namespace = vars(module)
                if ids.isdisjoint(map(id, list(namespace.values()))):  # C-speed pre-check
                    continue
                items = list(namespace.items())
            except Exception:  # noqa: BLE001 - exotic module objects
                continue
            for attr, value in items:
                entry = builtins.get(id(value))
                if entry is not None and entry[0] is value:
                    found.append((module, attr, value, entry[1]))
        return found


def _copy_and_bump(copy_: Callable[..., Any]) -> Callable[..., Any]:
    """`Tensor.copy_` writes in place without bumping the inplace version, and returns a second
    Python object for the same storage; bump the version and return `self`, as torch does."""

    def copy_and_bump(self, *args, **kwargs):
        copy_(self, *args, **kwargs)
        self._bump_inplace_version()
        return self

    copy_and_bump.__name__ = "copy_"
    copy_and_bump.__qualname__ = "Tensor.copy_"
    return copy_and_bump


# Batch norms that take (x, mean, variance, scale, bias, is_test, momentum, epsilon,
# data_format, use_global_stats, trainable_statistics) and return (out, mean_out,
# variance_out, saved_mean, saved_variance, reserve_space).
_BATCH_NORMS = frozenset({"batch_norm", "batch_norm_", "sync_batch_norm_"})


def _zero_unwritten_stats(batch_norm: Callable[..., Any]) -> Callable[..., Any]:
    """With global statistics (eval mode), the kernel leaves `saved_mean` and `saved_variance`
    unwritten: uninitialised memory, other values on every call, that no re-run or replay could
    reproduce. Nothing reads them then; zeros stand in for them (new tensors: the op's backward
    keeps the originals, which a write in place would invalidate)."""
    paddle = _paddle()

    def batch_norm_with_defined_outputs(*args, **kwargs):
        outputs = batch_norm(*args, **kwargs)
        if len(args) == 11 and not kwargs and len(outputs) == 6:
            is_test, use_global_stats, trainable_statistics = args[5], args[9], args[10]
            if use_global_stats or (is_test and not trainable_statistics):
                outputs = (*outputs[:3], *(paddle.zeros_like(saved) for saved in outputs[3:5]), outputs[5])
        return outputs

    batch_norm_with_defined_outputs.__name__ = getattr(batch_norm, "__name__", "batch_norm")
    return batch_norm_with_defined_outputs


_patches: _Patches | None = None


# This framework's op names (or their last dotted part) -> the shared vocabulary (`bisectr.capture.ops`).
_OP_SYNONYMS = {
    "linear_v2": "linear",
    "fused_linear": "linear",
    "multiply": "mul",
    "subtract": "sub",
    "divide": "div",
    "truediv": "div",
    "floordiv": "floor_divide",
    "elementwise_add": "add",
    "elementwise_sub": "sub",
    "elementwise_mul": "mul",
    "elementwise_div": "div",
    "elementwise_pow": "pow",
    "negative": "neg",
    "slice": "getitem",
    "strided_slice": "getitem",
    "set_value": "setitem",
    "set_value_with_tensor": "setitem",
    "t": "transpose",
    "reshape_": "reshape",
    "flatten": "reshape",
    "squeeze": "reshape",
    "unsqueeze": "reshape",
    "astype": "cast",
    "bfloat16": "cast",
    "assign": "copy",
    "tensor_use_gpudnn": "copy",
    "new_shared_tensor": "copy",
    "masked_fill": "where",
    "lookup_table_v2": "embedding",
    "softmax_": "softmax",
    "chunk": "split",
    "split_with_num": "split",
    "unbind": "split",
    "concat": "cat",
    "concatenate": "cat",
    "greater_than": "gt",
    "less_than": "lt",
    "greater_equal": "ge",
    "less_equal": "le",
    "not_equal": "ne",
    "expand_as": "expand",
    "broadcast_to": "expand",
    "full_like": "full",
    "fill_constant": "full",
    "reduce_mean": "mean",
    "reduce_sum": "sum",
    "mod": "remainder",
    "floor_mod": "remainder",
    "tile": "repeat",
    "clip": "clamp",
    "p_norm": "norm",
    "swish": "silu",
    "scale": "mul",
    "flash_attn": "attention",
    "flash_attn_unpadded": "attention",
    "flashmask_attention": "attention",
    "memory_efficient_attention": "attention",
    "take_along_axis": "gather",
    "put_along_axis": "scatter",
    "unstack": "split",
    "view_shape": "reshape",
    "tensor_unfold": "unfold",
    "nearest_interp": "interpolate",
    "bilinear_interp": "interpolate",
    "linear_interp": "interpolate",
    "trilinear_interp": "interpolate",
    "bicubic_interp": "interpolate",
    "pad3d": "pad",
    "conv2d_transpose": "conv_transpose2d",
    "conv3d_transpose": "conv_transpose3d",
    "depthwise_conv2d": "conv2d",
    "cross_entropy_with_softmax": "cross_entropy",
    "softmax_with_cross_entropy": "cross_entropy",
    "sigmoid_cross_entropy_with_logits": "binary_cross_entropy_with_logits",
    "bce_loss": "binary_cross_entropy",
    "kldiv_loss": "kl_div",
    "range_v2": "arange",
    "reverse": "flip",
    "rint": "round",
    "as_complex": "view_as_complex",
    "as_real": "view_as_real",
    "zeros": "full",
    "ones": "full",
    "zeros_like": "full",
    "ones_like": "full",
    "full_with_tensor": "full",
    "full_batch_size_like": "full",
    "assign_out": "copy",
    "increment": "add",
    "add_n": "add",
    "fc": "linear",
    "mean_all": "mean",
    "max_with_index": "max",
    "min_with_index": "min",
    "copy_to": "cast",
    "invert": "bitwise_not",
    "and": "bitwise_and",
    "or": "bitwise_or",
    "xor": "bitwise_xor",
    "matmul_v2": "matmul",
    "reshape2": "reshape",
    "transpose2": "transpose",
    "unsqueeze2": "reshape",
    "squeeze2": "reshape",
    "flatten_contiguous_range": "reshape",
    "expand_v2": "expand",
    "top_k_v2": "topk",
    "max_pool2d": "max_pool",
    "avg_pool2d": "pool2d",
    "adaptive_avg_pool2d": "pool2d",
}


_BATCH_NORM_LAYERS = ("BatchNorm", "BatchNorm1D", "BatchNorm2D", "BatchNorm3D", "SyncBatchNorm")


class PaddleAdapter(Adapter, Training, WeightConversion, Determinism):
    name = "paddle"
    module_kind = "paddle.nn.Layer"
    repro = ReproSnippets(
        "import paddle",
        "paddle.to_tensor(a.astype('float32') if dtype == 'bfloat16' else a, dtype=dtype)",
        "t.astype('float64').numpy()",
        "setattr(t, 'stop_gradient', False)",
        "paddle.grad(outputs, inputs, upstream, allow_unused=True)",
    )
    linear_layout = IN_OUT
    library_linears = {("paddleformers", "LMHead"): OUT_IN}  # (vocab, hidden), as Hugging Face's lm_head
    norm_statistics = {"_mean": "mean", "_variance": "variance"}
    import_warnings = ("No ccache found",)
    op_synonyms = _OP_SYNONYMS
    tensor_class = ("paddle", "Tensor")
    fixes = DeterminismFixes(
        seed="seed it where the forward draws it: paddle.seed(0) before the call",
        zeros="create the tensor with paddle.zeros (zeros_like) instead of paddle.empty, or write all of it "
        "before it is read",
        kernel="paddle.set_flags({'FLAGS_cudnn_deterministic': True, 'FLAGS_embedding_deterministic': 1})",
    )

    def to_numpy(self, tensor: Any) -> np.ndarray:
        paddle = _paddle()
        _state.depth += 1
        try:
            if tensor.dtype == paddle.bfloat16:
                tensor = paddle._C_ops.cast(tensor, paddle.float32)
            return tensor.numpy()  # a host copy (measured faster in a trace than a DLPack copy)
        finally:
            _state.depth -= 1

    def unreadable(self, tensor: Any) -> str | None:
        return "a distributed paddle Tensor (auto parallel)" if tensor.is_dist() else None

    def on_host(self, tensor: Any) -> bool:
        # An uninitialised tensor (an RNN's unused dropout state) holds no memory anywhere: numpy reads it as empty.
        return tensor.place.is_cpu_place() or not tensor._is_initialized()

    def reductions(self, tensor: Any, positions: np.ndarray) -> Reductions:
        paddle = _paddle()
        with _quiet():
            flat = tensor.detach().reshape([-1])
            complex_values = flat.is_complex()
            wide = (paddle.abs(flat) if complex_values else flat).astype("float64")
            picked = paddle.gather(
                paddle.real(flat).astype("float64") if complex_values else wide,
                paddle.to_tensor(positions, place=flat.place),
            )
            finite = paddle.isfinite(wide)
            clean = paddle.where(finite, wide, paddle.zeros_like(wide))
            sums = paddle.stack(
                [
                    paddle.where(finite, wide, paddle.full_like(wide, math.inf)).min(),
                    paddle.where(finite, wide, paddle.full_like(wide, -math.inf)).max(),
                    clean.sum(),
                    paddle.dot(clean, clean),
                    finite.astype("float64").sum(),
                    paddle.isnan(wide).astype("float64").sum(),
                ]
            )
            numbers = paddle.concat([sums, picked]).tolist()
        low, high, total, squares, finite_count, nan_count = numbers[:6]
        return Reductions(
            low,
            high,
            total,
            squares,
            int(finite_count),
            int(nan_count),
            flat.size - int(finite_count) - int(nan_count),
            numbers[6:],
        )

    def from_numpy(self, values: np.ndarray, dtype: str, device: str, layout: Any = None) -> Any:
        paddle = _paddle()
        with _quiet():  # `to_tensor` copies
            return paddle.to_tensor(np.asarray(values), dtype=dtype, place=device)

    def dtype_name(self, tensor: Any) -> str:
        return str(tensor.dtype).removeprefix("paddle.")

    def device_name(self, tensor: Any) -> str:
        place = str(tensor.place)  # "Place(cpu)", "Place(gpu:0)"
        return place[6:-1] if place.startswith("Place(") else place

    def version(self, tensor: Any) -> int:
        return tensor._inplace_version()

    def assign(self, tensor: Any, values: np.ndarray) -> None:
        source = self.like(tensor, values)
        paddle = _paddle()
        with _quiet(), paddle.no_grad():
            tensor.copy_(source, True)
            tensor._bump_inplace_version()

    def named_leaves(self, model: Any) -> Iterator[tuple[str, Any]]:
        paddle = _paddle()
        if isinstance(model, paddle.nn.Layer):
            for name, tensor in model.named_parameters():
                yield str(LeafRef("param", name)), tensor
            for name, tensor in model.named_buffers():
                if tensor is not None:
                    yield str(LeafRef("buffer", name)), tensor

    def is_module(self, obj: Any) -> bool:
        paddle = sys.modules.get("paddle")
        return paddle is not None and isinstance(obj, paddle.nn.Layer)

    def named_modules(self, root: Any) -> Iterator[tuple[str, Any]]:
        return root.named_sublayers(include_self=True, remove_duplicate=False)

    def linear_class(self) -> type:
        return _paddle().nn.Linear

    def batch_norm_classes(self) -> tuple[type, ...]:
        return tuple(getattr(_paddle().nn, name) for name in _BATCH_NORM_LAYERS)

    def float64_model(self, model: Any) -> Any:
        paddle = _paddle()
        if not isinstance(model, paddle.nn.Layer):
            raise CannotUpcast("it is a plain function, whose tensors bisectr cannot reach")
        upcast = copy.deepcopy(model)
        upcast.to(dtype="float64")
        return upcast

    def float64_tensor(self, tensor: Any, into: Any = None) -> Any:
        # paddle casts only into new tensors: numpy casts into host memory both share (not bfloat16's)
        if into is None or not tensor.place.is_cpu_place() or self.dtype_name(tensor) == "bfloat16":
            return tensor.detach().astype("float64")
        np.copyto(_float64_memory(into), np.from_dlpack(tensor.detach()))
        return into

    def cast(self, tensor: Any, dtype: str) -> Any:
        return tensor.astype(dtype)

    def data_address(self, tensor: Any) -> int:
        return tensor.data_ptr()

    def narrowing_dtypes(self) -> tuple[tuple[Any, ...], Any]:
        # Every cast and dtype argument reaches `_C_ops` as a DataType (`astype("float32")` included).
        paddle = _paddle()
        return (paddle.float32, paddle.float16, paddle.bfloat16), paddle.float64

    @contextmanager
    def float64_defaults(self) -> Iterator[None]:
        paddle = _paddle()
        default = paddle.get_default_dtype()
        paddle.set_default_dtype("float64")
        try:
            yield
        finally:
            paddle.set_default_dtype(default)

    def copy_model(self, model: Any) -> Any:
        if not isinstance(model, _paddle().nn.Layer):
            raise CannotUpcast("it is a plain function, whose parameters bisectr cannot reach")
        return copy.deepcopy(model)

    def clear_gradients(self, optimizer: Any) -> None:
        optimizer.clear_grad()

    def optimizer_moments(self, optimizer: Any, parameter: Any) -> dict[str, np.ndarray]:
        accumulators = getattr(optimizer, "_accumulators", {})
        return {
            name: self.to_numpy(accumulators[name][parameter.name])
            for name in ("moment1", "moment2")
            if parameter.name in accumulators.get(name, {})
        }

    def learning_rate(self, optimizer: Any) -> float:
        return float(optimizer.get_lr())

    def optimizer_settings(self, optimizer: Any) -> dict[str, Any]:
        decay, kind = 0.0, None
        if type(optimizer).__name__ == "AdamW" and isinstance(getattr(optimizer, "_weight_decay", None), (int, float)):
            decay, kind = float(optimizer._weight_decay), "decoupled"
        elif (
            getattr(optimizer, "regularization", None) is not None
        ):  # Adam(weight_decay=...): an L2 term in the gradient
            decay, kind = float(getattr(optimizer.regularization, "_coeff", 0.0)), "coupled (L2)"
        clip = getattr(optimizer, "_grad_clip", None)

        def number(value: Any) -> float | None:
            return None if value is None else float(value)

        return {
            "optimizer": type(optimizer).__name__,
            "epsilon": number(getattr(optimizer, "_epsilon", None)),
            "beta1": number(getattr(optimizer, "_beta1", None)),
            "beta2": number(getattr(optimizer, "_beta2", None)),
            "weight_decay": decay,
            "weight_decay_kind": kind if decay else None,
            "amsgrad": bool(getattr(optimizer, "_amsgrad", False)),
            "gradient_clipping": None if clip is None else f"{type(clip).__name__}({getattr(clip, 'clip_norm', '')})",
        }

    def weight_decays(self, optimizer: Any, parameters: dict[str, Any]) -> dict[str, float]:
        default = self.optimizer_settings(optimizer)["weight_decay"]
        groups = getattr(optimizer, "_param_groups", None) or []
        decay = {}
        for group in groups:
            if isinstance(group, dict):  # a parameter group: its own coefficient, where it names one
                coefficient = group.get("weight_decay", default)
                coefficient = float(getattr(coefficient, "_coeff", coefficient) or 0.0)
                decay.update((id(p), coefficient) for p in group["params"])
            else:
                decay[id(group)] = default
        exempt = getattr(optimizer, "_apply_decay_param_fun", None)  # AdamW(apply_decay_param_fun=...)
        return {
            name: 0.0 if exempt is not None and not exempt(tensor.name) else decay.get(id(tensor), default)
            for name, tensor in parameters.items()
        }

    def numerics_settings(self) -> dict[str, str]:
        paddle = _paddle()
        core = paddle.base.core
        flags = [name for name in _NUMERICS_FLAGS if core.globals().is_public(name)]
        device = paddle.device.get_device().split(":")[0].replace("gpu", "cuda")
        settings = {
            "paddle": paddle.__version__,
            "paddle cuda": _version_or_none(paddle.version.cuda()),
            "paddle cudnn": _version_or_none(paddle.version.cudnn()),
            "tf32 matmul": "on" if core.get_cublas_switch() else "off",
            "autocast": f"{device} {paddle.amp.get_autocast_dtype()}" if paddle.amp.is_autocast_enabled() else "off",
            "default dtype": paddle.get_default_dtype(),
        }
        settings.update((name, str(value)) for name, value in paddle.get_flags(flags).items())
        settings["paddle threads"] = settings.pop("FLAGS_paddle_num_threads", "unknown")
        return settings

    def seed(self, seed: int) -> None:
        _paddle().seed(seed)

    def no_grad(self) -> Any:
        return _paddle().no_grad()

    def enable_grad(self) -> Any:
        return _paddle().enable_grad()

    def requires_grad(self, tensor: Any) -> bool:
        return not tensor.stop_gradient

    def gradient_leaf(self, tensor: Any) -> Any:
        with _quiet():
            leaf = tensor.detach()
        leaf.stop_gradient = False
        return leaf

    def add_gradient_hook(self, tensor: Any, hook: Callable[[Any], Any]) -> None:
        tensor.register_hook(hook)

    def gradients(self, outputs: list[Any], upstream: list[Any], inputs: list[Any]) -> list[Any | None]:
        with _quiet():
            return list(_paddle().grad(outputs, inputs, upstream, allow_unused=True))

    def internal_paths(self) -> tuple[str, ...]:
        return (os.path.dirname(_paddle().__file__) + os.sep,)

    def frame_role(self, filename: str, function: str) -> int:
        relative = self._relative(filename)
        if relative in _PLUMBING_FILES or function in _PLUMBING_FUNCTIONS.get(relative, ()):
            return PLUMBING
        return API if relative.startswith(_API_PREFIXES) else CALLER

    @contextmanager
    def intercept(self, model: Any, listener: OpListener, gradients: bool = False) -> Iterator[None]:
        global _patches
        paddle = _paddle()
        if _state.listener is not None:
            raise RuntimeError("bisectr: a paddle forward is already being intercepted")
        if _patches is None:
            _patches = _Patches(paddle)
        paths = ModulePaths(
            lambda root: root.named_sublayers(include_self=True),
            model if isinstance(model, paddle.nn.Layer) else None,
            getattr(listener, "adopt_root", None),
        )
        installed: list[tuple[Any, str, Any]] = []
        try:
            for owner, attr, original, replacement in _patches.plan():
                setattr(owner, attr, replacement)
                installed.append((owner, attr, original))
            py_layer = paddle.autograd.PyLayer
            py_layer.apply = _routed_apply(py_layer.__mro__[1].__dict__["apply"])
            _state.paths = paths
            _state.listener = listener
            _state.depth = 0
            _state.thread = get_ident()
            with paddle.enable_grad() if gradients else paddle.no_grad():
                yield
        finally:
            _state.thread = -1
            _state.listener = None
            _state.paths = None
            if "apply" in vars(paddle.autograd.PyLayer):  # the C base class's apply shows through again
                del paddle.autograd.PyLayer.apply
            for owner, attr, original in reversed(installed):
                setattr(owner, attr, original)


def _float64_memory(tensor: Any) -> np.ndarray:
    """A writable numpy array over a float64 host tensor's memory (numpy before 2.0 makes DLPack
    arrays read-only)."""
    size = math.prod(tensor.shape)
    memory = (ctypes.c_double * size).from_address(tensor.data_ptr())
    return np.frombuffer(memory, np.float64, size).reshape(tensor.shape)


def patch_counts() -> dict[str, int]:
    """How many objects `intercept` replaces, by kind (for tests and reports)."""
    paddle = _paddle()
    kinds = {
        id(paddle._C_ops): "_C_ops",
        id(paddle._legacy_C_ops): "_legacy_C_ops",
        id(paddle.Tensor): "Tensor",
        id(paddle.nn.Layer): "Layer",
    }
    counts: dict[str, int] = {}
    for owner, *_ in (_patches or _Patches(paddle)).plan():
        kind = kinds.get(id(owner), "module_bindings")
        counts[kind] = counts.get(kind, 0) + 1
    return counts
