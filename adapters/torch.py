"""PyTorch adapter: `TorchFunctionMode` sees every API call, global module hooks give paths."""

from __future__ import annotations

import copy
import functools
import itertools
import math
import os
import sys
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ..leafref import LeafRef
from .base import (
    API,
    CALLER,
    COMPILED_OP,
    IN_OUT,
    OUT_IN,
    PLUMBING,
    TENSOR_VALUE_READS,
    Adapter,
    CannotUpcast,
    CompiledGraphs,
    CompiledProbe,
    Determinism,
    DeterminismFixes,
    ModulePaths,
    OpListener,
    Reductions,
    ReproSnippets,
    Training,
    WeightConversion,
)


# Tensor methods that cast to a floating dtype below float64.
_NARROWING_METHODS = frozenset({"Tensor.float", "Tensor.half", "Tensor.bfloat16"})


def _torch():
    import torch

    return torch


def _loaded_class(module: str, name: str) -> type | None:
    """A class of torch's, once the model has imported its module (never imported here)."""
    return getattr(sys.modules.get(module), name, None)


def _fully_sharded_modules(model: Any) -> Iterator[Any]:
    """The modules of `model` FSDP2's `fully_shard` wrapped (none where the model never imported FSDP2)."""
    fully_sharded = _loaded_class("torch.distributed.fsdp", "FSDPModule")
    if fully_sharded is not None and isinstance(model, _torch().nn.Module):
        yield from (module for module in model.modules() if isinstance(module, fully_sharded))


def _is_dtensor(tensor: Any) -> bool:
    dtensor = _loaded_class("torch.distributed.tensor", "DTensor")
    return dtensor is not None and isinstance(tensor, dtensor)


def _is_pending_collective(tensor: Any) -> bool:
    pending = _loaded_class("torch.distributed._functional_collectives", "AsyncCollectiveTensor")
    return pending is not None and isinstance(tensor, pending)


def _whole(tensor: Any) -> Any:
    """The tensor's global values in one plain tensor: a DTensor's shards gathered (and partial values
    reduced) on every rank, a collective every rank runs at the same op; a collective's pending
    result waited for."""
    if _is_dtensor(tensor):
        # Reducing a masked partial sum (a vocabulary-parallel embedding's output) drops its mask,
        # which the model's own reduction still needs.
        masks = [
            (p.mask_buffer, p.mask_buffer.refcount, p.mask_buffer.data)
            for p in tensor.placements
            if hasattr(p, "mask_buffer")
        ]
        whole = tensor.detach().full_tensor()
        for mask, refcount, data in masks:
            mask.refcount, mask.data = refcount, data
        return whole
    if _is_pending_collective(tensor):
        return tensor.wait()
    return tensor


# Where an op no user code called gets its source line (see `Adapter.frame_role`), by file relative
# to torch's directory. Plumbing: `__torch_function__` dispatch, decorators, the module call
# machinery. API: the Python bodies of the ops the mode records (`F.relu` runs until it hands itself
# to `handle_torch_function`), whose caller is the line to show: `_ff_block`'s, not `relu`'s.
_PLUMBING_FILES = frozenset(
    {"overrides.py", "_jit_internal.py", "_compile.py", "utils/_contextlib.py", "utils/_device.py"}
)
_PLUMBING_PREFIXES = ("_dynamo/",)
_PLUMBING_FUNCTIONS = {"nn/modules/module.py": frozenset({"__call__", "_call_impl", "_wrapped_call_impl", "inner"})}
_API_FILES = frozenset({"nn/functional.py", "functional.py", "_tensor.py"})


