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
    assert culprit.op == "gelu" and culprit.kind == "op"
    for side in ("candidate", "reference"):
        assert getattr(culprit, side).module == "blocks.7"
        assert getattr(culprit, side).source == f"{GELU_FILE}:{line_of(GELU_FILE, 'GELU_LINE')}"
    # tanh vs exact GELU: ~1e-4..1e-3 apart, while the reference is fp32-close to fp64
    assert 1e-5 < culprit.fp64.candidate_error < 1e-2
    assert culprit.fp64.reference_error < 1e-6
    assert result.confirmation.output_error == 0.0 < result.confirmation.before


def test_search_stays_within_its_rerun_budget_and_agrees_with_exhaustive(gelu_run):
    searched = gelu_run.bisect()
    exhaustive = gelu_run.bisect(exhaustive=True)
    ops = searched.ops.candidate
    assert searched.reruns <= math.ceil(math.log2(ops)) + 3
    assert len(exhaustive.cuts) > 2 * len(searched.cuts)  # every cut up to the entry point
    assert exhaustive.entry == searched.entry
    assert exhaustive.culprit == searched.culprit


def test_the_cut_search_asks_the_first_op_judged_different_first(gelu_run):
    """Both sides run the same code up to blocks.7's GELU: a cut before it patches in values equal to
    the candidate's own, which needs no re-run, and the evidence judges the GELU different, so the
    cut search asks its cut first. The candidate re-runs: the last cut, the GELU's, the confirmation."""
    result = gelu_run.bisect()
    gelu = result.culprit.candidate.index
    assert result.entry == gelu and result.reruns == 3
    before = [cut for cut in result.cuts if cut.op < gelu]
    assert len(before) == 1 and before[0].moved == 0.0 and before[0].output_error == result.output_error.max_rel
    assert all(cut.moved > 0 for cut in result.cuts if cut.op >= gelu)


def test_python_api_and_json_shape():
    result = bisectr.bisect(GELU_FILE)
    data = result.to_dict()
    assert set(data) >= {"verdict", "output_error", "culprit", "reruns", "ops"}
    assert set(data["culprit"]) >= {
        "kind",
        "op",
        "candidate",
        "reference",
        "leaf",
        "input_error",
        "output_error",
        "local_error",
        "amplification",
        "fp64",
    }
    assert data["ops"]["aligned"] == data["ops"]["candidate"] == 12 * 5  # layer_norm, linear, gelu, linear, add


def test_identical_models_match(models):
    assert bisectr.bisect(models / "torch_stack.py").verdict == "match"


def test_a_wrong_epsilon_inside_a_decomposed_layer_norm_is_found(tmp_path):
    """A hand-written layer norm (mean/var/rsqrt) against nn.LayerNorm: no op pairs one by one, so the
    N:M block is judged as one op. eps 1e-3 instead of 1e-5 is divergent; the right eps stays noise."""
    path = MODELS / "torch_decomposed.py"
    assert bisectr.bisect(path).verdict == "noise"
    run = bisectr.trace(path, candidate="wrong_eps", out=tmp_path / "run")
    result = run.bisect()
    culprit = result.culprit
    assert result.verdict == "divergent" and culprit.op.startswith("layer_norm")
    eps_source = f"{path}:{line_of(path, '# @eps')}"
    assert eps_source in {run.candidate.ops[i].source for i in culprit.block.candidate}
    assert "layer_norm" in {run.reference.ops[i].op for i in culprit.block.reference}
    assert culprit.fp64.candidate_error > 1e-4 and culprit.fp64.reference_error < 1e-6
    assert result.confirmation.output_error < 1e-6 < 1e-5 < result.confirmation.before


async def test_tui_culprit_panel_lists_the_block(tmp_path, monkeypatch):
    pytest.importorskip("textual")
    from bisectr.present.tui.app import BisectrApp
    from bisectr.present.tui.data import RunData
    from bisectr.present.tui.widgets import CulpritPanel

    path = MODELS / "torch_decomposed.py"
    monkeypatch.chdir(MODELS.parent.parent)  # sources print relative to the working directory
    run = bisectr.trace(path, candidate="wrong_eps", out=tmp_path / "run")
    run.bisect()
    app = BisectrApp(RunData(run))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        panel = " ".join(app.query_one(CulpritPanel).content.plain.split())
    eps_line = line_of(path, "# @eps")
    # the hand-written norm alone (its ops end at the line of the eps), against torch's one layer_norm
    assert f"block candidate ops 0..9 at tests/models/torch_decomposed.py:{eps_line - 2}-{eps_line}" in panel
    assert "against reference op 0 at" in panel and "compared as one op" in panel


BATCH_NORM_IN_TRAINING = """
import torch

def reference():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh())
    return model.train(), (torch.randn(4, 8),)

candidate = reference
"""


def test_replays_read_parameters_where_the_model_holds_them_and_never_write_them(tmp_path, monkeypatch):
    """An op replayed for its evidence reads the model's own weights (no copy through the host), and
    buffers as copies: batch norm in training mode updates its running mean in place without moving
    its version counter, and the model must keep what it holds."""
    model_file = tmp_path / "bn.py"
    model_file.write_text(BATCH_NORM_IN_TRAINING)
    run = bisectr.trace(model_file, out=tmp_path / "run")
    trace, model = run.candidate, run.live.runners["candidate"].side.model
    linear, norm = (next(op for op in trace.ops if op.op == name) for name in ("linear", "batch_norm"))
    held = model[1].running_mean.clone()
    adapter = run.live.runners["candidate"].side.adapter
    copied = []
    monkeypatch.setattr(
        type(adapter),
        "to_numpy",
        lambda self, tensor, original=type(adapter).to_numpy: (
            copied.append(tuple(tensor.shape)) or original(self, tensor)
        ),
    )
    inputs = {tid: trace.value(tid) for tid in linear.inputs if trace.tensors[tid].leaf == "input:0"}
    replayed = run.live.replay("candidate", [linear.index, norm.index], inputs)
    assert (16, 8) not in copied  # the linear weight stayed in the model
    assert bool((model[1].running_mean == held).all())
    for index in (linear.index, norm.index):
        out = trace.ops[index].outputs[0]
        assert abs(replayed[out] - trace.value(out)).max() == 0
