"""An op without a float64 kernel (torch's `_grouped_mm`, paddle's `fused_rms_norm` on CPU) runs at its
recorded dtype in the float64 check and is listed below float64; the fp64 oracle of such an op is
missing, and says why. Neither is a crash, nor blamed on the model."""

import importlib.metadata
import json
import math
import subprocess
import sys

import numpy as np
import pytest

import bisectr
from bisectr.adapters import CannotUpcast
from bisectr.measure.analysis import Analysis
from bisectr.sides.runner import ReplayVJP
from bisectr.engines.float64 import float64_forward, float64_replay
from bisectr.engines.gradient import float64_gradients
from conftest import MODELS, assert_verdict_contract

NO_FLOAT64 = MODELS / "no_float64_kernel.py"
MIXTRAL = MODELS / "hf_mixtral_experts.py"
GROUPED_MM = "_VariableFunctionsClass._grouped_mm"
GROUPED_MM_RAISED = "run at float32: in float64 it raised RuntimeError: Expected mat_a to be Float32"


def _grouped_experts_in_float64(side, tanh: bool) -> np.ndarray:
    """What the experts of `no_float64_kernel.py` (the side's model) compute, in float64 by numpy."""
    model, (x,) = side.model, side.inputs
    x, up, down = (t.detach().numpy().astype(np.float64) for t in (x, model.up, model.down))
    groups = [slice(start, end) for start, end in zip([0, *model.offsets.tolist()], model.offsets.tolist())]
    h = np.concatenate([x[rows] @ up[g] for g, rows in enumerate(groups)])
    if tanh:
        h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    else:
        h = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
    return np.concatenate([h[rows] @ down[g] for g, rows in enumerate(groups)])


def test_the_grouped_products_run_at_float32_in_the_float64_runs_of_both_paths(tmp_path):
    run = bisectr.trace(NO_FLOAT64, "reference", "candidate_exact_gelu", out=tmp_path / "run")
    for role, tanh in (("reference", True), ("candidate", False)):
        side = run.live.runners[role]
        # the recorded calls, then the model's code
        replayed, replayed_calls = float64_replay(side.side.adapter, side.trace, side.recorded, {})
        own, own_calls = float64_forward(side.side, side.trace, {})
        truth = _grouped_experts_in_float64(side.side, tanh)
        for outputs, calls in ((replayed, replayed_calls), (own, own_calls)):
            assert outputs["output"].dtype == np.float64
            # float32 rounding of the two grouped products, not float64's (1e-16), nor a difference (1e-4)
            error = np.abs(outputs["output"] - truth).max() / np.abs(truth).max()
            assert 5e-8 < error < 1e-6, (role, error)
            assert calls.narrow == {GROUPED_MM: 2}
            [listed] = calls.narrow_ops()
            assert listed.startswith(f"{GROUPED_MM} (x2; {GROUPED_MM_RAISED}"), listed
        assert np.array_equal(replayed["output"], own["output"])


def test_the_float64_gradients_run_the_grouped_products_at_float32(tmp_path):
    import torch

    run = bisectr.trace(NO_FLOAT64, out=tmp_path / "run")
    side = run.live.runners["reference"]
    model, inputs = side.side.model, side.side.inputs
    seed = np.random.default_rng(5).standard_normal((24, 16))
    float64 = float64_gradients(side.side, side.trace, {"output": seed}, {})
    model.zero_grad()
    with torch.enable_grad():
        (model(*inputs) * torch.from_numpy(seed).float()).sum().backward()
    for name in ("up", "down"):
        float32 = getattr(model, name).grad.numpy()
        gradient = float64.values[f"param:{name}"]
        assert gradient.dtype == np.float64
        assert 1e-8 < np.abs(gradient - float32).max() / np.abs(float32).max() < 1e-6, name
    assert float64.narrow_ops == [f"{GROUPED_MM} (x2; {GROUPED_MM_RAISED}, BFloat16 or Float16 matrix, got Double)"]


