"""Candidates whose outputs bisectr cannot see being computed, against one `nn.Linear` reference.

- `candidate_ranks`: the forward starts two torch.distributed ranks (gloo, forked processes), each
  computing half of the output features, and returns what rank 0 gathered: no op of this process
  computes the output.
- `candidate_from_file`: the forward returns a tensor loaded from a file, scaled by recorded ops.
- `candidate_hiding_from_modes`: a model that refuses to run under a torch function mode (as code
  that checks `torch._C._is_torch_function_mode_enabled()` does); it runs on its own, fails under
  bisectr's recording: bisectr's failure, not the model's.

Against `reference_function` (the linear called from a plain function, which the float64 check cannot
upcast): `candidate_scaled_by_a_millionth` multiplies the linear's output by 1 + 1e-6, a semantic difference
below float32's noise floor that no op's rounding explains.
"""
import os
import tempfile

import numpy as np

WEIGHT = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
INPUT = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)


def _linear():
    import torch

    linear = torch.nn.Linear(8, 4, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(WEIGHT))
    return linear.eval()


def reference():
    import torch

    return _linear(), (torch.from_numpy(INPUT.copy()),)


def _rank(rank: int, port: int, x, results) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    shard = x @ torch.from_numpy(WEIGHT[2 * rank:2 * rank + 2]).T * 1.1
    gathered = [torch.empty_like(shard) for _ in range(2)]
    dist.all_gather(gathered, shard)
    if rank == 0:
        results.put(torch.cat(gathered, dim=1).numpy())
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RanksInForward:
    def __call__(self, x):
        import torch
        import torch.multiprocessing as mp

        context = mp.get_context("fork")
        results = context.SimpleQueue()
        mp.start_processes(_rank, args=(_free_port(), x, results), nprocs=2, start_method="fork")
        return torch.from_numpy(results.get())


def candidate_ranks():
    import torch

    return RanksInForward(), (torch.from_numpy(INPUT.copy()),)


def candidate_from_file():
    import torch

    folder = tempfile.TemporaryDirectory(prefix="bisectr-unseen-")
    path = os.path.join(folder.name, "output.pt")
    torch.save(torch.from_numpy(INPUT @ WEIGHT.T), path)
    return (lambda x, kept=folder: torch.load(path) * 1.0 + 0.5), (torch.from_numpy(INPUT.copy()),)


class HidingFromModes:
    def __init__(self):
        self.linear = _linear()

    def __call__(self, x):
        import torch

        if torch._C._is_torch_function_mode_enabled():
            raise RuntimeError("this model runs only without a torch function mode")
        return self.linear(x)


def candidate_hiding_from_modes():
    import torch

    return HidingFromModes(), (torch.from_numpy(INPUT.copy()),)


def reference_function():
    import torch

    linear = _linear()
    return (lambda x: linear(x)), (torch.from_numpy(INPUT.copy()),)


def candidate_scaled_by_a_millionth():
    import torch

    linear = _linear()
    return (lambda x: linear(x) * (1 + 1e-6)), (torch.from_numpy(INPUT.copy()),)
