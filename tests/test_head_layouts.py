"""Converter bugs that lay attention heads out another way, on a tiny Hugging Face Qwen2 (grouped-query
attention) against a hand port loaded through a converter (`tests/models/hf_qwen2_gqa_ports.py`): the
leaf named and described by which heads or rows went where, every layer one cause, confirmed by giving
the candidate the reference's layout; the correct converters agree."""

import math

import pytest

from test_recurring import bisect

GQA = "hf_qwen2_gqa_ports.py"


def _within_budget(result: dict) -> bool:
    return result["reruns"] <= math.ceil(math.log2(result["ops"]["candidate"])) + 3


@pytest.mark.parametrize("candidate", ["candidate", "candidate_kv_heads_expanded"])
def test_a_correct_converter_agrees_and_pairs_the_wider_kv_projections_in_blocks(candidate):
    result = bisect(GQA, candidate)
    assert result["verdict"] == "match" and result["output_error"]["max_abs"] == 0
    # The port's k/v projections with 4 heads where the reference has 2 are paired together with the
    # ops up to where the reference repeats its heads: 161 of 168 ops inside pairs or matched blocks.
    assert result["ops"]["aligned"] / result["ops"]["candidate"] > 0.9


def test_kv_heads_tiled_by_the_converter_are_the_k_and_v_weights_of_every_layer():
    result = bisect(GQA, "candidate_kv_heads_tiled")
    culprit, confirmation = result["culprit"], result["confirmation"]
    assert result["verdict"] == "divergent" and culprit["kind"] == "leaf"
    assert culprit["leaf"] == "model.layers.0.self_attn.k_proj.weight"
    # Heads h0 h1 h0 h1 where the port's query heads, grouped in order, read h0 h0 h1 h1.
    assert culprit["description"] == (
        "blocks repeated along axis 0: holds the reference's blocks of 16 in order "
        "[0, 1, 0, 1] where its ops read them in order [0, 0, 1, 1]"
    )
    assert culprit["layout"].endswith("each row 2 times of axis 0 of the candidate's [64, 64]")
    assert [r["module"] for r in result["recurrences"]] == [
        f"model.layers.{n}.self_attn.{p}_proj" for n in range(3) for p in "kv"
    ]
    different = [p["candidate"] for p in result["leaves"]["pairs"] if p["status"] == "different"]
    assert different == [
        f"param:model.layers.{n}.self_attn.{p}_proj.{w}" for n in range(3) for p in "kv" for w in ("weight", "bias")
    ]
    assert not result["leaves"]["unpaired"][:-1]  # only the reference's unread rotary table
    assert confirmation["confirmed"] and confirmation["leaves"] == 12
    assert 0.7 < confirmation["before"] < 0.85 and confirmation["output_error"] < 1e-6
    assert _within_budget(result)


def test_kv_heads_tiled_are_named_where_no_value_equals_the_references_bit_for_bit():
    # As a GPU candidate against a CPU reference: the port's norm rounds otherwise, so the k projection's
    # outputs hold the reference's values only to rounding, and which row each position holds is read
    # from values near the reference's.
    result = bisect(GQA, "candidate_kv_heads_tiled_rounded_otherwise")
    culprit, confirmation = result["culprit"], result["confirmation"]
    assert result["verdict"] == "divergent" and culprit["leaf"] == "model.layers.0.self_attn.k_proj.weight"
    assert culprit["description"] == (
        "blocks repeated along axis 0: holds the reference's blocks of 16 in order "
        "[0, 1, 0, 1] where its ops read them in order [0, 0, 1, 1]"
    )
    assert len(result["recurrences"]) == 6
    assert confirmation["confirmed"] and confirmation["leaves"] == 12 and confirmation["output_error"] < 1e-5
    correct = bisect(GQA, "candidate_kv_heads_expanded_rounded_otherwise")
    assert correct["verdict"] == "noise" and 1e-7 < correct["output_error"]["max_rel"] < 1e-5
    assert correct["leaves"]["summary"].startswith("40 leaves paired (40 equal)")


def test_q_and_k_rows_permuted_for_the_other_rotary_convention_say_which_row_each_holds():
    result = bisect(GQA, "candidate_rotary_rows_permuted")
    culprit = result["culprit"]
    assert result["verdict"] == "divergent" and culprit["leaf"] == "model.layers.0.self_attn.q_proj.weight"
    assert culprit["description"] == (
        "rows permuted within each block of 16 along axis 0: each holds the reference's rows "
        "[0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15]"
    )
    assert [r["module"] for r in result["recurrences"]] == [
        f"model.layers.{n}.self_attn.{p}_proj" for n in range(3) for p in "qk"
    ]
    assert result["confirmation"]["confirmed"] and result["confirmation"]["output_error"] < 1e-6