def test_a_planted_gelu_after_grouped_products_is_divergent_with_them_listed_below_float64(tmp_path):
    result = bisectr.bisect(NO_FLOAT64, candidate="candidate_exact_gelu").to_dict()
    assert_verdict_contract(result)
    culprit, check = result["culprit"], result["fp64_check"]
    assert result["verdict"] == "divergent" and 2e-4 < result["output_error"]["max_rel"] < 3e-4
    assert culprit["op"] == "gelu" and culprit["candidate"]["index"] == 1 and result["confirmation"]["confirmed"]
    assert check["status"] == "disagree" and 2e-4 < check["float64_error"] < 3e-4
    assert check["predicted"] < 1e-6  # both sides' rounding, their grouped products' float32 rounding included
    for role in ("reference", "candidate"):
        [listed] = check["narrow_ops"][role]
        assert listed.startswith(f"{GROUPED_MM} (x2; {GROUPED_MM_RAISED}")


def test_an_isolated_side_runs_its_grouped_products_at_float32_too():
    result = bisectr.bisect(NO_FLOAT64, candidate="candidate_exact_gelu", isolate=True).to_dict()
    check = result["fp64_check"]
    assert result["verdict"] == "divergent" and check["status"] == "disagree" and 2e-4 < check["float64_error"] < 3e-4
    assert all(ops[0].startswith(f"{GROUPED_MM} (x2; {GROUPED_MM_RAISED}") for ops in check["narrow_ops"].values())
    assert check["narrow_ops"].keys() == {"reference", "candidate"}


def test_an_op_without_a_float64_kernel_has_no_oracle_and_says_why(tmp_path):
    run = bisectr.trace(NO_FLOAT64, "reference", "candidate_expert_weights", out=tmp_path / "run")
    with pytest.raises(
        CannotUpcast, match=f"{GROUPED_MM} cannot run in float64 \\(it raised RuntimeError: Expected mat_a"
    ):
        run.live.replay("reference", [0], {}, float64=True)
    values = {tid: run.reference.value(tid) for tid in run.reference.ops[0].inputs if run.reference.has_value(tid)}
    upstream = {run.reference.ops[0].outputs[0]: np.ones((24, 32))}
    with pytest.raises(CannotUpcast, match=f"{GROUPED_MM} cannot run in float64"):
        run.live.ask("reference", ReplayVJP([0], values, upstream, float64=True))
    evidence = Analysis(run.live).evidence(0, 0, oracle=True)  # expert 1's weights scaled by 1.01
    assert evidence.fp64 is None and evidence.fp64_unavailable.startswith(f"{GROUPED_MM} cannot run in float64")
    assert 0.005 < evidence.local_error < 0.01 and evidence.verdict == "different"


def test_an_op_that_writes_in_place_and_has_no_float64_kernel_skips_the_check_naming_it():
    result = bisectr.bisect(NO_FLOAT64, candidate="candidate_in_place").to_dict()
    assert_verdict_contract(result)
    check = result["fp64_check"]
    assert check["status"] == "skipped"
    assert check["reason"] == (
        "the candidate cannot run in float64: _experts.<locals>.ExactGeluInPlace.apply cannot run "
        "in float64 (it raised TypeError: ExactGeluInPlace takes float32 only, got torch.float64), "
        "and it writes in place: it cannot run at its recorded dtypes on a copy"
    )
    assert result["verdict"] == "divergent" and result["confirmation"]["confirmed"]
    assert result["culprit"]["candidate"]["op"] == "_experts.<locals>.ExactGeluInPlace.apply"


def test_paddles_fused_rms_norm_runs_at_float32_and_the_port_is_noise():
    result = bisectr.bisect(NO_FLOAT64, "rms_norm", "fused_rms_norm").to_dict()
    assert_verdict_contract(result)
    check = result["fp64_check"]
    assert result["verdict"] == "noise" and 5e-8 < result["output_error"]["max_rel"] < 1e-6
    assert check["status"] == "agree" and 1e-8 < check["float64_error"] < 3e-7  # the fused norm's float32 rounding
    assert check["narrow_ops"].keys() == {"candidate"}
    [listed] = check["narrow_ops"]["candidate"]
    assert listed.startswith(
        "_C_ops.fused_rms_norm_quant (run at float32: in float64 it raised RuntimeError: (NotFound) "
        "The kernel with key (CPU, Undefined(AnyLayout), float64) of kernel `fused_rms_norm_quant` "
        "is not registered"
    )


