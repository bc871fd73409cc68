"""A tiny Hugging Face Mixtral against a second instance of itself, torch on both sides.

Its experts run `torch._grouped_mm`, which has no float64 kernel on CPU: the float64 check runs
those ops at float32 and lists them among the ops below float64.

Reference: `transformers.MixtralForCausalLM` from a random seeded config (2 layers, hidden 32, 4 query /
2 key-value heads, 4 experts of intermediate 64, 2 per token, vocab 64), eval, input_ids (2, 16),
`use_cache=False`; transformers 5 runs each layer's experts (`MixtralExperts`, stacked weights) with
grouped matrix products. Candidate: another build from the same seed.
`candidate_expert_gelu()` gives layer 1 experts of a porter's own class (`ExpertGeluMixtralExperts`,
SiLU written out as `x * sigmoid(x)`) in which expert 2 applies the exact GELU instead (the line marked
`# @gelu`); 18 of the 64 (token, expert) rows of that layer go to expert 2.

Measured here: `candidate()` gives bit-identical logits; `candidate_expert_gelu()` differs by 6.8e-04
at magnitude 0.38 (1.8e-03 relative).

bisectr should conclude: `match` for `candidate()`; `divergent` for `candidate_expert_gelu()`, culprit the
activation of `model.layers.1.mlp.experts`.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402


CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64)
GELU_LAYER, GELU_EXPERT = 1, 2


def _inputs():
    import torch

    ids = np.random.default_rng(0).integers(1, CONFIG["vocab_size"], size=(2, 16))
    return {"input_ids": torch.from_numpy(ids), "use_cache": False}


def _mixtral():
    hide_broken_torchcodec()
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    return MixtralForCausalLM(MixtralConfig(**CONFIG)).eval()


def reference():
    return _mixtral(), _inputs()


def candidate():
    return _mixtral(), _inputs()


def candidate_expert_gelu():
    """The same weights, but layer 1's expert 2 applies GELU instead of SiLU."""
    import torch
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    class ExpertGeluMixtralExperts(MixtralExperts):
        """Experts whose expert `GELU_EXPERT` applies the exact GELU. The grouped forward sorts the
        (token, expert) rows by expert and hands them all to `_apply_gate` at once."""

        def forward(self, hidden_states, top_k_index, top_k_weights):
            self.gelu_rows = torch.sort(top_k_index.reshape(-1)).values == GELU_EXPERT
            return super().forward(hidden_states, top_k_index, top_k_weights)

        def _apply_gate(self, gate_up_out):
            gate, up = gate_up_out.chunk(2, dim=-1)
            silu = gate * torch.sigmoid(gate)
            activated = torch.where(self.gelu_rows[:, None], torch.nn.functional.gelu(gate), silu)  # @gelu
            return activated * up

    model, inputs = _mixtral(), _inputs()
    moe = model.model.layers[GELU_LAYER].mlp
    experts = ExpertGeluMixtralExperts(model.config)
    experts.load_state_dict(moe.experts.state_dict())
    moe.experts = experts.eval()
    return model, inputs
