"""Greedy generation compared step by step (`bisectr generate`): real torch (and PaddleFormers) causal LMs
decoded with their own caches, teacher-forced; the first step and the op in it where they part."""

import importlib.util
import json
import subprocess
import sys

import pytest

import bisectr
from conftest import MODELS, line_of, needs_paddleformers

FAULTS = MODELS / "generate_faults.py"
HF_LLAMA = MODELS / "generate_hf_llama.py"
PORT = MODELS / "generate_llama_port.py"
PF_QWEN2 = MODELS / "generate_pf_qwen2.py"
PORT_CACHES = MODELS / "generate_port_caches.py"
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
# The torch pairs' searches drive torch and transformers alone: the first CI environment runs them.
torch_pair = pytest.mark.once


def generate_cli(model, *args, expect=(0, 1)) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "generate", str(model), *map(str, args)], capture_output=True, text=True
    )
    assert done.returncode in expect, done.stderr
    return done


def generate_json(model, *args) -> tuple[int, dict]:
    done = generate_cli(model, "--json", *args)
    result = json.loads(done.stdout)
    assert (done.returncode == 1) == (result["verdict"] == "divergent")
    return done.returncode, result


@pytest.mark.parametrize(
    "candidate, said",
    [
        ("candidate_no_cache", "is not a causal LM with a cache"),
        ("candidate_returns_no_cache", "returned no cache"),
        ("candidate_other_vocab", "[2, 32] (reference) and [2, 48] (candidate): sides with different vocabularies"),
        ("candidate_other_prompt", "the sides' prompts differ"),
        ("candidate_short_positions", "holds 6 positions, but a prompt of 4 tokens and 4 generated need 8"),
        ("candidate_raises", "raised at decoding step 2: ValueError: the third step fails"),
    ],
)
def test_what_generate_cannot_decode_is_refused_with_status_2_naming_it(candidate, said):
    done = generate_cli(FAULTS, "--candidate", candidate, "--tokens", 4, expect=(2,))
    assert str(FAULTS) in done.stderr and said in done.stderr and "Traceback (most recent" not in done.stderr
    assert done.stdout == ""


def test_the_same_model_on_both_sides_matches_at_every_step_and_the_json_has_the_contract():
    status, result = generate_json(FAULTS, "--tokens", 5)
    assert status == 0 and result["verdict"] == "match" and result["tokens"] == 5
    assert [row["step"] for row in result["steps"]] == list(range(6))
    for row in result["steps"]:
        assert row["reference_tokens"] == row["candidate_tokens"] and len(row["reference_tokens"]) == 2
        assert row["logits"]["error"] == 0 and row["logits"]["verdict"] == "match" and row["cache"]["error"] == 0
        assert row["verdict"] == "match"
        assert 1e-8 < row["logits"]["rounding"] < 1e-5  # each side's float32 run against its own float64 run
    assert result["first_divergent_step"] is None and result["first_flip"] is None and result["culprit"] is None
    assert result["culprit_step"] is None and result["step_search"] is None


def test_the_python_api_returns_the_steps():
    result = bisectr.generate(FAULTS, tokens=2)
    assert result.verdict == "match" and len(result.steps) == 3 and result.to_dict()["verdict"] == "match"


@needs_transformers
def test_hf_llama_against_itself_matches_over_a_left_padded_batch_and_reports_each_step():
    status, result = generate_json(HF_LLAMA, "--tokens", 6)
    assert status == 0 and result["verdict"] == "match" and len(result["steps"]) == 7
    for row in result["steps"]:
        # float64 copies in lockstep: a fully masked row of padding stays finite (the softmax kept in float64)
        assert 1e-8 < row["logits"]["rounding"] < 1e-4 and row["logits"]["float64_error"] == 0
        assert row["margin"] > 0 and row["cache_entry"] is not None


@torch_pair
@needs_transformers
def test_a_decode_mask_off_by_one_is_named_at_the_first_decode_step_and_confirmed():
    status, result = generate_json(HF_LLAMA, "--candidate", "candidate_decode_mask", "--tokens", 3)
    assert status == 1 and result["culprit_step"] == 1 and result["first_divergent_step"] == 1
    assert result["steps"][0]["logits"]["verdict"] == "match"  # the prefill is right
    culprit = result["culprit"]
    assert culprit["step"] == 1 and culprit["candidate"]["module"] == "model.layers.0.self_attn"
    assert culprit["candidate"]["source"].endswith(f"generate_hf_llama.py:{line_of(HF_LLAMA, '@mask')}")
    assert result["confirmation"]["confirmed"] and len(result["step_search"]["recurrences"]) == 3
    flip = result["first_flip"]
    assert flip["step"] == 1 and not flip["rounding"] and flip["margin"] > 0


