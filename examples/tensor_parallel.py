"""One device against tensor parallel: a sharding plan that leaves a partial sum unreduced.

The candidate runs on 2 ranks that bisectr starts under torchrun (`NPROC` below; `--candidate-nproc N` overrides
it): `bisectr bisect examples/tensor_parallel.py`.

Reference: 4 residual MLP blocks (RMSNorm, up projection, GELU, down projection) on one device.
Candidate: the same weights sharded with torch's `parallelize_module` on every rank torchrun
starts: `up` column-parallel, `down` row-parallel, as Megatron shards an MLP. The plan gives
`down` `output_layouts=Partial()`, so each rank goes on with its own partial sum of the down
projection, where the rowwise default reduces them (`candidate_fixed()`).

Measured here (2 ranks, gloo): the outputs differ by 1.02 (0.215 relative); with the plan's reduction
kept, by 4.8e-07 (1e-07 relative).

bisectr should conclude: verdict `divergent`; culprit the `DTensor.to_local` that hands each rank its
partial sum in `blocks.0` (read as `Partial(sum)`, handed on as values that differ by rank), every block
listed, confirmed by handing on the reduced value instead. `candidate_fixed()` is `noise`: the
ranks' partial sums add up in another order than one device's matmul.
"""
import os

WIDTH, HIDDEN, BLOCKS = 32, 64, 4
NPROC = {"candidate": 2, "candidate_fixed": 2}


def _mlp():
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.RMSNorm(WIDTH)
            self.up = nn.Linear(WIDTH, HIDDEN)
            self.down = nn.Linear(HIDDEN, WIDTH)

        def forward(self, x):
            return x + self.down(nn.functional.gelu(self.up(self.norm(x))))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(0)
    model = Stack().eval()
    return model, (torch.randn(4, 8, WIDTH, generator=torch.Generator().manual_seed(1)),)


def _sharded(partial_down: bool):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model, inputs = _mlp()
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    down = RowwiseParallel(output_layouts=Partial()) if partial_down else RowwiseParallel()
    for block in model.blocks:
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": down})
    return model, inputs


def reference():
    return _mlp()


def candidate():
    return _sharded(partial_down=True)


def candidate_fixed():
    return _sharded(partial_down=False)
