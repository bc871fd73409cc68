"""PaddleFormers ports of the benchmark's families (form `paddle`): where each holds a Hugging Face weight, and the
port built from a converted checkpoint.

The harness (`benchmarks/mutants.py`, in an environment with transformers) writes the candidate's checkpoint,
the Hugging Face model's state dict after the converter's mistake, into a folder (`write_checkpoint`); the
candidate (`mutant_pair.candidate_paddle`, in an environment with PaddleFormers, which cannot import
transformers' torch models) builds the family's PaddleFormers model with the same config and loads it
through `bisectr.weights.torch_to_paddle`:

- `llama`: `paddleformers.transformers.LlamaForCausalLM`, weights as Hugging Face names them.
- `qwen2`: PaddleFormers' own Qwen2 (`Qwen2ForCausalLMDeprecated`), which always fuses: `qkv_proj` holds,
  per key-value head g, [its query heads | k head g | v head g], and `up_gate_proj` holds gate, then up.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "models"))

# Hugging Face config fields a port takes as they are.
CONFIG_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings")
FUSED = {"qwen2": {r"self_attn\.[qkv]_proj": "self_attn.qkv_proj", r"mlp\.(gate|up)_proj": "mlp.up_gate_proj"}}
PORTED = ("llama", "qwen2")


def ported_name(family: str, name: str) -> str:
    """The port's name of the parameter (or its module) that holds Hugging Face's `name`."""
    for pattern, fused in FUSED.get(family, {}).items():
        name = re.sub(pattern, fused, name)
    return name


def write_checkpoint(folder: Path, model, inputs: dict) -> None:
    """`model`'s state dict, its config and `inputs` as the port reads them (numpy, torch layouts)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "weights.npz", **{name: values.detach().float().numpy() for name, values in model.state_dict().items()})
    np.savez(folder / "inputs.npz", **{name: value.numpy() for name, value in inputs.items() if hasattr(value, "numpy")})
    config = {field: getattr(model.config, field) for field in CONFIG_FIELDS}
    config["rope_theta"] = model.config.rope_parameters["rope_theta"]
    (folder / "config.json").write_text(json.dumps(config))


def port(family: str, folder: Path, rounded_to: str | None = None):
    """`(model, inputs)`: family's PaddleFormers model loaded from the checkpoint in `folder`, its weights
    rounded to `rounded_to` where given (a checkpoint saved in bfloat16 loaded by a float32 port: paddle
    has no bfloat16 matmul on the CPU)."""
    import paddle

    from bisectr.weights import torch_to_paddle

    config = json.loads((folder / "config.json").read_text())
    with np.load(folder / "weights.npz") as stored:
        weights = dict(stored)
    if rounded_to:
        weights = {name: paddle.to_tensor(values).astype(rounded_to).astype("float32").numpy() for name, values in weights.items()}
    with np.load(folder / "inputs.npz") as stored:
        inputs = {name: paddle.to_tensor(values) for name, values in stored.items()}
    paddle.seed(0)
    if family == "llama":
        from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**config, fuse_rms_norm=False))
    elif family == "qwen2":
        from pf_qwen2 import _paddleformers_qwen2

        Qwen2Config, Qwen2ForCausalLM = _paddleformers_qwen2()
        model = Qwen2ForCausalLM(Qwen2Config(**config, fuse_rms_norm=False))
        weights = _fused_qwen2(weights, config)
    else:
        raise ValueError(f"no PaddleFormers port of {family!r} here (ported: {', '.join(PORTED)})")
    torch_to_paddle({name: values for name, values in weights.items() if not name.endswith("inv_freq")}, model).check()
    model.eval()
    return model, {**inputs, "use_cache": False, "return_dict": True}


def _fused_qwen2(weights: dict, config: dict) -> dict:
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, groups = config["hidden_size"] // heads, heads // kv_heads
    fused = {name: values for name, values in weights.items() if not re.search(r"\.(self_attn\.[qkv]|mlp\.(gate|up))_proj\.", name)}
    for name in weights:
        if ".self_attn.q_proj." in name:
            q, k, v = (weights[name.replace(".q_proj.", f".{x}_proj.")] for x in "qkv")
            blocks = []
            for g in range(kv_heads):
                blocks += [q[g * groups * head_dim:(g + 1) * groups * head_dim], k[g * head_dim:(g + 1) * head_dim],
                           v[g * head_dim:(g + 1) * head_dim]]
            fused[name.replace(".q_proj.", ".qkv_proj.")] = np.concatenate(blocks, axis=0)
        elif ".mlp.gate_proj." in name:
            fused[name.replace(".gate_proj.", ".up_gate_proj.")] = np.concatenate(
                [weights[name], weights[name.replace(".gate_proj.", ".up_proj.")]], axis=0)
    return fused