@torch_pair
@needs_transformers
def test_a_cache_written_before_the_rotary_is_searched_at_the_prefill_that_wrote_it():
    status, result = generate_json(HF_LLAMA, "--candidate", "candidate_cache_before_rope", "--tokens", 2)
    steps = result["steps"]
    assert status == 1 and result["culprit_step"] == 0 and result["first_divergent_step"] == 1
    assert steps[0]["logits"]["verdict"] == "match" and steps[0]["cache"]["verdict"] == "divergent"
    assert steps[0]["cache_entry"] == "layers.0.keys" and steps[0]["cache"]["error"] > 0.1
    bracket = result["step_search"]["bracket"]["candidate"]
    assert any(site["op"] == "cat" and "/cache_utils.py:" in site["source"] for site in bracket), bracket
    assert {site["module"] for site in bracket} == {"model.layers.0.self_attn"}


@torch_pair
@needs_transformers
def test_a_rotary_offset_that_never_advances_is_bracketed_in_the_rotary_at_the_first_decode_step():
    status, result = generate_json(HF_LLAMA, "--candidate", "candidate_rope_offset", "--tokens", 2)
    assert status == 1 and result["culprit_step"] == 1 and result["first_divergent_step"] == 1
    assert {site["module"] for site in result["step_search"]["bracket"]["candidate"]} == {"model.rotary_emb"}


def port_source(marker: str) -> str:
    return f"generate_llama_port.py:{line_of(PORT, marker)}"


@torch_pair
@needs_transformers
def test_a_hand_port_with_its_cache_in_another_layout_matches_hf_llama_over_8_steps():
    status, result = generate_json(PORT, "--tokens", 8)
    assert status == 0 and result["verdict"] in ("match", "noise") and result["note"] == ""
    for row in result["steps"]:  # HF's [batch, heads, seq, dim] paired with the port's [batch, seq, heads, dim]
        assert row["cache"]["float64_error"] < 1e-12 and row["logits"]["float64_error"] < 1e-12
        assert row["reference_tokens"] == row["candidate_tokens"]


@torch_pair
@needs_transformers
def test_a_cache_update_wrong_in_one_layer_is_named_at_its_line_and_the_step_that_writes_it():
    status, result = generate_json(PORT, "--candidate", "candidate_layer1_cache", "--tokens", 3)
    assert status == 1 and result["culprit_step"] == 1 and result["first_divergent_step"] == 2
    steps = result["steps"]
    assert steps[1]["logits"]["verdict"] in ("match", "noise") and steps[1]["cache"]["verdict"] == "divergent"
    assert steps[1]["cache_entry"] == "1.1"  # layer 1's values, in the port's list of (k, v)
    culprit = result["culprit"]
    assert culprit["step"] == 1 and culprit["candidate"]["module"] == "layers.1.self_attn"
    assert culprit["candidate"]["source"].endswith(port_source("# @layer1_cache"))
    assert result["confirmation"]["confirmed"] and result["confirmation"]["output_error"] < 1e-6


@torch_pair
@needs_transformers
def test_a_port_caching_k_before_the_rotary_is_named_at_the_prefill_where_it_writes_the_unrotated_keys():
    status, result = generate_json(PORT, "--candidate", "candidate_cache_before_rotary", "--tokens", 2)
    assert status == 1 and result["culprit_step"] == 0 and result["first_divergent_step"] == 1
    bracket = result["step_search"]["bracket"]["candidate"]
    # the op whose output the cache keeps: k before the rotary (the tagged line only names it)
    assert [site["source"].split("/")[-1] for site in bracket] == [port_source("k = self.k_proj(x).view")]
    assert bracket[0]["module"] == "layers.0.self_attn"


@torch_pair
@needs_transformers
def test_a_rotary_offset_that_never_advances_in_a_port_is_bracketed_at_its_line_at_the_first_decode_step():
    status, result = generate_json(PORT, "--candidate", "candidate_rotary_offset", "--tokens", 2)
    assert status == 1 and result["culprit_step"] == 1 and result["first_divergent_step"] == 1
    bracket = result["step_search"]["bracket"]["candidate"]
    assert any(site["source"].endswith(port_source("# @offset")) for site in bracket), bracket


@torch_pair
@needs_transformers
@pytest.mark.parametrize(
    "candidate, step, marker",
    [("candidate_decode_mask", 1, "query = torch.arange"), ("candidate_prefill_mask", 0, "return torch.where(visible")],
)
def test_a_mask_off_by_one_in_a_port_is_named_in_its_mask_at_the_step_it_applies_to(candidate, step, marker):
    status, result = generate_json(PORT, "--candidate", candidate, "--tokens", 2)
    assert status == 1 and result["culprit_step"] == step and result["first_divergent_step"] == step
    searched = result["step_search"]
    sites = [searched["culprit"]["candidate"]] if searched["culprit"] else searched["bracket"]["candidate"]
    assert any(site["source"].endswith(port_source(marker)) for site in sites), sites


