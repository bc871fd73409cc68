"""The search on small torch models: culprit, budget, exhaustive agreement, API."""
import math

import pytest

import bisectr
from conftest import MODELS, line_of

GELU_FILE = MODELS / "torch_gelu_stack.py"


@pytest.fixture(scope="module")
def gelu_run(tmp_path_factory):
    return bisectr.trace(GELU_FILE, out=tmp_path_factory.mktemp("runs") / "gelu")


def test_tanh_gelu_block_is_named_on_both_sides(gelu_run):
    result = gelu_run.bisect()
    culprit = result.culprit
    assert result.verdict == "divergent"
    assert culprit["op"] == "gelu" and culprit["kind"] == "op"
    for side in ("candidate", "reference"):
        assert culprit[side]["module"] == "blocks.7"
        assert culprit[side]["source"] == f"{GELU_FILE}:{line_of(GELU_FILE, 'GELU_LINE')}"
    # tanh vs exact GELU: ~1e-4..1e-3 apart, while the reference is fp32-close to fp64
    assert 1e-5 < culprit["fp64"]["candidate_error"] < 1e-2
    assert culprit["fp64"]["reference_error"] < 1e-6
    assert result.confirmation["output_error"] == 0.0 < result.confirmation["before"]


def test_search_stays_within_its_rerun_budget_and_agrees_with_exhaustive(gelu_run):
    searched = gelu_run.bisect()
    exhaustive = gelu_run.bisect(exhaustive=True)
    ops = searched.ops["candidate"]
    assert searched.reruns <= math.ceil(math.log2(ops)) + 3
    assert exhaustive.reruns > 2 * searched.reruns
    assert exhaustive.entry == searched.entry
    assert exhaustive.culprit == searched.culprit


def test_python_api_and_json_shape():
    result = bisectr.bisect(GELU_FILE)
    data = result.to_dict()
    assert set(data) >= {"verdict", "output_error", "culprit", "reruns", "ops"}
    assert set(data["culprit"]) >= {"kind", "op", "candidate", "reference", "leaf", "input_error", "output_error",
                                   "local_error", "amplification", "fp64"}
    assert data["ops"]["aligned"] == data["ops"]["candidate"] == 12 * 5  # layer_norm, linear, gelu, linear, add


def test_identical_models_match(models):
    assert bisectr.bisect(models / "torch_stack.py").verdict == "match"