def test_a_culprit_whose_reference_has_no_float64_kernel_is_judged_by_its_local_error_and_says_so():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisectr",
            "bisect",
            str(NO_FLOAT64),
            "--reference",
            "fused_rms_norm",
            "--candidate",
            "rms_norm_wide_eps",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr
    assert (
        "  vs fp64: no oracle (_C_ops.fused_rms_norm_quant cannot run in float64 (it raised RuntimeError: (NotFound) "
        "The kernel with key (CPU, Undefined(AnyLayout), float64) of kernel `fused_rms_norm_quant` is not registered."
    ) in done.stdout
    result = bisectr.bisect(NO_FLOAT64, "fused_rms_norm", "rms_norm_wide_eps").to_dict()
    assert_verdict_contract(result)
    culprit = result["culprit"]
    assert result["verdict"] == "divergent" and result["confirmation"]["confirmed"]
    assert culprit["reference"]["op"] == "_C_ops.fused_rms_norm_quant" and culprit["block"]["candidate"] == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]
    assert culprit["fp64"] is None and culprit["fp64_unavailable"].startswith(
        "_C_ops.fused_rms_norm_quant cannot run in float64"
    )
    assert 0.005 < culprit["local_error"] < 0.02 and culprit["verdict"] == "different"  # epsilon 1e-2 against 1e-6


# ---------------------------------------------------------------- a tiny Hugging Face Mixtral

needs_grouped_experts = pytest.mark.skipif(
    int(importlib.metadata.version("transformers").split(".")[0]) < 5,
    reason="transformers 5 runs Mixtral's experts with grouped matrix products",
)


@needs_grouped_experts
def test_mixtral_against_itself_is_a_match():
    result = bisectr.bisect(MIXTRAL).to_dict()
    assert result["verdict"] == "match" and result["output_error"]["max_abs"] == 0.0


@needs_grouped_experts
def test_mixtral_with_one_experts_gelu_is_divergent_at_that_layers_experts_confirmed():
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(MIXTRAL), "--candidate", "candidate_expert_gelu", "--json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert_verdict_contract(result)
    culprit, confirmation, check = result["culprit"], result["confirmation"], result["fp64_check"]
    assert result["verdict"] == "divergent" and 1e-3 < result["output_error"]["max_rel"] < 3e-3
    assert (
        culprit["candidate"]["module"] == "model.layers.1.mlp.experts"
        and culprit["candidate"]["op"] == "nn.functional.gelu"
    )
    assert culprit["reference"]["module"] == "model.layers.1.mlp.experts.act_fn" and culprit["op"] == "silu"
    assert 0.05 < culprit["local_error"] < 0.2 and culprit["fp64"]["reference_error"] < 1e-6
    assert confirmation["confirmed"] and confirmation["output_error"] < 1e-6 < 1e-3 < confirmation["before"]
    assert check["status"] == "disagree" and 1e-3 < check["float64_error"] < 3e-3 and check["predicted"] < 1e-6
    for role in ("reference", "candidate"):
        assert [op.split(" (x2; ")[0] for op in check["narrow_ops"][role]] == [
            f"{GROUPED_MM} in model.layers.{layer}.mlp.experts" for layer in (0, 1)
        ]
        assert all(GROUPED_MM_RAISED in op for op in check["narrow_ops"][role])


@needs_grouped_experts
def test_mixtrals_float64_runs_agree_on_the_recorded_calls_and_the_models_code(tmp_path):
    """The model's code follows the recording op for op, in-place writes (`inv_perm[perm] = ...`)
    counted as ops: each grouped product finds its recorded dtypes in both layers."""
    run = bisectr.trace(MIXTRAL, "reference", "candidate_expert_gelu", out=tmp_path / "run")
    for role, side in run.live.runners.items():
        replayed, replayed_calls = float64_replay(side.side.adapter, side.trace, side.recorded, {})
        own, own_calls = float64_forward(side.side, side.trace, {})
        assert np.array_equal(replayed["logits"], own["logits"]) and own["logits"].dtype == np.float64, role
        assert (
            replayed_calls.narrow
            == own_calls.narrow
            == {f"{GROUPED_MM} in model.layers.{layer}.mlp.experts": 2 for layer in (0, 1)}
        )
