"""A tiny Hugging Face Llama on one device against itself sharded with `parallelize_module`.

Reference: `transformers.LlamaForCausalLM` from a random seeded config (2 layers, hidden 64, 4 query
/ 2 key-value heads, eager attention), input_ids (2, 8) from `default_rng(0)`, `use_cache=False`.
Candidate (run with `--candidate-nproc 2`): the same weights with every layer's q/k/v and gate/up
projections column-parallel and o/down projections row-parallel, as Megatron and TorchTitan shard
a decoder: correct, the sharded reductions round differently (`noise`). `TP_BUG=forgotten_reduce`
plants a bug in the plan: the attention's o_proj is row-parallel but its output is left a partial
sum on each rank (`output_layouts=Partial()`), the all-reduce forgotten. `TP_PLAN=torchtitan` shards the
embedding and the head too, as TorchTitan's Llama plan does: the embedding row-parallel over a replicated
input (`RowwiseParallel(input_layouts=Replicate())`: each rank looks up the rows of its vocabulary half, the
output an all-reduce), the head column-parallel gathered whole (`ColwiseParallel(output_layouts=Replicate())`).
`TP_MLP=local` computes each MLP by hand on this rank's gate/up columns and down rows (the weights sharded by the
same plan): its input made a replicated DTensor and taken local with its gradient's reduction
(`to_local(grad_placements=[Partial()])`), correct; `TP_BUG=unreduced_mlp` takes it local without, so that the
backward hands each rank's own part of the input's gradient on as if it were the whole (forward unchanged).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import tiny_llama  # noqa: E402


def reference():
    return tiny_llama()


def candidate():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model, inputs = tiny_llama()
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    forgotten = os.environ.get("TP_BUG") == "forgotten_reduce"
    if os.environ.get("TP_PLAN") == "torchtitan":
        parallelize_module(model, mesh, {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
                                         "lm_head": ColwiseParallel(output_layouts=Replicate())})
    for layer in model.model.layers:
        parallelize_module(layer, mesh, {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(), "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Partial()) if forgotten else RowwiseParallel(),  # @plan
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel(),
        })
        if os.environ.get("TP_MLP") == "local" or os.environ.get("TP_BUG") == "unreduced_mlp":
            _on_own_columns(layer.mlp, mesh, reduced=os.environ.get("TP_BUG") != "unreduced_mlp")
    return model, inputs


def _on_own_columns(mlp, mesh, reduced):
    import types

    from torch.distributed.tensor import DTensor, Partial, Replicate
    from torch.nn.functional import linear

    def forward(self, x):
        whole = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
        rows = whole.to_local(grad_placements=[Partial()]) if reduced else whole.to_local()  # @unreduced_mlp
        gate, up = linear(rows, self.gate_proj.weight.to_local()), linear(rows, self.up_proj.weight.to_local())
        own = linear(self.act_fn(gate) * up, self.down_proj.weight.to_local())
        return DTensor.from_local(own, mesh, [Partial()]).full_tensor()

    mlp.forward = types.MethodType(forward, mlp)
