"""A tiny Hugging Face Llama (2 layers, 4 query / 2 key-value heads) trained with AdamW on one process against
itself on 2 ranks: `candidate_ddp` (DistributedDataParallel) and `candidate_fsdp` (FSDP2, each decoder layer and
the model sharded), correct; `candidate_ddp_averaged_twice`, a communication hook that divides by the world size
before and after the all-reduce. Each rank trains on its row of the step's 2 rows of 8 tokens."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import tiny_llama  # noqa: E402

NPROC = {"candidate_ddp": 2, "candidate_fsdp": 2, "candidate_ddp_averaged_twice": 2}


def _batch(step):
    import numpy as np
    import torch

    ids = torch.from_numpy(np.random.default_rng(step).integers(0, 128, (2, 8)))
    return {"input_ids": ids, "use_cache": False}


def reference():
    model, inputs = tiny_llama()
    return model.train(), inputs


def reference_batch(step):
    return _batch(step)


def reference_loss(outputs):
    return (outputs.logits**2).mean()


def reference_optimizer(model):
    import torch

    return torch.optim.AdamW(model.parameters(), lr=1e-3)


candidate_loss = reference_loss
candidate_optimizer = reference_optimizer


def candidate_batch(step):
    import torch.distributed as dist

    rows = _batch(step)["input_ids"].chunk(dist.get_world_size())[dist.get_rank()]
    return {"input_ids": rows, "use_cache": False}


def _averaged_twice(state, bucket):
    import torch.distributed as dist

    world = dist.get_world_size()
    gradients = bucket.buffer().div_(world)  # @averaged_twice
    return dist.all_reduce(gradients, async_op=True).get_future().then(lambda done: done.value()[0].div_(world))


def candidate_ddp(hook=None):
    from torch.nn.parallel import DistributedDataParallel

    model, inputs = reference()
    model = DistributedDataParallel(model)
    if hook is not None:
        model.register_comm_hook(None, hook)
    return model, inputs


def candidate_ddp_averaged_twice():
    return candidate_ddp(_averaged_twice)


def candidate_fsdp():
    from torch.distributed.fsdp import fully_shard

    model, inputs = reference()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model, inputs
