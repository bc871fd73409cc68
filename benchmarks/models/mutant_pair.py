"""bisectr model file for one case of the seeded-bug benchmark (`benchmarks/mutants.py`), named in the
environment: `BISECTR_MUTANT=FAMILY:OPERATOR:SEED[:FORM]`, e.g. `llama:rows_permuted:3:sdpa`.

- `reference()`: the family's Hugging Face model (`families.build`), eager attention.
- `candidate()`: the same class built again (FORM `copy`, the default), or with its attention run by
  `scaled_dot_product_attention` (FORM `sdpa`: another op graph, with fused attention), its weights handed
  over from the reference's state dict by a converter (a plain copy), then OPERATOR planted at a site drawn by
  `random.Random(SEED)` (`mutations.OPERATORS`); FORM `compiled` then `torch.compile`s it (inductor), for
  the compiler bugs of the `compile` operators. FORM `kv_widened` (families with grouped-query attention):
  the class built with a key-value head per query head, the converter repeating each key-value head's
  rows in place (h0 h0 h1 h1), as a port without grouped-query attention loads a checkpoint with it;
  for the `widen` operators, converter mistakes in that widening. FORM `decode` (causal LMs): both sides
  run inside a port's greedy decoding loop with a KV cache (`decoding.py`), the candidate's loop with a
  `decode` operator's mistake in it. The controls plant nothing: `none` (the copy as it is),
  `bfloat16` (the copy run in bfloat16, its outputs cast back to float32). FORM `paddle` is `candidate_paddle()`:
the family's PaddleFormers port (`paddle_ports.py`), its checkpoint the copy's state dict with a converter's
mistake (a `weight` operator) in it, written by `benchmarks/mutants.py`; FORM `tp` is `candidate_tp()`, on 2 ranks
(`NPROC`): the copy sharded as TorchTitan shards a decoder, with a `weight` operator's mistake or a `tp` operator's
change to the plan; FORM `sp` is the same plan with sequence parallel, with a `weight` operator's mistake; its `bfloat16` control loads that
checkpoint rounded to bfloat16 (paddle has no bfloat16 matmul on the CPU).

`BISECTR_MUTANT_DEVICE` (default `cpu`) is where the candidate runs, e.g. `cuda`: the reference stays on the CPU.

    BISECTR_MUTANT=gpt2:transposed:0 bisectr bisect benchmarks/models/mutant_pair.py
"""
from __future__ import annotations

import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decoding import greedy_decoding  # noqa: E402
from families import build  # noqa: E402
from mutations import OPERATORS, Site  # noqa: E402

CONTROLS = ("none", "bfloat16")
DEVICE = "BISECTR_MUTANT_DEVICE"
FORMS = ("copy", "sdpa", "compiled", "kv_widened", "paddle", "tp", "sp", "decode")
NPROC = {"candidate_tp": 2}  # the tp and sp forms' ranks
PORT_CHECKPOINT = "BISECTR_MUTANT_CHECKPOINT"  # the folder the harness wrote the paddle form's checkpoint into


def spec() -> tuple[str, str, int, str]:
    family, operator, seed, *form = os.environ["BISECTR_MUTANT"].split(":")
    return family, operator, int(seed), (form or ["copy"])[0]


def reference():
    family, _, _, form = spec()
    return built_reference(family, form)


def built_reference(family: str, form: str):
    """`(model, inputs)` of the reference: the family's model, in form `decode` inside the decoding loop."""
    model, inputs = build(family)
    return in_decoding_loop(model, inputs) if form == "decode" else (model, inputs)


def in_decoding_loop(model, inputs: dict):
    """`(model, inputs)` of a causal LM inside the decoding loop, which reads the prompt's ids only."""
    return greedy_decoding(model), {"input_ids": inputs["input_ids"]}


def mutant(family: str, operator: str, seed: int, form: str = "copy"):
    """`(model, inputs, site)`: the candidate of this case (`site` None for a control)."""
    model, inputs = build(family)
    state = model.state_dict()
    if form == "kv_widened":
        candidate_model, _ = build(family, kv_heads=model.config.num_attention_heads)
        candidate_model.load_state_dict(widened_kv(state, model.config))
        candidate_model.kv_heads_widened_from = model.config.num_key_value_heads  # for the `widen` operators
    else:
        candidate_model, _ = build(family, "sdpa" if form == "sdpa" else "eager")
        candidate_model.load_state_dict({name: values.clone() for name, values in state.items()})
    if form == "decode":
        candidate_model, inputs = in_decoding_loop(candidate_model, inputs)
    compiled = form == "compiled"
    site: Site | None = None
    if operator == "bfloat16":
        candidate_model = _in_bfloat16(candidate_model)
    elif operator != "none":
        site = OPERATORS[operator].apply(candidate_model, random.Random(seed))
    return (_compiled(candidate_model) if compiled else candidate_model), inputs, site


def widened_kv(state: dict, config) -> dict:
    """The state dict with every key-value head's rows repeated in place, one copy per query head of its
    group (k_proj and v_proj weights and biases; the k and v parts of Phi-3's fused qkv_proj)."""
    import torch

    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads

    def widen(rows):
        return rows.unflatten(0, (kv_heads, head_dim)).repeat_interleave(heads // kv_heads, dim=0).flatten(0, 1)

    widened = {}
    for name, values in state.items():
        if re.search(r"\.(k|v)_proj\.(weight|bias)$", name):
            values = widen(values)
        elif name.endswith("qkv_proj.weight"):
            q, k, v = values.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])
            values = torch.cat([q, widen(k), widen(v)])
        widened[name] = values.clone()
    return widened


