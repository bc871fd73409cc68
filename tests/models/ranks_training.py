"""Training on 2 ranks against one process: a small stack (per block: LayerNorm, an up projection, GELU, a down
projection, the residual; a final LayerNorm) trained with AdamW, as data parallel (DDP, FSDP2's `fully_shard`) and
as tensor parallel with sequence parallel (`parallelize_module`), each correct and with one planted bug.

The reference trains on one process on the whole batch of each step. `candidate_ddp` and `candidate_fsdp` train on
2 ranks (NPROC), each on its half of the batch's rows (`candidate_batch`); `candidate_tp_sp` on 2 ranks on the
whole batch, its blocks' norms and residual stream sharded over the tokens, the output gathered whole. At the
initial weights every side runs the whole batch (what `bisectr bisect` and the trace compare). Bugs:

- `candidate_ddp_averaged_twice`: a DDP communication hook divides by the world size before the all-reduce and
  again after it.
- `candidate_ddp_accumulation`: 2 micro-batches per step, each loss divided by 2 (correct);
  `candidate_ddp_undivided`: the same without the division.
- `candidate_tp_sp_norm_unreduced`: the blocks' norms left out of the sequence-parallel plan: each rank normalizes
  its own tokens with its own copy of the norm's weights, whose gradients are never all-reduced.
- `candidate_ddp_unused` against `reference_routed`: the last block routes the rows whose first feature is positive
  through an expert, and rank 1 has none: DDP without `find_unused_parameters` waits for the expert's gradients
  on rank 1 (`candidate_ddp_unused_found`: with it, correct).
- `candidate_ddp_uneven`: the batch split by `chunk` into 3 and 1 rows where 2 ranks need 2 each.
- `candidate_ddp_raises`: rank 1 raises in its step 2 batch.
"""

WIDTH, TOKENS, ROWS, LAYERS, LR = 16, 8, 4, 2, 1e-2

NPROC = {
    name: 2
    for name in (
        "candidate_ddp",
        "candidate_ddp_averaged_twice",
        "candidate_ddp_accumulation",
        "candidate_ddp_undivided",
        "candidate_ddp_uneven",
        "candidate_ddp_raises",
        "candidate_fsdp",
        "candidate_fsdp_bf16_reduce",
        "candidate_tp_sp",
        "candidate_tp_sp_norm_unreduced",
        "candidate_tp_sp_local_up",
        "candidate_tp_sp_missing_reduction",
        "candidate_ddp_unused",
        "candidate_ddp_unused_found",
    )
}


