"""The regression corpus: every example and third-party pair with the verdict and culprit it must keep.

Each `Pair` names a model file (relative to the repository), its two functions and what bisectr must
conclude: `noise` (rounding, or `match`), `divergent` with the culprit confirmed at the planted place,
`unconfirmed` (`divergent` with the difference bracketed, the planted op among the bracket's ops), or
`nondeterministic` (a side that does not repeat itself, the op where its runs part in the module).
A generation pair (`tokens`) is run as `bisectr generate --tokens N` and judged on the step it searches
(`step`: where its culprit must be).
`tests/test_corpus.py` runs the pairs the environment has the libraries for; `benchmarks/corpus.py`
runs them as a user would and prints a row each (before and after a change: the same rows).
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Pair:
    model: str  # relative to the repository
    candidate: str = "candidate"
    reference: str = "reference"
    verdict: Literal["noise", "divergent", "unconfirmed", "nondeterministic"] = "noise"
    module: str | None = None  # the candidate module where the culprit (or, unconfirmed, a bracketed op) must be
    leaf: str | None = None  # the leaf the culprit must name
    # With `--backward`: the backward pass's verdict and culprit module, as above (None: forward only).
    backward: Literal["noise", "divergent", "unconfirmed"] | None = None
    backward_module: str | None = None
    needs: tuple[str, ...] = ()  # libraries beyond torch and paddle
    # A generation pair (`bisectr generate --tokens N`): its decode steps, and the step its culprit must be at.
    tokens: int | None = None
    step: int | None = None
    # Why bisectr does not conclude what the pair expects yet (its test is then expected to fail, strictly).
    known_miss: str = ""

    @property
    def name(self) -> str:
        functions = self.candidate if self.reference == "reference" else f"{self.reference}/{self.candidate}"
        return f"{Path(self.model).stem}:{functions}" + (f" --tokens {self.tokens}" if self.tokens else "")

    @property
    def path(self) -> Path:
        return ROOT / self.model

    def missing(self) -> list[str]:
        return [name for name in self.needs if importlib.util.find_spec(name) is None]


HF, PF = ("transformers",), ("transformers", "paddleformers")
M = "tests/models/"
# Ports written blind, from an architecture's description and its config, by writers who read neither bisectr nor the
# reference's modeling code (`tests/models/blind_*.py`): what each must conclude is the writer's `EXPECTED`.
BLIND = ("falcon_torch", "t5_torch", "resnet_paddle", "gemma2_paddle", "gpt_neox_paddle", "llama_generate_torch")
# Where bisectr does not conclude what the blind writer expected yet, and why.
CONTRADICTED = (
    "the correct port is noise, but op by op as recorded its own module tree leaves pairs whose values contradict "
    "them (the data-flow pairing runs only for a difference rounding does not explain)"
)
BLIND_MISSES: dict[tuple[str, str], str] = {
    ("falcon_torch", "candidate"): CONTRADICTED,
    ("t5_torch", "candidate"): CONTRADICTED,
    ("gemma2_paddle", "candidate"): CONTRADICTED + "; 88% of its ops paired",
    ("gpt_neox_paddle", "candidate"): CONTRADICTED + "; 86% of its ops paired",
    ("t5_torch", "candidate_gate_up_swapped"): "named at the feed-forward's block, confirmed, not at the swapped leaf",
    ("gemma2_paddle", "candidate_norm_plain_weight"): "right and confirmed in 19 re-runs, over the 12 of its budget",
    ("llama_generate_torch", "candidate_k_before_rope"): (
        "the prefill's key cache holds the unrotated keys: paired as a model output with the reference's rotated "
        "ones, its block takes in the rotary table and the query's projection, and no swap confirms"
    ),
    ("llama_generate_torch", "candidate_cache_layer"): (
        "each layer reads layer 0's cache entry: an input the reference's layer does not read, which no rule names"
    ),
}
# Where bisectr's contract answers otherwise than a blind writer expected, and why.
BLIND_DISAGREEMENTS = {
    # A cache kept in bfloat16 is a precision choice: the float64 check runs it in float64, and rounding explains it.
    ("llama_generate_torch", "candidate_cache_bf16"): "noise",
}


def blind_pairs(name: str) -> list["Pair"]:
    """The pairs of blind port `name`, from its model file's `EXPECTED` (read without importing it)."""
    path = ROOT / M / f"blind_{name}.py"
    tree = ast.parse(path.read_text())
    expected = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXPECTED"
    )
    pairs = []
    for function, what in expected.items():
        verdict = BLIND_DISAGREEMENTS.get((name, function), what["verdict"])
        divergent = verdict == "divergent"
        pairs.append(
            Pair(
                M + path.name,
                function,
                verdict=verdict,
                module=what.get("module") if divergent else None,
                leaf=what.get("leaf") if divergent else None,
                needs=HF,
                tokens=what.get("tokens"),
                step=what.get("step") if divergent else None,
                known_miss=BLIND_MISSES.get((name, function), ""),
            )
        )
    return pairs


