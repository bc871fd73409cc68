"""A random Hugging Face Llama checkpoint (numpy only), for `hf_llama.py`.

Both sides of that example load the same checkpoint, each in its own framework (and, with
`--isolate`, in its own process, where the other framework may not even import), so the weights
are made from the config alone: Hugging Face's parameter names and torch layouts, as a real
`model.safetensors` would hold them.
"""
from __future__ import annotations

import numpy as np

# Trained models have peaked attention and logits; plain random weights give flat ones.
TRAINED_SCALE = {"q_proj": 3.0, "k_proj": 3.0, "lm_head": 2.0}


def llama_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of `transformers.LlamaForCausalLM` (untied head), torch layouts."""
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * hidden // config["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        shapes.update({
            prefix + "self_attn.q_proj.weight": (hidden, hidden),
            prefix + "self_attn.k_proj.weight": (kv, hidden),
            prefix + "self_attn.v_proj.weight": (kv, hidden),
            prefix + "self_attn.o_proj.weight": (hidden, hidden),
            prefix + "mlp.gate_proj.weight": (inner, hidden),
            prefix + "mlp.up_proj.weight": (inner, hidden),
            prefix + "mlp.down_proj.weight": (hidden, inner),
            prefix + "input_layernorm.weight": (hidden,),
            prefix + "post_attention_layernorm.weight": (hidden,),
        })
    shapes.update({"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)})
    return shapes


def llama_checkpoint(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """float32 weights: norms near 1, embeddings ~N(0, 1), projections ~N(0, 1/fan_in) at trained scale."""
    rng = np.random.RandomState(seed)
    checkpoint = {}
    for name, shape in llama_shapes(config).items():
        if name.endswith("norm.weight"):
            values = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            values = rng.standard_normal(shape)
        else:
            scale = next((s for key, s in TRAINED_SCALE.items() if key in name), 1.0)
            values = rng.standard_normal(shape) * scale / np.sqrt(shape[1])
        checkpoint[name] = values.astype(np.float32)
    return checkpoint