# This framework's op names (or their last dotted part) -> the shared vocabulary (`bisectr.capture.ops`).
# Average pools go by paddle's name, `pool2d`: paddle runs them all as one op.
_OP_SYNONYMS = {
    "mm": "matmul",
    "bmm": "matmul",
    "multiply": "mul",
    "subtract": "sub",
    "divide": "div",
    "truediv": "div",
    "true_divide": "div",
    "floordiv": "floor_divide",
    "negative": "neg",
    "permute": "transpose",
    "swapaxes": "transpose",
    "T": "transpose",
    "mT": "transpose",
    "t": "transpose",
    "view": "reshape",
    "flatten": "reshape",
    "squeeze": "reshape",
    "unsqueeze": "reshape",
    "to": "cast",
    "type_as": "cast",
    "type": "cast",
    "float": "cast",
    "half": "cast",
    "bfloat16": "cast",
    "double": "cast",
    "long": "cast",
    "int": "cast",
    "bool": "cast",
    "clone": "copy",
    "contiguous": "copy",
    "detach": "copy",
    "masked_fill": "where",
    "scaled_dot_product_attention": "attention",
    "multi_head_attention_forward": "attention",
    "chunk": "split",
    "unbind": "split",
    "concatenate": "cat",
    "greater_equal": "ge",
    "less_equal": "le",
    "not_equal": "ne",
    "expand_as": "expand",
    "broadcast_to": "expand",
    "full_like": "full",
    "mod": "remainder",
    "tile": "repeat",
    "clip": "clamp",
    "vector_norm": "norm",
    "zeros": "full",
    "ones": "full",
    "zeros_like": "full",
    "ones_like": "full",
    "invert": "bitwise_not",
    "and": "bitwise_and",
    "or": "bitwise_or",
    "xor": "bitwise_xor",
    "max_pool2d": "max_pool",
    "avg_pool2d": "pool2d",
    "adaptive_avg_pool2d": "pool2d",
    # A DTensor's own plumbing, which leaves its global values as they are: its shards taken out or
    # wrapped, moved between placements (autograd functions go by their class names).
    "to_local": "copy",
    "from_local": "copy",
    "redistribute": "copy",
    "full_tensor": "copy",
    "_FromTorchTensor": "copy",
    "_ToTorchTensor": "copy",
    "Redistribute": "copy",
}


_BATCH_NORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm")