CORPUS = [
    # bundled examples
    Pair("examples/compiled_model.py", verdict="divergent", module=""),
    Pair("examples/compiled_model.py", "candidate_fixed"),
    Pair("examples/correct_port.py"),
    Pair("examples/cube_root_fp64.py", verdict="divergent", module=""),
    Pair("examples/deep_stack.py"),
    Pair("examples/dropout_left_on.py", verdict="nondeterministic", module="blocks.0.drop"),
    Pair("examples/dropout_left_on.py", "candidate_downscale", verdict="divergent", module="blocks.0.drop"),
    Pair("examples/mask_fill.py"),
    Pair("examples/op_substitution.py"),
    Pair("examples/paddle_vs_paddle.py"),
    Pair("examples/paddle_vs_torch.py"),
    Pair("examples/reformer_local_attention.py"),
    Pair("examples/span_head.py"),
    Pair("examples/tanh_gelu.py", verdict="divergent", module="layers.7.ffn"),
    Pair("examples/torch_vs_torch_bf16.py"),
    Pair(
        "examples/untransposed_weight.py",
        verdict="divergent",
        module="blocks.1.attn.q_proj",
        leaf="blocks.1.attn.q_proj.weight",
    ),
    Pair("examples/wrong_eps.py", verdict="divergent", module="blocks.0.attn_norm"),
    # library layers and Hugging Face models against hand ports, and copies with one change
    Pair(M + "torch_mha.py"),
    Pair(M + "torch_mha.py", "candidate_wrong_scale", verdict="divergent", module="blocks.1.attn"),
    Pair(M + "paddle_resnet.py"),
    Pair(M + "paddle_resnet.py", "candidate_bn_eps", verdict="divergent", module="layer4.1.bn1"),
    Pair(M + "paddle_conv_bias.py"),
    Pair(M + "paddle_conv_bias.py", "candidate_wrong_bias", verdict="divergent", module="conv2"),
    # sides that do not repeat themselves
    Pair(M + "nondeterministic_torch.py", "candidate_uninitialised", verdict="nondeterministic", module="blocks.1"),
    Pair(M + "nondeterministic_paddle.py", "candidate_shuffle", verdict="nondeterministic", module="blocks.1"),
    Pair(M + "paddle_avgpool_exclusive.py"),
    Pair(M + "paddle_avgpool_exclusive.py", "candidate_exclusive", verdict="divergent", module=""),
    Pair(M + "paddle_shared_block.py"),
    Pair(M + "paddle_shared_block.py", "candidate_block_gelu", verdict="divergent", module=""),
    Pair(M + "paddle_rnns.py"),
    Pair(M + "paddle_rnns.py", "candidate_gru_gate_order", verdict="divergent", module="", leaf="weight_ih_l0"),
    Pair(M + "paddle_rnns.py", "candidate_lstm", "reference_lstm"),
    Pair(
        M + "paddle_rnns.py",
        "candidate_lstm_forget_bias",
        "reference_lstm",
        verdict="divergent",
        module="",
        leaf="bias_hh_l1",
    ),
    Pair(M + "paddle_rnns.py", "candidate_rnn", "reference_rnn"),
    Pair(M + "paddle_rnns.py", "candidate_rnn_default_activation", "reference_rnn", verdict="divergent", module=""),
    Pair(M + "transformer_encoder.py"),
    Pair(M + "transformer_encoder.py", "candidate_gelu_layer", verdict="divergent", module="layers.1"),
    Pair(M + "transpose_y_stack.py"),
    Pair(M + "transpose_y_stack.py", "candidate_tanh_gelu", verdict="divergent", module="layers.30"),
    # ops one side has and the other lacks, masks in other representations, a difference in every layer
    Pair(M + "extra_ops_ports.py"),
    Pair(M + "extra_ops_ports.py", "candidate_extra_scale", verdict="divergent", module="blocks.1"),
    Pair(M + "extra_ops_ports.py", "candidate_embedding_normalized", verdict="divergent", module=""),
    Pair(M + "mask_representations.py"),
    Pair(M + "mask_representations.py", "candidate_pool_full_length", verdict="divergent", module=""),
    Pair(M + "mask_representations.py", "candidate_padded_mask_pool_full_length", verdict="divergent", module=""),
    Pair(
        M + "mask_representations.py",
        "candidate_padded_mask_scaled_by_model_width",
        verdict="divergent",
        module="blocks.0",
    ),
    Pair(M + "every_layer_ports.py"),
    Pair(M + "every_layer_ports.py", "candidate_unbiased_norm", verdict="divergent", module="layers.0.norm1"),
    Pair(M + "every_layer_ports.py", "candidate_parallel_residual", verdict="divergent", module="layers.0"),
    Pair(M + "every_layer_ports.py", "candidate_bias_twice", verdict="divergent", module="layers.0"),
    Pair(M + "function_sides.py"),
    Pair(M + "function_sides.py", "candidate_gelu_layer", verdict="divergent", module="layers.1"),
    Pair(M + "compiled_hf_llama.py", needs=HF),
    Pair(M + "compiled_hf_resnet.py", needs=HF),
    Pair(M + "compiled_paddle_reference.py"),
    Pair(M + "hf_llama_activation.py", needs=HF),
    Pair(
        M + "hf_llama_activation.py", "candidate_gelu_layer", verdict="divergent", module="model.layers.2.mlp", needs=HF
    ),
    Pair(M + "hf_llama_weights.py", "candidate_bf16", needs=HF),
    Pair(
        M + "hf_llama_weights.py",
        "candidate_bf16_norm_scaled",
        verdict="divergent",
        module="model.layers.1",
        leaf="model.layers.1.post_attention_layernorm.weight",
        needs=HF,
    ),
    Pair(
        M + "hf_llama_weights.py",
        "candidate_rope_theta",
        verdict="divergent",
        module="model.rotary_emb",
        leaf="model.rotary_emb.inv_freq",
        needs=HF,
    ),
    Pair(M + "hf_llama_greedy_cache.py", needs=HF),
    Pair(
        M + "hf_llama_greedy_cache.py",
        "candidate_cache_before_rope",
        verdict="divergent",
        module="lm.model.layers.0.self_attn",
        needs=HF,
    ),
    Pair(M + "generate_llama_port.py", needs=HF, tokens=4),
    Pair(
        M + "generate_llama_port.py",
        "candidate_layer1_cache",
        verdict="divergent",
        module="layers.1.self_attn",
        needs=HF,
        tokens=3,
        step=1,
    ),
    Pair(
        M + "generate_hf_llama.py",
        "candidate_decode_mask",
        verdict="divergent",
        module="model.layers.0.self_attn",
        needs=HF,
        tokens=2,
        step=1,
    ),
    Pair(M + "hf_mamba_dt_bias.py", needs=HF),
    Pair(
        M + "hf_mamba_dt_bias.py",
        "candidate_dt_bias_twice",
        verdict="divergent",
        module="backbone.layers.0.mixer",
        needs=HF,
    ),
    Pair(M + "paddle_bool_mask.py"),
    Pair(M + "paddle_bool_mask.py", "candidate_mask_as_is", verdict="divergent", module="encoder"),
    Pair(M + "hf_qwen2_gqa_ports.py", needs=HF),
    Pair(M + "hf_qwen2_gqa_ports.py", "candidate_kv_heads_expanded", needs=HF),
    Pair(
        M + "hf_qwen2_gqa_ports.py",
        "candidate_kv_heads_tiled",
        verdict="divergent",
        module="model.layers.0.self_attn.k_proj",
        leaf="model.layers.0.self_attn.k_proj.weight",
        needs=HF,
    ),
    Pair(
        M + "hf_qwen2_gqa_ports.py",
        "candidate_rotary_rows_permuted",
        verdict="divergent",
        module="model.layers.0.self_attn.q_proj",
        leaf="model.layers.0.self_attn.q_proj.weight",
        needs=HF,
    ),
    Pair(M + "hf_llama_shared.py", needs=HF),
    Pair(M + "hf_llama_shared.py", "candidate_mlp_act", verdict="divergent", module="model.layers.0.mlp", needs=HF),
    Pair(M + "hf_gpt2.py", needs=HF),
    Pair(M + "hf_gpt2.py", "candidate_untransposed", verdict="divergent", module="h.2.attn", needs=HF),
    Pair(M + "hf_gpt2.py", "candidate_exact_gelu", verdict="divergent", module="h.0.mlp", needs=HF),
    Pair(M + "hf_mixtral_experts.py", needs=HF),
    Pair(
        M + "hf_mixtral_experts.py",
        "candidate_expert_gelu",
        verdict="divergent",
        module="model.layers.1.mlp.experts",
        needs=HF,
    ),
    Pair(M + "no_float64_kernel.py"),
    Pair(M + "no_float64_kernel.py", "candidate_exact_gelu", verdict="divergent", module=""),
    Pair(M + "no_float64_kernel.py", "fused_rms_norm", "rms_norm"),
    Pair(M + "hf_gpt2_paddle.py", backward="noise", needs=HF),
    Pair(
        M + "hf_gpt2_paddle.py",
        "candidate_frozen_c_fc",
        backward="divergent",
        backward_module="transformer.h.2.mlp.c_fc",
        needs=HF,
    ),
    Pair(
        M + "hf_gpt2_paddle.py",
        "candidate_pylayer_ln_2",
        backward="divergent",
        backward_module="transformer.h.2.ln_2",
        needs=HF,
    ),
    Pair(
        M + "hf_gpt2_paddle.py",
        "candidate_bias_and_pylayer",
        verdict="divergent",
        module="transformer.h.0.mlp",
        leaf="transformer.h.0.mlp.c_proj.bias",
        backward="divergent",
        backward_module="transformer.h.2.ln_2",
        needs=HF,
    ),
    # backward passes
    Pair(M + "backward_ports.py", backward="noise"),
    Pair(M + "backward_ports.py", "candidate_pylayer", backward="divergent", backward_module="blocks.1"),
    Pair(M + "backward_ports.py", "candidate_detached", backward="divergent", backward_module="blocks.1"),
    Pair(M + "backward_ports.py", "candidate_frozen", backward="divergent", backward_module="blocks.0.fc2"),
    Pair(
        M + "backward_every_block.py", "candidate_pylayer_every_block", backward="divergent", backward_module="blocks."
    ),
    Pair(M + "hf_llama_function.py", backward="noise", needs=HF),
    Pair(
        M + "hf_llama_function.py",
        "candidate_dropped_term",
        backward="divergent",
        backward_module="model.layers.1.post_attention_layernorm",
        needs=HF,
    ),
    Pair(M + "hf_gpt2_detached.py", backward="noise", needs=HF),
    Pair(M + "hf_gpt2_detached.py", "candidate_detached", backward="divergent", backward_module="h.2.attn", needs=HF),
    Pair(M + "hf_bert_checkpointing.py", backward="noise", needs=HF),
    # PaddleFormers models (their environment: the Hugging Face reference runs in another interpreter)
    Pair(M + "pf_qwen2.py", needs=PF),
    Pair(
        M + "pf_qwen2.py",
        "candidate_k_bias_missing",
        verdict="divergent",
        module="model.layers.2.self_attn",
        leaf="model.layers.2.self_attn.qkv_proj.bias",
        needs=PF,
    ),
    Pair(
        M + "pf_qwen2.py",
        "candidate_naive_qkv_order",
        verdict="divergent",
        module="model.layers.0.self_attn",
        leaf="model.layers.0.self_attn.qkv_proj.weight",
        needs=PF,
    ),
    Pair(M + "generate_pf_qwen2.py", needs=PF, tokens=8),
    Pair(
        M + "generate_pf_qwen2.py",
        "candidate_k_bias_missing",
        verdict="divergent",
        module="model.layers.2.self_attn",
        leaf="model.layers.2.self_attn.qkv_proj.bias",
        needs=PF,
        tokens=2,
        step=0,
    ),
    Pair("examples/hf_llama.py", needs=PF),
    Pair(
        "examples/hf_llama.py",
        "candidate_untransposed",
        verdict="divergent",
        module="model.layers.1.self_attn.q_proj",
        leaf="model.layers.1.self_attn.q_proj.weight",
        needs=PF,
    ),
]
CORPUS += [pair for name in BLIND for pair in blind_pairs(name)]