@torch_pair
@needs_transformers
def test_a_sliding_window_cache_evicting_one_step_early_is_named_in_the_attention_at_the_first_decode_step():
    _, correct = generate_json(
        PORT, "--reference", "reference_window", "--candidate", "candidate_window", "--tokens", 8
    )
    # Mistral's window positions are not entries; the port rounds otherwise than transformers' attention does
    assert correct["verdict"] in ("match", "noise") and correct["note"] == ""
    status, result = generate_json(
        PORT, "--reference", "reference_window", "--candidate", "candidate_window_eviction", "--tokens", 3
    )
    assert status == 1 and result["culprit_step"] == 1 and result["first_divergent_step"] == 1
    assert result["steps"][0]["verdict"] in ("match", "noise")  # the prefill and the cache it writes are right
    # the evicted key is missing from the attention's scores: named there, the cache slice having no partner
    assert result["culprit"]["candidate"]["module"] == "layers.0.self_attn" and result["confirmation"]["confirmed"]


@torch_pair
@needs_transformers
def test_a_cache_kept_in_bfloat16_is_rounding_and_so_is_the_flip_it_tips():
    status, result = generate_json(PORT, "--candidate", "candidate_bf16_cache", "--tokens", 4)
    assert status == 0 and result["verdict"] == "noise"
    assert "keeps 6 of its 6 cache entries in bfloat16 (the reference in float32" in result["note"]
    first = result["steps"][0]
    assert 1e-3 < first["cache"]["error"] < 1e-2 and first["cache"]["float64_error"] < 1e-12
    assert first["logits"]["error"] < 1e-5  # the prefill reads its keys before they are cached
    flip = result["first_flip"]
    assert flip is None or (flip["rounding"] and flip["margin"] < 0.1)


def assert_rounding_at_every_step(result: dict, cache_compared: bool = True) -> None:
    """The correct port's steps: logits and (where compared) cache within float32 rounding, 0 in float64."""
    assert result["verdict"] in ("match", "noise") and result["culprit_step"] is None
    for row in result["steps"]:
        assert row["logits"]["float64_error"] < 1e-12 and row["reference_tokens"] == row["candidate_tokens"]
        assert (row["cache"] is not None) == cache_compared
        assert not cache_compared or (row["cache"]["error"] < 1e-5 and row["cache"]["float64_error"] < 1e-12)


def assert_divergent_from(result: dict, step: int, culprit_step: int) -> None:
    """Divergent, the logits first at `step` (the steps before within rounding), searched at `culprit_step`."""
    assert result["verdict"] == "divergent" and result["first_divergent_step"] == step
    assert result["culprit_step"] == culprit_step and result["step_search"] is not None
    assert all(row["logits"]["verdict"] != "divergent" for row in result["steps"][:step])


@torch_pair
@needs_transformers
def test_a_stacked_cache_pairs_its_parts_with_the_references_keys_and_values_and_its_step_is_searched_on_logits():
    status, correct = generate_json(PORT_CACHES, "--candidate", "candidate_stacked", "--tokens", 3)
    assert status == 0
    assert "the candidate's cache stacks 2 tensors in each entry (layers.0 [2, 2, 2, 8, 16] first)" in correct["note"]
    assert_rounding_at_every_step(correct)
    parts = {f"layers.{layer}[{part}]" for layer in (0, 1) for part in (0, 1)}  # each layer's k and v
    assert {row["cache_entry"] for row in correct["steps"]} <= parts
    status, result = generate_json(PORT_CACHES, "--candidate", "candidate_stacked_decode_mask", "--tokens", 2)
    assert status == 1
    assert_divergent_from(result, step=1, culprit_step=1)  # the step's outputs pair on the logits alone


@torch_pair
@needs_transformers
def test_a_stacked_cache_written_wrong_is_divergent_at_the_prefill_and_searched_where_the_logits_part():
    status, result = generate_json(PORT_CACHES, "--candidate", "candidate_stacked_kv_swapped", "--tokens", 2)
    assert status == 1
    assert_divergent_from(result, step=1, culprit_step=1)
    prefill = result["steps"][0]
    assert prefill["verdict"] == "divergent" and prefill["cache"]["verdict"] == "divergent"
    assert prefill["cache_entry"] == "layers.0[0]" and prefill["cache"]["error"] > 0.5  # layer 0's values as keys
    assert "step 0's cache differs in layers.0[0], which the search inside a step does not compare" in result["note"]