class TorchAdapter(Adapter, CompiledGraphs, Training, WeightConversion, Determinism):
    name = "torch"
    op_synonyms = _OP_SYNONYMS
    module_kind = "torch.nn.Module"
    repro = ReproSnippets(
        "import torch",
        "torch.from_numpy(a).to(getattr(torch, dtype))",
        "t.detach().to(torch.float64).cpu().numpy()",
        "t.requires_grad_(True)",
        "torch.autograd.grad(outputs, inputs, upstream, allow_unused=True)",
    )
    linear_layout = OUT_IN
    library_linears = {("transformers", "Conv1D"): IN_OUT}  # Hugging Face GPT-2's
    norm_statistics = {"running_mean": "mean", "running_var": "variance", "num_batches_tracked": "count"}
    tensor_class = ("torch", "Tensor")
    value_reads = TENSOR_VALUE_READS | {"equal", "allclose"}
    fixes = DeterminismFixes(
        seed="seed it where the forward draws it: torch.manual_seed(0) before the call, or a generator of its own "
        "(generator=torch.Generator().manual_seed(0))",
        zeros="create the tensor with torch.zeros (zeros_like, new_zeros) instead of torch.empty, or write all of "
        "it before it is read",
        kernel="torch.use_deterministic_algorithms(True) with CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment "
        "(and torch.backends.cudnn.deterministic = True)",
    )

    def is_tensor(self, obj: Any) -> bool:
        # A meta tensor has a shape and no values (`torch.empty(shape, device="meta").stride()` asks a
        # layout): structure, as a shape is.
        return super().is_tensor(obj) and not obj.is_meta

    def to_numpy(self, tensor: Any) -> np.ndarray:
        whole = _whole(tensor)
        try:  # the usual op output: on the CPU, no grad, a dtype numpy has (runs on every recorded tensor)
            return whole.numpy()
        except (RuntimeError, TypeError):
            pass
        torch = _torch()
        tensor = whole.detach()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        if tensor.is_conj():
            tensor = tensor.resolve_conj()
        return tensor.cpu().numpy()

    def unreadable(self, tensor: Any) -> str | None:
        kind = type(tensor)
        if (
            kind.__torch_dispatch__ is _torch().Tensor.__torch_dispatch__
        ):  # plain tensors, parameters, subclasses of theirs
            return None
        if _is_dtensor(tensor) or _is_pending_collective(tensor):
            return None
        return f"{kind.__module__}.{kind.__qualname__} (a tensor subclass)"

    def on_host(self, tensor: Any) -> bool:
        return tensor.is_cpu

    def reductions(self, tensor: Any, positions: np.ndarray) -> Reductions:
        torch = _torch()
        flat = _whole(tensor).detach().reshape(-1)
        wide = (flat.abs() if flat.is_complex() else flat).double()
        picked = (flat.real.double() if flat.is_complex() else wide)[torch.as_tensor(positions, device=flat.device)]
        finite = torch.isfinite(wide)
        clean = torch.where(finite, wide, 0.0)
        sums = torch.stack(
            [
                torch.where(finite, wide, math.inf).amin(),
                torch.where(finite, wide, -math.inf).amax(),
                clean.sum(),
                clean.dot(clean),
                finite.sum().double(),
                torch.isnan(wide).sum().double(),
            ]
        )
        numbers = torch.cat([sums, picked]).tolist()
        low, high, total, squares, finite_count, nan_count = numbers[:6]
        return Reductions(
            low,
            high,
            total,
            squares,
            int(finite_count),
            int(nan_count),
            flat.numel() - int(finite_count) - int(nan_count),
            numbers[6:],
        )

    def from_numpy(self, values: np.ndarray, dtype: str, device: str, layout: Any = None) -> Any:
        torch = _torch()
        tensor = torch.from_numpy(np.array(values, copy=True)).to(device=device, dtype=getattr(torch, dtype))
        return tensor if layout is None else _distributed(tensor, layout)

    def hold_whole(self, model: Any) -> None:
        for module in _fully_sharded_modules(model):
            module.set_reshard_after_forward(False, recurse=False)
            module.set_reshard_after_backward(False, recurse=False)
            module.unshard()

    def full_precision(self, model: Any) -> None:
        for module in _fully_sharded_modules(model):
            from torch.distributed.fsdp import MixedPrecisionPolicy

            state = module._get_fsdp_state()
            state._mp_policy = MixedPrecisionPolicy()
            group = state._fsdp_param_group
            if group is not None:
                group.mp_policy = MixedPrecisionPolicy()
                for parameter in group.fsdp_params:
                    parameter.mp_policy = group.mp_policy

    def layout(self, tensor: Any) -> Any:
        if not _is_dtensor(tensor):
            return None
        partial = any(placement.is_partial() for placement in tensor.placements)
        return _Placement(tensor.device_mesh, tuple(tensor.placements), tensor.detach() if partial else None)

    def placement(self, tensor: Any) -> str | None:
        return ", ".join(map(repr, tensor.placements)) if _is_dtensor(tensor) else None

    def sharded(self, tensor: Any) -> bool:
        return _is_dtensor(tensor) and any(placement.is_shard() for placement in tensor.placements)

    def replicated(self, tensor: Any) -> bool:
        return _is_dtensor(tensor) and all(placement.is_replicate() for placement in tensor.placements)

    def reduced_over_ranks(self, tensor: Any, how: str) -> Any:
        if not _is_dtensor(tensor):
            return tensor
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        mesh, local = tensor.device_mesh, tensor.to_local().clone()
        for dim in range(mesh.ndim):
            dist.all_reduce(local, group=mesh.get_group(dim))
        if how == "mean":
            local /= mesh.size()
        return DTensor.from_local(local, mesh, tensor.placements, run_check=False)

    def shared_numpy(self, tensor: Any) -> np.ndarray:
        distributed = sys.modules.get("torch.distributed")
        if (
            _is_dtensor(tensor)
            or distributed is None
            or not distributed.is_initialized()
            or distributed.get_world_size() == 1
        ):
            return self.to_numpy(tensor)
        first = _whole(tensor).detach().clone()
        distributed.broadcast(first, src=0)
        return self.to_numpy(first)

    def dtype_name(self, tensor: Any) -> str:
        return str(tensor.dtype).removeprefix("torch.")

    def device_name(self, tensor: Any) -> str:
        return str(tensor.device)

    def version(self, tensor: Any) -> int:
        return tensor._version

    def assign(self, tensor: Any, values: np.ndarray) -> None:
        torch = _torch()
        with torch.no_grad():
            tensor.copy_(self.like(tensor, values))

    def named_leaves(self, model: Any) -> Iterator[tuple[str, Any]]:
        torch = _torch()
        if isinstance(model, torch.nn.Module):
            for name, tensor in model.named_parameters(remove_duplicate=True):
                yield str(LeafRef("param", name)), tensor
            for name, tensor in model.named_buffers(remove_duplicate=True):
                yield str(LeafRef("buffer", name)), tensor

    def is_module(self, obj: Any) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(obj, torch.nn.Module)

    def named_modules(self, root: Any) -> Iterator[tuple[str, Any]]:
        return root.named_modules(remove_duplicate=False)

    def is_compiled_function(self, model: Any) -> bool:
        return not isinstance(model, _torch().nn.Module) and hasattr(model, "_torchdynamo_orig_callable")

    def probe_compiled(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> CompiledProbe | None:
        if not isinstance(fn, CompiledCall):
            return None
        from .torch_compile import TorchCompiledProbe

        return TorchCompiledProbe(fn.eager, fn.settings, args, kwargs)

    def linear_class(self) -> type:
        return _torch().nn.Linear

    def batch_norm_classes(self) -> tuple[type, ...]:
        return tuple(getattr(_torch().nn, name) for name in _BATCH_NORMS)

    def float64_model(self, model: Any) -> Any:
        torch = _torch()
        if not isinstance(model, torch.nn.Module):
            raise CannotUpcast("it is a plain function, whose tensors bisectr cannot reach")
        return copy.deepcopy(model).double()

    def float64_tensor(self, tensor: Any, into: Any = None) -> Any:
        return tensor.detach().double() if into is None else into.copy_(tensor.detach())

    def cast(self, tensor: Any, dtype: str) -> Any:
        return tensor.to(getattr(_torch(), dtype))

    def data_address(self, tensor: Any) -> int:
        return tensor.data_ptr()

    def narrowing_dtypes(self) -> tuple[tuple[Any, ...], Any]:
        torch = _torch()
        return (torch.float32, torch.float16, torch.bfloat16), torch.float64

    def float64_call(
        self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict
    ) -> tuple[Callable[..., Any], tuple, dict]:
        if name in _NARROWING_METHODS:
            return _torch().Tensor.double, args[:1], {}
        if name == COMPILED_OP:
            return fn.in_float64(), args, kwargs
        return super().float64_call(name, fn, args, kwargs)

    @contextmanager
    def float64_defaults(self) -> Iterator[None]:
        torch = _torch()
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            yield
        finally:
            torch.set_default_dtype(default)

    def copy_model(self, model: Any) -> Any:
        if not isinstance(model, _torch().nn.Module):
            raise CannotUpcast("it is a plain function, whose parameters bisectr cannot reach")
        return copy.deepcopy(model)

    def copy_values(self, into: Any, source: Any) -> None:
        with _torch().no_grad():
            whole = _whole(source).to(into.dtype)
            layout = self.layout(into)
            into.copy_(whole if layout is None else _distributed(whole, layout))

    def waits_for_every_gradient(self, model: Any) -> bool:
        data_parallel = _loaded_class("torch.nn.parallel", "DistributedDataParallel")
        return (
            data_parallel is not None
            and isinstance(model, data_parallel)
            and not model.find_unused_parameters
            and not model.static_graph
        )

    def unreached(self, loss: Any, parameters: dict[str, Any]) -> list[str]:
        reached = {id(leaf) for leaf in _graph_leaves([loss])}
        return [name for name, tensor in parameters.items() if tensor.requires_grad and id(tensor) not in reached]

    def gathered(self, value: Any) -> list[Any]:
        import torch.distributed as dist

        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, value)
        return every

    def clear_gradients(self, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=True)

    def optimizer_moments(self, optimizer: Any, parameter: Any) -> dict[str, np.ndarray]:
        state = optimizer.state.get(parameter, {})
        return {
            shared: self.to_numpy(state[own])
            for shared, own in (("moment1", "exp_avg"), ("moment2", "exp_avg_sq"))
            if own in state
        }

    def learning_rate(self, optimizer: Any) -> float:
        return float(optimizer.param_groups[0]["lr"])

    def optimizer_settings(self, optimizer: Any) -> dict[str, Any]:
        group = optimizer.param_groups[0]
        beta1, beta2 = group.get("betas", (None, None))
        decay = float(group.get("weight_decay", 0.0))
        decoupled = group.get("decoupled_weight_decay", type(optimizer).__name__ == "AdamW")
        return {
            "optimizer": type(optimizer).__name__,
            "epsilon": group.get("eps"),
            "beta1": beta1,
            "beta2": beta2,
            "weight_decay": decay,
            "weight_decay_kind": ("decoupled" if decoupled else "coupled (L2)") if decay else None,
            "amsgrad": bool(group.get("amsgrad", False)),
            "gradient_clipping": None,
        }

    def weight_decays(self, optimizer: Any, parameters: dict[str, Any]) -> dict[str, float]:
        decay = {
            id(p): float(group.get("weight_decay", 0.0)) for group in optimizer.param_groups for p in group["params"]
        }
        return {name: decay.get(id(tensor), 0.0) for name, tensor in parameters.items()}

    def numerics_settings(self) -> dict[str, str]:
        torch = _torch()
        matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
        deterministic = torch.are_deterministic_algorithms_enabled()
        autocast = [
            f"{device} {str(torch.get_autocast_dtype(device)).removeprefix('torch.')}"
            for device in ("cpu", "cuda")
            if torch.is_autocast_enabled(device)
        ]
        return {
            "torch": torch.__version__,
            "torch cuda": torch.version.cuda or "none",
            "torch cudnn": str(cudnn.version()) if cudnn.is_available() else "none",
            "tf32 matmul": "on" if matmul.allow_tf32 else "off",
            "torch tf32 cudnn": "on" if cudnn.allow_tf32 else "off",
            "torch matmul precision": torch.get_float32_matmul_precision(),
            "torch reduced-precision reductions": f"fp16 {matmul.allow_fp16_reduced_precision_reduction}, "
            f"bf16 {matmul.allow_bf16_reduced_precision_reduction}",
            "torch deterministic algorithms": (
                "off"
                if not deterministic
                else "warn only"
                if torch.is_deterministic_algorithms_warn_only_enabled()
                else "on"
            ),
            "torch cudnn flags": f"deterministic {cudnn.deterministic}, benchmark {cudnn.benchmark}",
            "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG", "unset"),
            "torch threads": f"{torch.get_num_threads()} (interop {torch.get_num_interop_threads()})",
            "autocast": ", ".join(autocast) or "off",
            "default dtype": str(torch.get_default_dtype()).removeprefix("torch."),
        }

    def seed(self, seed: int) -> None:
        _torch().manual_seed(seed)

    def input_layout(self, op: str, position: int) -> tuple[int, ...] | None:
        # nn.Linear stores its weight as (out, in); the shared layout is (in, out).
        return (1, 0) if op == "linear" and position == 1 else None

    def no_grad(self) -> Any:
        return _torch().no_grad()

    def enable_grad(self) -> Any:
        return _torch().enable_grad()

    def requires_grad(self, tensor: Any) -> bool:
        return tensor.requires_grad

    def gradient_leaf(self, tensor: Any) -> Any:
        return tensor.detach().requires_grad_(True)

    def add_gradient_hook(self, tensor: Any, hook: Callable[[Any], Any]) -> None:
        tensor.register_hook(hook)

    def gradients(self, outputs: list[Any], upstream: list[Any], inputs: list[Any]) -> list[Any | None]:
        torch = _torch()
        if not _reentrant_checkpoint(outputs):
            return list(torch.autograd.grad(outputs, inputs, upstream, allow_unused=True))
        # A reentrant checkpoint (`torch.utils.checkpoint(use_reentrant=True)`) computes its gradients
        # only into `.grad`: accumulate there, then put back what every leaf held.
        leaves = _graph_leaves(outputs)
        held = {id(leaf): (leaf, leaf.grad) for leaf in leaves + list(inputs)}
        for leaf, _ in held.values():
            leaf.grad = None
        try:
            torch.autograd.backward(outputs, upstream)
            return [tensor.grad for tensor in inputs]
        finally:
            for leaf, grad in held.values():
                leaf.grad = grad

    def internal_paths(self) -> tuple[str, ...]:
        return (os.path.dirname(_torch().__file__) + os.sep,)

    def frame_role(self, filename: str, function: str) -> int:
        relative = self._relative(filename)
        if (
            relative in _PLUMBING_FILES
            or relative.startswith(_PLUMBING_PREFIXES)
            or function in _PLUMBING_FUNCTIONS.get(relative, ())
        ):
            return PLUMBING
        return API if relative in _API_FILES else CALLER

    @contextmanager
    def intercept(self, model: Any, listener: OpListener, gradients: bool = False) -> Iterator[None]:
        torch = _torch()
        paths = ModulePaths(
            lambda root: root.named_modules(),
            model if isinstance(model, torch.nn.Module) else None,
            getattr(listener, "adopt_root", None),
        )
        mode = _CallRouter(listener)

        # torch runs the global forward hooks before a module's own, so a module with hooks of its own (a
        # tensor-parallel style's output redistribution) is left by a hook of its own, registered last.
        own_exits: dict[int, Any] = {}

        def on_enter(module: Any, args: Any) -> None:
            listener.enter_module(paths.path(module))
            hooks = module._forward_hooks
            own = own_exits.get(id(module))
            if hooks and (own is None or next(reversed(hooks)) != own.id):
                if own is not None:
                    own.remove()
                own_exits[id(module)] = module.register_forward_hook(on_own_exit, always_call=True)

        def on_exit(module: Any, args: Any, output: Any) -> None:
            if id(module) not in own_exits:
                listener.exit_module()

        def on_own_exit(module: Any, args: Any, output: Any) -> None:
            listener.exit_module()

        pre_hook = torch.nn.modules.module.register_module_forward_pre_hook(on_enter)
        post_hook = torch.nn.modules.module.register_module_forward_hook(on_exit, always_call=True)
        function = torch.autograd.function.Function
        apply = function.__dict__["apply"]
        function.apply = _routed_apply(apply.__func__, mode)
        dtensor = _loaded_class("torch.distributed.tensor", "DTensor")
        if dtensor is not None:  # without gradients it hands its shard over without an autograd function
            to_local = dtensor.__dict__["to_local"]
            dtensor.to_local = _routed_method(to_local, "DTensor.to_local", mode)
        distributed = sys.modules.get("torch.distributed")
        collectives = {name: getattr(distributed, name) for name in _IN_PLACE_COLLECTIVES if hasattr(distributed, name)}
        for name, collective in collectives.items():
            setattr(distributed, name, _routed_method(_in_place(collective), f"distributed.{name}", mode))
        try:
            with (
                torch.enable_grad() if gradients else torch.no_grad(),
                mode,
                _compiled_calls_routed(model, mode, paths.path, listener),
            ):
                yield
        finally:
            function.apply = apply
            if dtensor is not None:
                dtensor.to_local = to_local
            for name, collective in collectives.items():
                setattr(distributed, name, collective)
            pre_hook.remove()
            post_hook.remove()
            for own in own_exits.values():
                own.remove()


