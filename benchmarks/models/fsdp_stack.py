"""A stack of MLP blocks trained with AdamW: on one process (the reference) and with FSDP2 on 2 ranks (the
candidate, each rank on its half of the batch), for `benchmarks/training_ranks.py`. `BENCH_WIDTH` (default 512)
and `BENCH_LAYERS` (default 8) set its size: 8 * width * 4 * width * 2 weights."""

import os

WIDTH = int(os.environ.get("BENCH_WIDTH", "512"))
LAYERS = int(os.environ.get("BENCH_LAYERS", "8"))
ROWS, TOKENS = 4, 16
NPROC = {"candidate": 2}


def _stack():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)) for _ in range(LAYERS)))


def _batch(step):
    import torch

    return (torch.randn(ROWS, TOKENS, WIDTH, generator=torch.Generator().manual_seed(step)),)


def reference():
    return _stack(), _batch(0)


def reference_batch(step):
    return _batch(step)


def reference_loss(outputs):
    return (outputs**2).mean()


def reference_optimizer(model):
    import torch

    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def candidate():
    from torch.distributed.fsdp import fully_shard

    model = _stack()
    for block in model:
        fully_shard(block)
    fully_shard(model)
    return model, _batch(0)


def candidate_batch(step):
    import torch.distributed as dist

    (x,) = _batch(step)
    return (x.chunk(dist.get_world_size())[dist.get_rank()],)


candidate_loss = reference_loss
candidate_optimizer = reference_optimizer