def problems(pair: Pair, result: dict) -> list[str]:
    """What in `result` (`bisect --json`, or `generate --json` for a generation pair) departs from what `pair`
    must conclude; empty when nothing does."""
    if pair.tokens is not None:
        searched = {**(result.get("step_search") or {}), "verdict": result["verdict"]}
        found = _pass_problems(pair.verdict, pair.module, pair.leaf, searched)
        if pair.step is not None and result.get("culprit_step") != pair.step:
            found.append(f"searched at step {result.get('culprit_step')}, not {pair.step}")
        return found
    found = _pass_problems(pair.verdict, pair.module, pair.leaf, result)
    if pair.backward is not None:
        backward = result.get("backward")
        found += (
            ["no backward pass"]
            if backward is None
            else [
                f"backward: {problem}"
                for problem in _pass_problems(pair.backward, pair.backward_module, None, backward)
            ]
        )
    return found


def _pass_problems(expected: str, module: str | None, leaf: str | None, result: dict) -> list[str]:
    verdict, culprit, bracket = result["verdict"], result.get("culprit"), result.get("bracket")
    confirmed = bool((result.get("confirmation") or {}).get("confirmed")) or bool(result.get("missing_gradient"))
    if expected == "noise":
        return [] if verdict in ("noise", "match") else [f"{verdict} where rounding was expected"]
    if expected == "nondeterministic" or verdict == "nondeterministic":
        where = (culprit or {}).get("candidate", {}).get("module")
        if verdict != expected:
            return [f"{verdict} where {expected} was expected"]
        return [] if where is not None and _under(where, module) else [f"runs part at {where!r}, not under {module!r}"]
    if verdict != "divergent":
        return [f"{verdict} where a difference was expected"]
    if expected == "unconfirmed":
        modules = [site["module"] for site in (bracket or {}).get("candidate", [])]
        return [] if any(_under(m, module) for m in modules) else [f"no bracketed op under {module!r}: {modules}"]
    where = (culprit or {}).get("candidate", {}).get("module")
    found = [] if confirmed else ["not confirmed"]
    if where is None or not _under(where, module):
        found.append(f"culprit at {where!r}, not under {module!r}")
    if leaf is not None and (culprit or {}).get("leaf") != leaf:
        found.append(f"culprit leaf {(culprit or {}).get('leaf')!r}, not {leaf!r}")
    return found


def _under(module: str, prefix: str | None) -> bool:
    """Is `module` at or under `prefix` (a prefix ending in "." matches any path starting with it)?"""
    if prefix is None or prefix == "":
        return True
    return module == prefix or module.startswith(prefix if prefix.endswith(".") else prefix + ".")
