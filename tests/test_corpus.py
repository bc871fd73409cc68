"""The regression corpus (`tests/corpus.py`): every pair keeps its verdict and culprit, its culprit
confirmed, its re-runs within ceil(log2 ops) + 3, a correct port aligned and uncontradicted
(`benchmarks/corpus.py` judges each run)."""

import importlib.util
import sys

import pytest

from conftest import EXAMPLES, assert_verdict_contract
from corpus import CORPUS, Pair


def _benchmark():
    spec = importlib.util.spec_from_file_location("benchmarks_corpus", EXAMPLES.parent / "benchmarks" / "corpus.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


measure = _benchmark().measure


# The blind ports run in the first CI environment only: their libraries are the same in both, and CI's time is not.
PAIRS = [pytest.param(pair, marks=pytest.mark.once) if "/blind_" in pair.model else pair for pair in CORPUS]


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: pair.name)
def test_the_pair_keeps_its_verdict_and_culprit(pair: Pair, request):
    missing = pair.missing()
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    if pair.known_miss:
        request.applymarker(pytest.mark.xfail(strict=True, reason=pair.known_miss))
    reference_python = request.getfixturevalue("hf_python") if "paddleformers" in pair.needs else None
    row, result = measure(pair, reference_python)
    if result is not None:  # a generation pair with no step searched has no search result
        assert_verdict_contract(result)
    assert row["problems"] == [], row
