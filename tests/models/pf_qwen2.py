"""A tiny Hugging Face Qwen2 (torch) against PaddleFormers' Qwen2 (paddle) with q/k/v fused, one checkpoint for both.

Reference: `transformers.Qwen2ForCausalLM` (4 layers, hidden 64, 4 query / 2 key-value heads (GQA),
head_dim 16, intermediate 128, vocab 128, eager attention, untied head, biases on q/k/v as Qwen2 has).
Both sides load the same random checkpoint, made from the config alone with numpy (`_checkpoint()`,
seed 0, Hugging Face names and torch layouts): norms 1 + 0.1 N(0, 1), embeddings N(0, 1),
projections N(0, 1/fan_in) (q/k at x3, the head at x2, for peaked attention and logits), and the
q/k/v biases N(0, 0.1^2), so a lost one shows. Inputs: input_ids (2, 16) from `default_rng(0)`.

Candidate: PaddleFormers 1.2.0's own Qwen2, `Qwen2ForCausalLMDeprecated`. (Its `Qwen2ForCausalLM`
is a factory that builds paddlefleet's `GPTModel`, and `qwen2/modeling.py` imports
`paddleformers.transformers.gpt_provider`, which raises ImportError without `paddlefleet`, a package
that is not on PyPI: `_paddleformers_qwen2()` stands an empty module in for `gpt_provider` when it
cannot import.) That Qwen2 always fuses (no config switch): `self_attn.qkv_proj` is one Linear
64 -> 128 and `mlp.up_gate_proj` one Linear 64 -> 256 (`Qwen2MLP(config, fuse_up_gate=True)`,
modeling.py:264; `chunk(2)` takes gate first, nn/mlp.py:112). The fused qkv layout is grouped by
key-value head: for each of the 2 kv heads g, [its G = 2 query heads | k head g | v head g], i.e.
[q0 q1 k0 v0 | q2 q3 k1 v1] in units of head_dim, from
`paddleformers/transformers/qwen2/modeling.py:212-217`:

    target_shape = [0, 0, self.num_key_value_heads, (self.num_key_value_groups + 2) * self.head_dim]
    query_states, key_states, value_states = paddle.split(mix_layer,
        num_or_sections=[self.num_key_value_groups * self.head_dim, self.head_dim, self.head_dim], axis=-1)

(the same order as the `fused_qkv` macro of its checkpoint converter, paddle's
`distributed/flex_checkpoint/aoa/macros.py:648-654`). `_paddle_state()` builds PaddleFormers' names
with torch layouts (fused rows), and `bisectr.weights.torch_to_paddle` transposes every Linear
(out, in) -> (in, out) and keeps the `LMHead` (vocab, hidden) as stored. PaddleFormers' fused
RMSNorm kernel is not built for CPU, so the candidate sets `fuse_rms_norm=False`.

- `candidate()`: the correct port.
- `candidate_k_bias_missing()`: layer 2's k bias is not copied into the fused bias (left zero);
  line tagged `@k_bias`.
- `candidate_naive_qkv_order()`: q, k, v concatenated naively, [all q | all k | all v], in every
  layer (weights and biases); line tagged `@naive_qkv`.

Run it with each side in its own process (as `examples/hf_llama.py`: `paddlecodec` breaks
transformers' torch models in an environment with paddleformers):

    bisectr bisect tests/models/pf_qwen2.py --isolate --reference-python HF_VENV/bin/python

bisectr should conclude: `noise` for `candidate()`; `divergent` for the other two, at layer 2's
`self_attn.qkv_proj` (the leaf `model.layers.2.self_attn.qkv_proj.bias`) and at layer 0's
`self_attn.qkv_proj` (every layer's `qkv_proj` weight and bias permuted by blocks) respectively.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402


CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
              tie_word_embeddings=False)
HEAD_DIM = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
GROUPS = CONFIG["num_attention_heads"] // CONFIG["num_key_value_heads"]  # query heads per kv head
# Trained models have peaked attention and logits; plain random weights give flat ones.
TRAINED_SCALE = {"q_proj": 3.0, "k_proj": 3.0, "lm_head": 2.0}
BIAS_STD = 0.1
K_BIAS_LAYER = 2


def _input_ids():
    return np.random.default_rng(0).integers(1, CONFIG["vocab_size"], size=(2, 16))


def _shapes() -> dict:
    """Parameter name -> shape of `transformers.Qwen2ForCausalLM` (untied head), torch layouts."""
    hidden, inner, vocab = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["vocab_size"]
    kv = CONFIG["num_key_value_heads"] * HEAD_DIM
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for layer in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update({
            p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.q_proj.bias": (hidden,),
            p + "self_attn.k_proj.weight": (kv, hidden), p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (inner, hidden), p + "mlp.up_proj.weight": (inner, hidden),
            p + "mlp.down_proj.weight": (hidden, inner),
            p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
        })
    shapes.update({"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)})
    return shapes


def _checkpoint(seed: int = 0) -> dict:
    """The Hugging Face checkpoint both sides load (float32 numpy, torch layouts)."""
    rng = np.random.RandomState(seed)
    checkpoint = {}
    for name, shape in _shapes().items():
        if name.endswith("norm.weight"):
            values = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            values = BIAS_STD * rng.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            values = rng.standard_normal(shape)
        else:
            scale = next((s for key, s in TRAINED_SCALE.items() if key in name), 1.0)
            values = rng.standard_normal(shape) * scale / np.sqrt(shape[1])
        checkpoint[name] = values.astype(np.float32)
    return checkpoint


def _fuse_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """PaddleFormers' fused qkv rows (axis 0: a torch-layout weight or a bias): per kv head g,
    [query heads g*G .. g*G+G-1 | k head g | v head g]."""
    blocks = []
    for g in range(CONFIG["num_key_value_heads"]):
        blocks += [q[g * GROUPS * HEAD_DIM:(g + 1) * GROUPS * HEAD_DIM],
                   k[g * HEAD_DIM:(g + 1) * HEAD_DIM], v[g * HEAD_DIM:(g + 1) * HEAD_DIM]]
    return np.concatenate(blocks, axis=0)


def _paddle_state(checkpoint: dict, k_bias_missing: bool = False, naive_qkv: bool = False) -> dict:
    """The checkpoint under PaddleFormers' Qwen2 names, fused, still in torch layouts."""
    state = {}
    for name, value in checkpoint.items():
        if ".self_attn.q_proj." in name or ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".mlp.gate_proj." in name or ".mlp.up_proj." in name:
            continue
        state[name] = value
    for layer in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        for kind in ("weight", "bias"):
            q, k, v = (checkpoint[f"{p}self_attn.{x}_proj.{kind}"] for x in "qkv")
            if kind == "bias" and k_bias_missing and layer == K_BIAS_LAYER:
                k = np.zeros_like(k)  # @k_bias
            if naive_qkv:
                fused = np.concatenate([q, k, v], axis=0)  # @naive_qkv
            else:
                fused = _fuse_qkv(q, k, v)
            state[f"{p}self_attn.qkv_proj.{kind}"] = fused
        state[p + "mlp.up_gate_proj.weight"] = np.concatenate(
            [checkpoint[p + "mlp.gate_proj.weight"], checkpoint[p + "mlp.up_proj.weight"]], axis=0)
    return state