def _stack(local_up: str = ""):
    """`local_up`: each block's up projection computed on this rank's columns by hand, its input gathered whole
    and taken local with its backward's reduction ("partial", right) or without it ("missing")."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(WIDTH)
            self.up = nn.Linear(WIDTH, 2 * WIDTH)
            self.down = nn.Linear(2 * WIDTH, WIDTH)

        def forward(self, x):
            normed = self.norm(x)
            up = self.up(normed) if not local_up else self.up_on_own_columns(normed)
            return x + self.down(nn.functional.gelu(up))

        def up_on_own_columns(self, normed):
            from torch.distributed.tensor import Partial, Replicate

            whole = normed.redistribute(normed.device_mesh, [Replicate()])
            if local_up == "partial":
                rows = whole.to_local(grad_placements=[Partial()])
            else:
                rows = whole.to_local()  # @missing_reduction
            return nn.functional.linear(rows, self.up.weight.to_local(), self.up.bias.to_local())

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.norm = nn.LayerNorm(WIDTH)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            x = self.norm(x)
            return x.full_tensor() if hasattr(x, "full_tensor") else x  # sequence parallel: gathered whole

    torch.manual_seed(0)
    model = Stack()
    with torch.no_grad():  # norms whose weights are not all ones, so that their gradients matter
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def _whole_batch(step: int):
    import torch

    return (torch.randn(ROWS, TOKENS, WIDTH, generator=torch.Generator().manual_seed(step)),)


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def _share(step: int, parts: int | None = None):
    """This rank's rows of the step's batch (`parts`: split into that many, as `chunk` does)."""
    rank, world = _rank_and_world()
    (x,) = _whole_batch(step)
    return (x.chunk(parts or world)[rank],)


def _loss(outputs, micro_batches: int = 1):
    import torch

    target = torch.linspace(-1.0, 1.0, WIDTH, dtype=outputs.dtype)
    return ((outputs - target) ** 2).mean() / micro_batches


# -- the reference: one process ------------------------------------------------------------------------


def reference():
    return _stack(), _whole_batch(0)


def reference_batch(step):
    return _whole_batch(step)


def reference_loss(outputs):
    return _loss(outputs)


def reference_optimizer(model):
    import torch

    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)


candidate_optimizer = reference_optimizer
candidate_loss = reference_loss


def candidate_batch(step):
    return _share(step)


# -- data parallel ----------------------------------------------------------------------------------


def candidate_ddp(hook=None):
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_stack())
    if hook is not None:
        model.register_comm_hook(None, hook)
    return model, _whole_batch(0)


def _averaged_twice(state, bucket):
    import torch.distributed as dist

    world = dist.get_world_size()
    gradients = bucket.buffer().div_(world)  # @averaged_twice
    return dist.all_reduce(gradients, async_op=True).get_future().then(lambda done: done.value()[0].div_(world))


def candidate_ddp_averaged_twice():
    return candidate_ddp(_averaged_twice)


def candidate_ddp_accumulation():
    return candidate_ddp()


def candidate_ddp_accumulation_micro_batches(step):
    (rows,) = _share(step)
    return [(half,) for half in rows.chunk(2)]


def candidate_ddp_accumulation_loss(outputs):
    return _loss(outputs, micro_batches=2)


candidate_ddp_undivided = candidate_ddp_accumulation
candidate_ddp_undivided_micro_batches = candidate_ddp_accumulation_micro_batches


def candidate_ddp_undivided_loss(outputs):
    return _loss(outputs)  # @undivided


candidate_ddp_uneven = candidate_ddp


def candidate_ddp_uneven_batch(step):
    (x,) = _whole_batch(step)
    rank, _ = _rank_and_world()
    return (x[:3] if rank == 0 else x[3:],)


candidate_ddp_raises = candidate_ddp


def candidate_ddp_raises_batch(step):
    if step == 2 and _rank_and_world()[0] == 1:
        raise RuntimeError("the data loader of rank 1 failed")  # @raises
    return _share(step)


def candidate_fsdp(reduce_dtype=None):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    model = _stack()
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, _whole_batch(0)


def candidate_fsdp_bf16_reduce():
    import torch

    return candidate_fsdp(reduce_dtype=torch.bfloat16)


# -- tensor parallel with sequence parallel ------------------------------------------------------------


def candidate_tp_sp(norms_in_plan: bool = True, local_up: str = ""):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    _, world = _rank_and_world()
    mesh = init_device_mesh("cpu", (world,))
    model = _stack(local_up)
    tokens = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True)
    plan = {"blocks.0": tokens, "norm": SequenceParallel()}
    for index in range(LAYERS):
        up = ColwiseParallel(input_layouts=Shard(1))
        if local_up:  # its weights sharded as the plan shards them, its forward by hand
            up = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1))
        plan |= {
            f"blocks.{index}.up": up,
            f"blocks.{index}.down": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1)),
        }
        if norms_in_plan:
            plan[f"blocks.{index}.norm"] = SequenceParallel()
    parallelize_module(model, mesh, plan)
    return model, _whole_batch(0)


def candidate_tp_sp_batch(step):
    return _whole_batch(step)


def candidate_tp_sp_norm_unreduced():
    return candidate_tp_sp(norms_in_plan=False)  # @unreduced


candidate_tp_sp_norm_unreduced_batch = candidate_tp_sp_batch


def candidate_tp_sp_local_up():
    return candidate_tp_sp(local_up="partial")


def candidate_tp_sp_missing_reduction():
    return candidate_tp_sp(local_up="missing")


candidate_tp_sp_local_up_batch = candidate_tp_sp_missing_reduction_batch = candidate_tp_sp_batch


# -- a parameter unused on one rank ----------------------------------------------------------------


def _routed():
    """A stack whose last block sends the rows whose first feature is positive through a second projection
    (an expert): on the rank whose rows all have it negative, that projection is unused."""
    import torch
    from torch import nn

    class Routed(nn.Module):
        def __init__(self):
            super().__init__()
            self.stack = _stack()
            self.expert = nn.Linear(WIDTH, WIDTH)

        def forward(self, x):
            x = self.stack(x)
            chosen = x[:, 0, 0] > 0
            if bool(chosen.any()):  # a rank without such a row never calls the expert
                x = torch.where(chosen[:, None, None], x + self.expert(x), x)
            return x

    return Routed()


def _routed_batch(step: int):
    """Rows 0-1 routed to the expert (their first feature made large), rows 2-3 not: rank 1's half never is."""
    (x,) = _whole_batch(step)
    x = x.clone()
    x[:2, 0, 0], x[2:, 0, 0] = 10.0, -10.0
    return (x,)


def reference_routed():
    return _routed(), _routed_batch(0)


def reference_routed_batch(step):
    return _routed_batch(step)


def candidate_ddp_unused(find_unused_parameters: bool = False):
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_routed(), find_unused_parameters=find_unused_parameters)  # @unused
    return model, _routed_batch(0)


def candidate_ddp_unused_batch(step):
    rank, world = _rank_and_world()
    (x,) = _routed_batch(step)
    return (x.chunk(world)[rank],)


def candidate_ddp_unused_found():
    return candidate_ddp_unused(find_unused_parameters=True)


candidate_ddp_unused_found_batch = candidate_ddp_unused_batch
