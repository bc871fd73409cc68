"""A small decoder of our own, one device against tensor parallel (`parallelize_module`).

`reference()` builds the decoder on one device; `candidate()` builds the same weights and shards
them over every rank torchrun started (`--candidate-nproc N`): attention's q/k/v projections and
the MLP's up projection column-wise, attention's output and the MLP's down projection row-wise,
so that each layer's attention and MLP run on each rank's heads and columns and end in one
all-reduce. `TP_PLAN=sequence` also shards the embedding over the vocabulary and the norms and the
residual stream over the tokens (sequence parallel); `TP_PLAN=sequence_local` so too, its norms handing on
each rank's local tensor (`use_local_output=True`), which the next module's plan makes a DTensor again. `TP_BUG` plants one bug a porter makes in a sharding plan or a sharded module:

- "" (default): the plan is right; the sharded reductions round differently (verdict `noise`).
- "partial": the MLP's down projection's output is left `Partial` (`use_local_output=True` on a
  rowwise plan without its reduction): each rank goes on with its own partial sum.
- "global_heads": attention reshapes its local q/k/v with the global head count.
- "bias_every_rank": the attention output's bias is added to every rank's partial sum before the
  reduction, which then adds it N times.
- "qk_norm_on_shard" (with `TP_QK_NORM=1`, which gives attention RMSNorms of q and k over the whole
  width, as OLMo-2 has): each rank normalizes its own columns of q and k instead of gathering them first.

`TP_FAULT` makes one rank fail: "raise" (rank 1 raises in the forward), "extra_op" (rank 1 runs
one op more than the others), "order" (rank 1 runs the same two ops the other way round), "die" (rank 1's
process exits), "hang" (rank 1 waits in a collective the others never join).
"""
import os

LAYERS, WIDTH, HEADS, VOCAB, TOKENS = 2, 32, 4, 64, 6


def _decoder(sharded: bool):
    import torch
    from torch import nn

    bug = os.environ.get("TP_BUG", "")
    fault = os.environ.get("TP_FAULT", "")
    world = int(os.environ.get("WORLD_SIZE", "1")) if sharded else 1

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(WIDTH, WIDTH, bias=False)
            self.k_proj = nn.Linear(WIDTH, WIDTH, bias=False)
            self.v_proj = nn.Linear(WIDTH, WIDTH, bias=False)
            self.o_proj = nn.Linear(WIDTH, WIDTH)
            self.heads = HEADS if bug == "global_heads" else HEADS // world
            qk_norm = os.environ.get("TP_QK_NORM") == "1"
            self.q_norm, self.k_norm = (nn.RMSNorm(WIDTH), nn.RMSNorm(WIDTH)) if qk_norm else (None, None)
            self.mesh = None  # the device mesh, once sharded

        def forward(self, x):
            batch, tokens, _ = x.shape
            q, k, v = (proj(x) for proj in (self.q_proj, self.k_proj, self.v_proj))
            if self.q_norm is not None:
                q, k = self.normed(self.q_norm, q), self.normed(self.k_norm, k)
            q, k, v = (t.view(batch, tokens, self.heads, -1).transpose(1, 2) for t in (q, k, v))
            attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            merged = attended.transpose(1, 2).reshape(batch, tokens, -1)
            if self.mesh is not None and bug == "bias_every_rank":  # @bias_every_rank
                from torch.distributed.tensor import DTensor, Partial, Replicate

                partial = nn.functional.linear(merged, self.o_proj.weight.to_local()) + self.o_proj.bias.to_local()
                return DTensor.from_local(partial, self.mesh, [Partial()]).redistribute(self.mesh, [Replicate()]).to_local()
            return self.o_proj(merged)

        def normed(self, norm, projected):
            """The q or k projection normalized over the whole width; sharded, this rank's columns of it."""
            if self.mesh is None:
                return norm(projected)
            if bug == "qk_norm_on_shard":
                return nn.functional.rms_norm(projected, projected.shape[-1:], norm.weight[: projected.shape[-1]])  # @qk_norm_on_shard
            from torch.distributed.tensor import DTensor, Shard

            whole = DTensor.from_local(projected, self.mesh, [Shard(2)]).full_tensor()
            return norm(whole).chunk(world, dim=-1)[self.mesh.get_local_rank()]

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(WIDTH, 2 * WIDTH)
            self.down = nn.Linear(2 * WIDTH, WIDTH)

        def forward(self, x):
            return self.down(nn.functional.gelu(self.up(x)))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm = nn.RMSNorm(WIDTH)
            self.attention = Attention()
            self.mlp_norm = nn.RMSNorm(WIDTH)
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attention(self.attention_norm(x))
            return x + self.mlp(self.mlp_norm(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
            self.norm = nn.RMSNorm(WIDTH)
            self.head = nn.Linear(WIDTH, VOCAB, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            on_rank_1 = sharded and os.environ.get("RANK") == "1"
            if on_rank_1 and fault == "raise":
                raise RuntimeError("rank 1 cannot go on")  # @raise
            if on_rank_1 and fault == "extra_op":
                x = x * 1.0  # @extra_op
            if fault == "order":
                first, second = (x * 2.0, x * 0.5) if on_rank_1 else (x * 0.5, x * 2.0)  # @order
                halved, doubled = (second, first) if on_rank_1 else (first, second)
                x = halved + doubled
            if on_rank_1 and fault == "die":
                os._exit(7)  # @die
            if on_rank_1 and fault == "hang":
                torch.distributed.barrier()  # @hang: a collective the other ranks never join
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    model = Decoder().eval()
    tokens = torch.randint(0, VOCAB, (2, TOKENS), generator=torch.Generator().manual_seed(1))
    if sharded:
        _shard(model, world, bug)
    return model, (tokens,)


def _shard(model, world: int, bug: str) -> None:
    """Attention and MLP sharded over the heads and columns; with `TP_PLAN=sequence` also the
    embedding over the vocabulary and the norms and residual stream over the tokens (sequence
    parallel), as TorchTitan shards Llama."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    mesh = init_device_mesh("cpu", (world,))
    sequence = os.environ.get("TP_PLAN", "").startswith("sequence")
    norm = SequenceParallel(use_local_output=os.environ.get("TP_PLAN") == "sequence_local")
    tokens_out = {"output_layouts": Shard(1)} if sequence else {}
    if sequence:
        parallelize_module(model, mesh, {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                                         "norm": norm,
                                         "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
    for layer in model.layers:
        plan = {"attention.q_proj": ColwiseParallel(), "attention.k_proj": ColwiseParallel(),
                "attention.v_proj": ColwiseParallel(), "attention.o_proj": RowwiseParallel(**tokens_out),
                "mlp.up": ColwiseParallel(),
                "mlp.down": _left_partial() if bug == "partial" else RowwiseParallel(**tokens_out)}
        if sequence:
            gathered = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan |= {"attention_norm": norm, "mlp_norm": norm, "attention": gathered, "mlp": gathered}
        parallelize_module(layer, mesh, plan)
        layer.attention.mesh = mesh


def _left_partial():
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.parallel import RowwiseParallel

    return RowwiseParallel(output_layouts=Partial())


def reference():
    return _decoder(sharded=False)


def candidate():
    return _decoder(sharded=True)