@dataclass(frozen=True)
class _Placement:
    """A DTensor's layout (`TorchAdapter.layout`): its mesh and placements, and for a partial sum the
    tensor whose split over the ranks a new one follows."""

    mesh: Any
    placements: tuple
    split_like: Any = None


def _distributed(whole: Any, layout: _Placement) -> Any:
    """A DTensor of global values `whole` (which every rank holds) placed as `layout` says: each rank
    keeps its own shard; a partial sum is `layout.split_like` moved by an even share of the difference
    on each rank (any other partial reduction: the value on every rank)."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    if layout.split_like is not None:  # added rank by rank: as DTensors, two partial sums would be reduced first
        change = _distributed(
            whole - _whole(layout.split_like).to(whole.dtype), _Placement(layout.mesh, layout.placements)
        )
        return DTensor.from_local(
            layout.split_like.to_local().to(whole.dtype) + change.to_local(),
            layout.mesh,
            layout.placements,
            run_check=False,
            shape=whole.shape,
            stride=whole.stride(),
        )
    spread = [Replicate() if placement.is_partial() else placement for placement in layout.placements]
    placed = distribute_tensor(whole, layout.mesh, spread, src_data_rank=None)  # each rank cuts its own shard
    shares = math.prod(
        layout.mesh.size(dim)
        for dim, placement in enumerate(layout.placements)
        if placement.is_partial() and placement.reduce_op == "sum"
    )
    if spread == list(layout.placements):
        return placed
    return DTensor.from_local(
        placed.to_local() / shares,
        layout.mesh,
        layout.placements,
        run_check=False,
        shape=whole.shape,
        stride=whole.stride(),
    )


def _routed(mode: Any, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """`fn(*args, **kwargs)`, routed to the listener as one op `name` while `mode` sees calls (not
    inside another op's call), with the mode off inside it, as inside `__torch_function__`."""
    from torch._C import _is_torch_function_enabled
    from torch.overrides import _get_current_function_mode_stack, _pop_mode_temporarily

    stack = _get_current_function_mode_stack()
    if not (_is_torch_function_enabled() and stack and stack[-1] is mode):
        return fn(*args, **kwargs)
    with _pop_mode_temporarily():
        return mode.listener.call(name, fn, args, kwargs)


def _routed_apply(apply: Callable[..., Any], mode: Any) -> classmethod:
    """`autograd.Function.apply` as one op named after the function's class: its backward is the class's own."""

    def routed(cls, *args, **kwargs):
        run = functools.partial(apply, cls)
        run.__qualname__ = name = f"{cls.__qualname__}.apply"
        return _routed(mode, name, run, args, kwargs)

    return classmethod(routed)


def _routed_method(method: Callable[..., Any], name: str, mode: Any) -> Callable[..., Any]:
    """`method` as one op `name`."""
    return lambda *args, **kwargs: _routed(mode, name, method, args, kwargs)


class CompiledCall:
    """A compiled module's call, as its recorded op calls it: `eager` (the module as written) compiled
    with `settings` (dynamo's context: backend and options), run with no module hooks, so that its
    compiled code, not bisectr's hooks, is what runs. `run(*args, **kwargs)` is the call as the model
    made it (an `OptimizedModule`'s, or a module's compiled in place by `module.compile()`)."""

    __qualname__ = COMPILED_OP

    def __init__(self, eager: Any, settings: Any, run: Callable[..., Any]):
        self.eager, self.settings, self.run = eager, settings, run

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        modules = _torch().nn.modules.module
        hooks = (
            modules._global_forward_pre_hooks,
            modules._global_forward_hooks,
            modules._global_forward_hooks_always_called,
        )
        held = [dict(hook) for hook in hooks]
        for hook in hooks:
            hook.clear()
        try:
            return self.run(*args, **kwargs)
        finally:
            for hook, entries in zip(hooks, held):
                hook.update(entries)

    def inner_dtypes(self) -> list[str]:
        """The floating dtypes of the module's parameters and buffers, which its compiled code reads."""
        tensors = [*self.eager.parameters(), *self.eager.buffers()]
        return sorted({str(t.dtype).removeprefix("torch.") for t in tensors if t.is_floating_point()})

    def in_float64(self) -> "CompiledCall":
        """The call of a float64 copy of the module compiled with the same settings (made once, compiled
        in float64 at its first call)."""
        copy64 = _float64_copies.get(self.eager)
        if copy64 is None:
            eager64 = copy.deepcopy(self.eager).double()
            eager64._compiled_call_impl = None
            compiled64 = _loaded_class("torch._dynamo.eval_frame", "OptimizedModule")(eager64, self.settings)
            copy64 = _float64_copies[self.eager] = CompiledCall(eager64, self.settings, compiled64)
        return copy64


_float64_copies: "weakref.WeakKeyDictionary[Any, CompiledCall]" = weakref.WeakKeyDictionary()


@contextmanager
def _compiled_calls_routed(model: Any, mode: Any, path: Callable[[Any], str], listener: OpListener) -> Iterator[None]:
    """While active, each compiled module's call is one op `COMPILED_OP` in the compiled module's path:
    an `OptimizedModule`'s (`torch.compile(module)`), and that of each module of `model` compiled in
    place (`module.compile()`)."""

    def routed(module: Any, call: CompiledCall, *args: Any, **kwargs: Any) -> Any:
        listener.enter_module(path(module))
        try:
            return _routed(mode, COMPILED_OP, call, args, kwargs)
        finally:
            listener.exit_module()

    compiled_class = _loaded_class("torch._dynamo.eval_frame", "OptimizedModule")
    if compiled_class is None:
        yield
        return
    optimized_call = compiled_class.__dict__["__call__"]

    def optimized(module, *args, **kwargs):
        run = functools.partial(optimized_call, module)
        return routed(module, CompiledCall(module._orig_mod, module.dynamo_ctx, run), *args, **kwargs)

    in_place = (
        {m: m._compiled_call_impl for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None}
        if isinstance(model, _torch().nn.Module)
        else {}
    )
    for module, compiled in in_place.items():
        settings = next(
            cell.cell_contents
            for cell in compiled.__closure__
            if type(cell.cell_contents).__name__ == "OptimizeContext"
        )
        module._compiled_call_impl = functools.partial(routed, module, CompiledCall(module, settings, compiled))
    compiled_class.__call__ = optimized
    try:
        yield
    finally:
        compiled_class.__call__ = optimized_call
        for module, compiled in in_place.items():
            module._compiled_call_impl = compiled


# torch.distributed's collectives on plain tensors that write their result into their first argument
# (a tensor, or a list of tensors).
_IN_PLACE_COLLECTIVES = (
    "all_reduce",
    "reduce_scatter_tensor",
    "all_gather_into_tensor",
    "broadcast",
    "all_gather",
    "all_to_all",
)


def _in_place(collective: Callable[..., Any]) -> Callable[..., Any]:
    """`collective`, finished before it returns, with the write into its first argument (each
    tensor of it, for a list) counted in that tensor's version (the backends' own writes are not),
    as any in-place op's is."""

    def run(written, *args, **kwargs):
        work = collective(written, *args, **kwargs)
        if work is not None:
            work.wait()
        for tensor in written if isinstance(written, (list, tuple)) else [written]:
            _torch().autograd.graph.increment_version(tensor)
        return work

    run.__qualname__ = collective.__qualname__
    return run


# Where FSDP2's hooks call torch from: they gather parameters, free them and hook the backward, computing nothing
# of the model's. Their calls run as they are, unrecorded.
_FRAMEWORK_HOOKS = os.path.join("torch", "distributed", "fsdp", "")


def _make_router_class():
    from torch.overrides import TorchFunctionMode, resolve_name

    names: dict[Any, str] = {}

    def op_name(func: Any) -> str:
        name = names.get(func)
        if name is None:
            name = resolve_name(func) or getattr(func, "__qualname__", None) or repr(func)
            name = name.removeprefix("torch.")
            names[func] = name
        return name

    class CallRouter(TorchFunctionMode):
        """Routes each outermost torch API call to the listener (the mode is off inside it)."""

        def __init__(self, listener: OpListener):
            super().__init__()
            self.listener = listener
            # Only a model that imported FSDP2 has its hooks: others pay no look at the caller's frame.
            self.fully_sharded = _loaded_class("torch.distributed.fsdp", "FSDPModule") is not None

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if self.fully_sharded and _FRAMEWORK_HOOKS in sys._getframe(1).f_code.co_filename:
                return func(*args, **(kwargs or {}))
            if _inside_functorch_transform(args, kwargs):
                # An op `torch.vmap` maps over a function (a mask built index by index): its tensors are
                # functorch's wrappers, holding no values of their own. What the transform returns is recorded.
                return func(*args, **(kwargs or {}))
            return self.listener.call(op_name(func), func, args, kwargs or {})

    return CallRouter


_router_class = None


def _inside_functorch_transform(args: tuple, kwargs: dict | None) -> bool:
    """Does a call read a tensor `torch.vmap` (or another functorch transform) wrapped?"""
    is_wrapped = _torch()._C._functorch.is_functorch_wrapped_tensor
    tensor = _torch().Tensor
    return any(
        isinstance(value, tensor) and is_wrapped(value) for value in itertools.chain(args, (kwargs or {}).values())
    )


def _CallRouter(listener: OpListener):
    global _router_class
    if _router_class is None:
        _router_class = _make_router_class()
    return _router_class(listener)


def _graph_nodes(outputs: list[Any]) -> Iterator[Any]:
    """Every autograd node the gradients of `outputs` pass through."""
    seen: set[int] = set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(next_node for next_node, _ in node.next_functions if next_node is not None)


def _reentrant_checkpoint(outputs: list[Any]) -> bool:
    return any(type(node).__name__ == "CheckpointFunctionBackward" for node in _graph_nodes(outputs))


def _graph_leaves(outputs: list[Any]) -> list[Any]:
    """The leaf tensors whose `.grad` a backward from `outputs` writes (a reentrant checkpoint's
    own backward reaches more, through the forward it runs again: their `.grad` is kept too)."""
    return [node.variable for node in _graph_nodes(outputs) if hasattr(node, "variable")]