@torch_pair
@needs_transformers
def test_a_cache_with_heads_merged_is_not_compared_and_the_logits_decide():
    status, correct = generate_json(PORT_CACHES, "--candidate", "candidate_merged", "--tokens", 3)
    assert status == 0
    assert correct["note"].startswith("the caches are not compared: the candidate's cache entry layers.0.0 [2, 8, 32]")
    assert_rounding_at_every_step(correct, cache_compared=False)
    status, result = generate_json(PORT_CACHES, "--candidate", "candidate_merged_decode_mask", "--tokens", 2)
    assert status == 1
    assert_divergent_from(result, step=1, culprit_step=1)


@torch_pair
@needs_transformers
def test_a_window_keeping_one_more_position_than_hf_is_compared_over_the_positions_both_keep_at_every_step():
    window = ("--reference", "reference_window", "--tokens", 4)
    status, correct = generate_json(PORT_CACHES, "--candidate", "candidate_window", *window)
    assert status == 0
    assert "layers.0.0 [2, 2, 6, 16] and the reference's layers.0.keys [2, 2, 5, 16] keep" in correct["note"]
    assert_rounding_at_every_step(correct)
    status, result = generate_json(PORT_CACHES, "--candidate", "candidate_window_decode_mask", *window)
    assert status == 1
    assert_divergent_from(result, step=1, culprit_step=1)
    assert result["steps"][0]["verdict"] == "match"  # the prefill and the positions both caches keep


@torch_pair
@needs_transformers
def test_a_port_with_the_interleaved_rotary_pairs_its_cached_keys_in_the_references_dimension_order():
    status, correct = generate_json(PORT_CACHES, "--candidate", "candidate_interleaved", "--tokens", 3)
    assert status == 0
    assert "2 of the candidate's cache entries hold each head's dimensions in another order" in correct["note"]
    assert_rounding_at_every_step(correct)  # not divergent from step 0: its keys compared in the reference's order
    status, result = generate_json(PORT_CACHES, "--candidate", "candidate_interleaved_decode_mask", "--tokens", 2)
    assert status == 1
    assert_divergent_from(result, step=1, culprit_step=1)
    assert result["steps"][0]["cache"]["error"] < 1e-5


@needs_paddleformers
def test_hf_qwen2_against_paddleformers_over_32_tokens_of_a_left_padded_batch_is_noise(hf_python):
    status, result = generate_json(PF_QWEN2, "--tokens", 32, "--reference-python", hf_python)
    assert status == 0 and result["verdict"] == "noise" and len(result["steps"]) == 33
    assert result["note"] == ""  # the caches paired entry by entry ([b, heads, seq, dim] against [b, seq, heads, dim])
    for row in result["steps"]:
        assert row["logits"]["error"] < 1e-4 and row["logits"]["float64_error"] < 1e-12
        assert row["cache"]["error"] < 1e-4 and row["cache"]["float64_error"] < 1e-12
        assert row["reference_tokens"] == row["candidate_tokens"]


@needs_paddleformers
def test_a_fused_bias_left_zero_in_paddleformers_is_named_at_the_prefill(hf_python):
    status, result = generate_json(
        PF_QWEN2, "--tokens", 3, "--candidate", "candidate_k_bias_missing", "--reference-python", hf_python
    )
    assert status == 1 and result["culprit_step"] == 0 and result["first_divergent_step"] == 0
    culprit = result["culprit"]
    assert culprit["step"] == 0 and culprit["candidate"]["module"] == "model.layers.2.self_attn.qkv_proj"
    assert culprit["kind"] == "leaf" and culprit["leaf"] == "model.layers.2.self_attn.qkv_proj.bias"


@torch_pair
@needs_transformers
def test_the_report_shows_each_step_then_the_search_inside_the_step(tmp_path):
    status, result = generate_json(
        HF_LLAMA, "--candidate", "candidate_decode_mask", "--tokens", 2, "--report", tmp_path / "r"
    )
    assert status == 1 and result["report"] == [str(tmp_path / "r.md"), str(tmp_path / "r.html")]
    markdown = (tmp_path / "r.md").read_text()
    assert markdown.startswith("## bisectr generate: divergent in `generate_hf_llama.py`")
    assert "### Inside step 1" in markdown and f"generate_hf_llama.py:{line_of(HF_LLAMA, '# @mask')}" in markdown
    assert markdown.count("\n| 1 |") == 1 and "| divergent |" in markdown
    page = (tmp_path / "r.html").read_text()
    assert "<h3>Error and margin by step</h3>" in page and "<h3>Error by op</h3>" in page
