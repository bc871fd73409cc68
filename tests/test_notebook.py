"""`bisectr.compare` on live model objects, as in a notebook: the same verdict and culprit as the
model file, a display for Jupyter, and a saved run that `bisectr view` opens."""

import importlib.util
import subprocess
import sys

import pytest

import bisectr
from conftest import EXAMPLES


def built_sides(example: str) -> tuple:
    """`(model, inputs)` of both sides, built as a notebook would (calling the example's functions)."""
    spec = importlib.util.spec_from_file_location(f"notebook_{example}", EXAMPLES / f"{example}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reference(), module.candidate()


def culprit_sites(result: bisectr.Result) -> tuple:
    culprit = result.culprit
    return (
        culprit.op,
        culprit.kind,
        culprit.leaf,
        culprit.candidate.module,
        culprit.candidate.source,
        culprit.reference.module,
        culprit.reference.source,
    )


@pytest.mark.parametrize("example, verdict", [("span_head", "noise"), ("wrong_eps", "divergent")])
def test_compare_gives_the_model_files_verdict_and_culprit(example, verdict, tmp_path):
    reference, candidate = built_sides(example)
    compared = bisectr.compare(reference=reference, candidate=candidate, out=tmp_path / "run")
    from_file = bisectr.bisect(EXAMPLES / f"{example}.py")
    assert compared.verdict == from_file.verdict == verdict
    assert culprit_sites(compared) == culprit_sites(from_file)
    assert compared.reruns == from_file.reruns

    html = compared._repr_html_()
    assert f"verdict: {verdict}" in html and compared.culprit.candidate.source.rpartition("/")[2] in html
    assert str(compared).startswith(f"verdict: {verdict}")

    viewed = subprocess.run(
        [sys.executable, "-m", "bisectr", "view", str(tmp_path / "run"), "--no-tui"], capture_output=True, text=True
    )
    assert viewed.returncode == (1 if verdict == "divergent" else 0), viewed.stderr
    assert viewed.stdout.startswith(f"verdict: {verdict}")


def test_compare_names_the_argument_that_is_not_model_and_inputs():
    with pytest.raises(bisectr.BisectrError, match="the candidate argument is int, not \\(model, inputs\\)"):
        bisectr.compare(reference=built_sides("span_head")[0], candidate=3)
