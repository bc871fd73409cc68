"""NaN/Inf in the candidate's outputs while the reference's are finite: a divergence, named
where it starts (tests/models/nonfinite.py: an unclamped `log`, a NaN parameter, a softmax without its max
subtracted)."""

import json
import math

import pytest

import bisectr
from bisectr.present.cli import main
from bisectr.measure.result import BlockOps, NonFinite, NonFiniteSite
from conftest import MODELS, line_of

MODEL = MODELS / "nonfinite.py"


@pytest.mark.parametrize("candidate, marker", [("candidate", "# @log"), ("paddle_candidate", "# @paddle_log")])
def test_the_unclamped_log_is_the_culprit_and_where_the_nan_starts(candidate, marker):
    if candidate.startswith("paddle"):
        pytest.importorskip("paddle")
    result = bisectr.bisect(MODEL, candidate=candidate)
    culprit = result.culprit
    assert result.verdict == "divergent" and culprit.kind == "op" and culprit.op == "log"
    assert culprit.candidate.source == f"{MODEL}:{line_of(MODEL, marker)}"
    assert culprit.reference.source == f"{MODEL}:{line_of(MODEL, '# @log')}"
    assert result.nonfinite == NonFinite(12, 0, NonFiniteSite(**vars(culprit.candidate), leaf=None))
    # the log alone patched: the outputs are finite again and within float rounding of the reference's
    assert result.confirmation.output_error < 1e-6


@pytest.mark.parametrize("candidate, marker", [("naive_softmax", "# @exp"), ("paddle_naive_softmax", "# @paddle_exp")])
def test_an_overflowing_exp_inside_a_block_is_where_the_nan_starts(candidate, marker):
    """exp/sum/div against one softmax: the block is judged as one op (the culprit), and the NaN are
    traced back inside it to the exp that overflowed, where the culprit is shown."""
    if candidate.startswith("paddle"):
        pytest.importorskip("paddle")
    result = bisectr.bisect(MODEL, reference="softmax_reference", candidate=candidate)
    culprit = result.culprit
    assert result.verdict == "divergent" and culprit.op == "softmax" and culprit.kind == "op"
    assert culprit.block == BlockOps(candidate=[2, 3, 4], reference=[2])
    assert culprit.reference.source == f"{MODEL}:{line_of(MODEL, '# @softmax')}"
    assert culprit.candidate.source == f"{MODEL}:{line_of(MODEL, marker)}"  # the exp
    first = result.nonfinite.first
    assert result.nonfinite.nan == 1 and first.index == 2 and first.source == f"{MODEL}:{line_of(MODEL, marker)}"


def test_a_block_making_the_model_output_is_judged_and_shown_where_the_nan_start():
    """The exp/sum/div block hands on the model's output, so it pairs with the reference's softmax
    output (the outputs pair by key) though no value of it is finite: the block is the culprit,
    confirmed, shown at the exp the NaN start at."""
    result = bisectr.bisect(MODEL, reference="hotter_reference", candidate="hotter_naive_softmax")
    culprit = result.culprit
    assert result.verdict == "divergent" and culprit.op == "softmax" and len(culprit.block.candidate) == 3
    assert culprit.candidate.source == f"{MODEL}:{line_of(MODEL, '# @exp')}"
    assert culprit.reference.op == "softmax"
    assert culprit.reference.source == f"{MODEL}:{line_of(MODEL, '# @hotter_softmax')}"
    assert math.isinf(culprit.local_error) and result.nonfinite.nan == 9
    assert result.confirmation.confirmed and result.confirmation.output_error == 0


def test_a_nan_parameter_is_where_the_nan_starts():
    result = bisectr.bisect(MODEL, candidate="nan_weight")
    assert result.verdict == "divergent"
    assert result.culprit.kind == "leaf" and result.culprit.leaf == "fc2.weight"
    first = result.nonfinite.first
    assert first.leaf == "param:fc2.weight" and first.index == result.culprit.candidate.index
    assert result.nonfinite.nan == 12 and result.confirmation.output_error == 0.0


def test_cli_exits_1_and_says_where_the_nan_starts(capsys, monkeypatch):
    monkeypatch.chdir(MODELS.parent.parent)  # sources print relative to the working directory
    assert main(["bisect", str(MODEL)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "verdict: divergent outputs differ by NaN/Inf" in out
    assert (
        f"the candidate's outputs hold 12 NaN and 0 Inf (the reference's are finite); they start at op 3 log "
        f"(top level) (tests/models/nonfinite.py:{line_of(MODEL, '# @log')})"
    ) in out
    assert main(["bisect", str(MODEL), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["output_error"] == {"max_abs": "Infinity", "max_rel": "Infinity"}  # standard JSON: no Infinity token
    assert data["nonfinite"]["first"]["index"] == data["culprit"]["candidate"]["index"] == 3


async def test_tui_banner_says_where_the_nan_starts(tmp_path, monkeypatch):
    pytest.importorskip("textual")
    from bisectr.present.tui.app import BisectrApp
    from bisectr.present.tui.data import RunData
    from bisectr.present.tui.widgets import VerdictBanner

    monkeypatch.chdir(MODELS.parent.parent)
    run = bisectr.trace(MODEL, out=tmp_path / "run")
    run.bisect()
    app = BisectrApp(RunData(run))
    async with app.run_test(size=(140, 30)) as pilot:
        await pilot.pause()
        banner = app.query_one(VerdictBanner).content.plain
    assert banner.startswith(
        "verdict: divergent   outputs differ by NaN/Inf\nthe candidate's outputs hold 12 NaN and 0 Inf"
    )
    assert f"they start at op 3 log (top level) (tests/models/nonfinite.py:{line_of(MODEL, '# @log')})" in banner


def test_a_run_with_nan_and_inf_is_saved_as_standard_json_and_reads_back_the_same(tmp_path):
    run = bisectr.trace(MODEL, out=tmp_path / "run")
    result = run.bisect()
    run.save()

    def refuse(token):
        raise AssertionError(f"{token} is not standard JSON")

    for document in sorted((tmp_path / "run").rglob("*.json")):
        json.loads(document.read_text(), parse_constant=refuse)
    reopened = bisectr.load(tmp_path / "run")
    assert reopened.result.to_dict() == result.to_dict() and reopened.result.output_error.max_rel == float("inf")
    nan_tensors = [t for t in reopened.candidate.tensors.values() if t.stats.nan]
    assert nan_tensors and all(any(x != x for x in t.fingerprint) for t in nan_tensors)
    assert [t.to_json() for t in nan_tensors] == [run.candidate.tensors[t.tid].to_json() for t in nan_tensors]