def reference():
    hide_broken_torchcodec()
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bisectr.weights import copy_weights

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**CONFIG, attn_implementation="eager")).eval()
    copy_weights(_checkpoint(), model).check()
    return model, {"input_ids": torch.from_numpy(_input_ids()), "use_cache": False}


def _paddleformers_qwen2():
    """PaddleFormers' own Qwen2 classes, importable without paddlefleet."""
    import sys
    import types

    try:
        import paddleformers.transformers.gpt_provider  # noqa: F401
    except ImportError:  # needs paddlefleet; Qwen2ForCausalLMDeprecated does not use it
        stub = types.ModuleType("paddleformers.transformers.gpt_provider")
        stub.GPTModelProvider = type("GPTModelProvider", (), {})
        sys.modules["paddleformers.transformers.gpt_provider"] = stub
    from paddleformers.transformers.qwen2.configuration import Qwen2Config
    from paddleformers.transformers.qwen2.modeling import Qwen2ForCausalLMDeprecated

    return Qwen2Config, Qwen2ForCausalLMDeprecated


def candidate(k_bias_missing: bool = False, naive_qkv: bool = False):
    import paddle

    from bisectr.weights import torch_to_paddle

    Qwen2Config, Qwen2ForCausalLM = _paddleformers_qwen2()
    paddle.seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**CONFIG, fuse_rms_norm=False))
    torch_to_paddle(_paddle_state(_checkpoint(), k_bias_missing, naive_qkv), model).check()
    model.eval()
    return model, {"input_ids": paddle.to_tensor(_input_ids()), "use_cache": False, "return_dict": True}


def candidate_k_bias_missing():
    """The port with layer 2's k bias left zero in its fused qkv bias."""
    return candidate(k_bias_missing=True)


def candidate_naive_qkv_order():
    """The port with q, k, v concatenated as [all q | all k | all v] in every layer."""
    return candidate(naive_qkv=True)