def _compiled(model):
    import torch

    return torch.compile(model)


def _in_bfloat16(model):
    import torch

    class InBfloat16(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner.to(torch.bfloat16)

        def forward(self, **inputs):
            inputs = {k: v.to(torch.bfloat16) if torch.is_tensor(v) and torch.is_floating_point(v) else v
                      for k, v in inputs.items()}
            out = self.inner(**inputs)
            return out.float() if torch.is_tensor(out) else {k: v.float() for k, v in out.items() if torch.is_tensor(v)}

    return InBfloat16(model)


def on_candidate_device(model, inputs: dict):
    """`(model, inputs)` moved to the candidate's device (`BISECTR_MUTANT_DEVICE`)."""
    import torch

    device = os.environ.get(DEVICE, "cpu")
    return model.to(device), {k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()}


def candidate():
    model, inputs, _ = mutant(*spec())
    return on_candidate_device(model, inputs)


def candidate_tp():
    """The case's candidate in form `tp` (or `sp`): the copy (with a `weight` operator's mistake in it) sharded
    over the ranks by `tensor_parallel` (with its sequence parallel), its plan changed by a `tp` operator."""
    family, operator, seed, form = spec()
    kind = OPERATORS[operator].kind if operator in OPERATORS else "control"
    model, inputs, _ = mutant(family, operator if kind != "tp" else "none", seed)
    if kind == "tp":
        OPERATORS[operator].apply(model, random.Random(seed))
    return tensor_parallel(model, getattr(model, "tp_plan_changes", {}), sequence_parallel=form == "sp"), inputs


def tensor_parallel(model, changes: dict[str, str], sequence_parallel: bool = False):
    """`model` sharded over the ranks as TorchTitan shards a decoder: the embedding over the vocabulary (each
    rank looks up the ids of its half, an all-reduce completes the rows), each layer's projections as
    `families.tensor_parallel_layout` says (q/k/v and gate/up column-parallel, o and down row-parallel), the
    head column-parallel gathered whole. A fused gate_up projection is packed: its rows are reordered so that
    each rank's part holds its gate rows then its up rows, which the MLP's `chunk` splits as the whole
    splits. `changes`: module -> "partial" (a row-parallel output's all-reduce left out), "reduced_twice"
    (all-reduced once more), "interleaved" (the head's vocabulary parts gathered along the wrong dim) or
    "as_stored" (a fused projection sharded as stored, not packed). `sequence_parallel`: between the
    projections the hidden states stay split along the sequence, as TorchTitan's plan with sequence
    parallel splits them: the embedding and the row-parallel projections reduce-scatter their outputs,
    every norm runs on its part of the sequence, the column-parallel projections and the head gather it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    from families import norms, tensor_parallel_layout

    ranks = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (ranks,))
    names = {module: name for name, module in model.named_modules()}
    built = getattr(model, "inner", model)  # the bfloat16 control's model inside its wrapper
    embedding, head = names[built.get_input_embeddings()], names[built.get_output_embeddings()]
    split = {"output_layouts": Shard(1), "use_local_output": False} if sequence_parallel else {}
    gathered = {"input_layouts": Shard(1)} if sequence_parallel else {}
    plan = {embedding: RowwiseParallel(input_layouts=Replicate(), **split),
            head: ColwiseParallel(output_layouts=Shard(-1) if changes.get(head) == "interleaved" else Replicate(), **gathered)}
    if sequence_parallel:
        plan.update({name: SequenceParallel() for name in norms(model)})
    for name, style in tensor_parallel_layout(model).items():
        if style == "rowwise":
            plan[name] = RowwiseParallel(output_layouts=Partial()) if changes.get(name) == "partial" else RowwiseParallel(**split)
        else:
            plan[name] = ColwiseParallel(**gathered)
            if style == "packed_colwise" and changes.get(name) != "as_stored":
                _packed(model.get_submodule(name), ranks)
    parallelize_module(model, mesh, plan)
    for name, change in changes.items():
        if change == "reduced_twice":
            model.get_submodule(name).register_forward_hook(lambda module, args, out: _all_reduced(out, dist))
        elif change == "interleaved":
            model.get_submodule(name).register_forward_hook(lambda module, args, out: _gathered_interleaved(out, dist))
    return model


def _packed(linear, ranks: int) -> None:
    """Rows [gate; up] reordered as [gate_0; up_0; gate_1; up_1; ...]: rank r's equal part is [gate_r; up_r]."""
    import torch

    with torch.no_grad():
        for p in (linear.weight, linear.bias):
            if p is not None:
                p.copy_(p.reshape(2, ranks, -1, *p.shape[1:]).transpose(0, 1).reshape(p.shape).clone())


def _all_reduced(tensor, dist):
    reduced = tensor.clone()
    dist.all_reduce(reduced)  # @reduced_twice
    return reduced


def _gathered_interleaved(local, dist):
    """Each rank's columns gathered, stacked along a new last dim and flattened: column i of rank r lands at
    i * ranks + r, not at r * columns + i."""
    import torch

    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.contiguous())
    return torch.stack(parts, dim=-1).flatten(-2)  # @interleaved


def candidate_paddle():
    """The case's candidate in form `paddle`: the family's PaddleFormers port, loaded from the checkpoint the
    harness wrote (the copy with a `weight` operator's mistake in it)."""
    from pathlib import Path

    from paddle_ports import port

    family, operator, _, _ = spec()
    return port(family, Path(os.environ[PORT_CHECKPOINT]), "bfloat16" if operator == "bfloat16" else None)
