"""A tiny Hugging Face Llama on one device against itself loaded on 2 ranks with Hugging Face's own tensor
parallelism (`from_pretrained(..., tp_plan="auto")`: the model's `base_model_tp_plan`, applied by transformers'
own parallel styles, needs `accelerate`).

Reference: `_hf.tiny_llama()` (2 layers, hidden 64, 4 query / 2 key-value heads). Candidate: its state dict
written to a checkpoint folder of the rank's own, then loaded from there with `tp_plan="auto"` (NPROC: 2
ranks): correct, the sharded reductions round differently (`noise`). `candidate_o_proj_transposed()`: the
checkpoint holds layer 1's `o_proj.weight` transposed (a converter's mistake, line marked `# @transposed`).
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import tiny_llama  # noqa: E402

NPROC = {"candidate": 2, "candidate_o_proj_transposed": 2}


def reference():
    return tiny_llama()


def candidate(transposed: str | None = None):
    import torch
    import transformers
    from safetensors.torch import save_file

    model, inputs = tiny_llama()
    state = {name: value.contiguous() for name, value in model.state_dict().items()}
    if transposed is not None:
        state[transposed] = state[transposed].T.contiguous()  # @transposed
    with tempfile.TemporaryDirectory(prefix="bisectr_tp_plan_") as folder:  # each rank's own
        save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        model.config.save_pretrained(folder)
        config = transformers.DistributedConfig(tp_plan="auto")
        sharded = transformers.LlamaForCausalLM.from_pretrained(folder, distributed_config=config, dtype=torch.float32)
    return sharded.eval(), inputs


def candidate_o_proj_transposed():
    """The checkpoint's layer 1 attention output weight transposed."""
    return candidate("model.layers.1.self_attn.o_proj.weight")
