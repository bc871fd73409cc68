"""Training steps (`bisectr train`): both sides trained on real torch and paddle runs, the first
semantic step, its stage and culprit."""

import json
import subprocess
import sys
import tracemalloc

import pytest

from conftest import MODELS, line_of

PORTS = MODELS / "training_ports.py"
SPAN = MODELS / "span_training.py"
GPT2 = MODELS / "hf_gpt2_training.py"


def train_json(model, *args) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "train", str(model), "--json", *map(str, args)],
        capture_output=True,
        text=True,
    )
    assert done.returncode in (0, 1), done.stderr
    result = json.loads(done.stdout)
    assert (done.returncode == 1) == (result["verdict"] == "divergent")
    return done.returncode, result


def test_seed_004s_span_head_over_20_adamw_steps_is_noise_within_the_rounding_band():
    status, result = train_json(SPAN, "--steps", 20)
    steps = result["steps"]
    assert status == 0 and result["verdict"] == "noise" and result["first_step"] is None and len(steps) == 20
    for row in steps:
        assert row["loss"]["reference"] > 0 and row["error"]["loss"] < 1e-4  # seed 004's 2e-3 was on real data
        assert row["float64_error"]["loss"] < 1e-9 and row["float64_error"]["update"] < 1e-5
        assert (
            row["error"]["loss"] <= 10 * row["predicted"]["loss"] + 1e-6
        )  # what rounding predicts, and more steps do not leave it
    assert steps[-1]["loss"]["reference"] < 0.8 * steps[0]["loss"]["reference"]  # it trains


@pytest.mark.parametrize("candidate", ["candidate_adam_l2", "torch_adam_l2"])
def test_coupled_against_decoupled_weight_decay_is_the_optimizer_at_step_1(candidate):
    status, result = train_json(PORTS, "--candidate", candidate, "--steps", 3)
    culprit = result["culprit"]
    assert status == 1 and result["first_step"] == 1 and result["stage"] == "optimizer"
    assert culprit["kind"] == "optimizer" and culprit["field"] == "weight decay kind"
    assert (culprit["reference"], culprit["candidate"]) == ("decoupled", "coupled (L2)")
    assert culprit["parameter"].startswith(("blocks.", "head.")) and culprit["update_error"] > 0.1
    first = result["steps"][0]
    assert first["error"]["gradient"] < 1e-5  # the gradients agreed: the update is the optimizer's
    assert first["float64_error"]["moments"] > 0.1  # the decay entered Adam's moments through the gradient


def test_an_epsilon_of_1e_6_against_1e_8_is_named():
    status, result = train_json(PORTS, "--candidate", "candidate_eps", "--steps", 2)
    culprit = result["culprit"]
    assert status == 1 and result["first_step"] == 1 and result["stage"] == "optimizer"
    assert (culprit["field"], culprit["reference"], culprit["candidate"]) == ("epsilon", 1e-8, 1e-6)
    assert result["steps"][0]["float64_error"]["moments"] < 1e-9  # epsilon leaves the moments alone


def test_a_warm_up_one_step_behind_is_the_learning_rate_of_that_step():
    status, result = train_json(
        PORTS, "--reference", "reference_warmup", "--candidate", "candidate_warmup", "--steps", 2
    )
    culprit = result["culprit"]
    assert status == 1 and result["first_step"] == 1 and result["stage"] == "optimizer"
    assert (
        culprit["field"] == "learning rate"
        and culprit["reference"] == pytest.approx(2e-3)
        and culprit["candidate"] == 0.0
    )
    assert result["steps"][1]["learning_rate"] == {"reference": pytest.approx(4e-3), "candidate": pytest.approx(2e-3)}


def test_a_backward_bug_is_step_1_stage_backward_at_its_op():
    status, result = train_json(PORTS, "--candidate", "candidate_pylayer", "--steps", 2)
    culprit = result["culprit"]
    assert status == 1 and result["first_step"] == 1 and result["stage"] == "backward"
    assert culprit["op"] == "WrongGeluGrad" and culprit["candidate"]["module"] == "blocks.1"
    ports = MODELS / "backward_ports.py"
    assert culprit["candidate"]["source"] == f"{ports}:{line_of(ports, 'WrongGeluGrad.apply(h) if variant')}"


def test_loss_functions_that_differ_are_the_forward_stage_with_the_models_cleared():
    status, result = train_json(
        SPAN, "--reference", "reference_cross_entropy", "--candidate", "candidate_cross_entropy", "--steps", 1
    )
    assert status == 1 and result["stage"] == "forward" and result["culprit"] is None
    assert (
        "the models' outputs agree (noise" in result["note"]
        and "the loss functions compute differently" in result["note"]
    )


def test_a_correct_torch_port_matches_and_the_text_shows_the_steps():
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "train", str(PORTS), "--candidate", "torch_port", "--steps", "3"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "training verdict: match over 3 steps" in done.stdout
    assert "loss, reference" in done.stdout and "loss, candidate" in done.stdout and "rounding predicts" in done.stdout


@pytest.mark.parametrize(
    "model, args, message",
    [
        (PORTS, ["--steps", "0"], "--steps must be at least 1 (got 0)"),
        (MODELS / "backward_ports.py", [], "backward_ports.py: defines no function reference_optimizer(model)"),
        (MODELS / "function_sides.py", [], "cannot be trained here: it is a plain function"),
    ],
)
def test_a_model_file_that_cannot_train_is_status_2_naming_the_problem(model, args, message):
    done = subprocess.run([sys.executable, "-m", "bisectr", "train", str(model), *args], capture_output=True, text=True)
    assert done.returncode == 2 and message in done.stderr.replace("\n", " "), done.stderr
    assert "Traceback" not in done.stderr


def test_a_port_that_decays_what_the_reference_exempts_is_named_by_those_parameters():
    status, result = train_json(
        PORTS, "--reference", "reference_grouped", "--candidate", "candidate_decay_all", "--steps", 2
    )
    culprit = result["culprit"]
    assert status == 1 and result["first_step"] == 1 and result["stage"] == "optimizer"
    assert culprit["field"] == "weight decay on 13 parameters the reference exempts (3 norm weights, 10 biases)"
    assert culprit["reference"] == 0.0 and culprit["candidate"] == 0.1


def test_the_same_exemptions_through_apply_decay_param_fun_are_noise():
    status, result = train_json(
        PORTS, "--reference", "reference_grouped", "--candidate", "candidate_exempt", "--steps", 2
    )
    assert status == 0 and result["verdict"] == "noise"


def test_the_paddle_gpt2_port_trained_with_hugging_faces_adamw_groups_is_noise():
    status, result = train_json(GPT2, "--steps", 3)
    assert status == 0 and result["verdict"] == "noise" and result["first_step"] is None
    for row in result["steps"]:
        assert row["error"]["loss"] < 1e-5 and row["float64_error"]["loss"] < 1e-9
        assert row["float64_error"]["gradient"] < 1e-8 and row["float64_error"]["update"] < 1e-6
        # as run, Adam scales the key bias's gradient, zero but for rounding, up to a fifth of the learning rate or more
        assert row["error"]["update"] > 0.05


def test_a_gpt2_port_with_another_beta2_is_the_optimizer_at_step_2_naming_beta2():
    """Bias correction makes the first update independent of beta2; the second differs by about
    0.2%, less than the key bias's rounding as run: each parameter is judged against its own."""
    status, result = train_json(GPT2, "--candidate", "candidate_beta2", "--steps", 3)
    culprit, (first, second, _) = result["culprit"], result["steps"]
    assert status == 1 and result["first_step"] == 2 and result["stage"] == "optimizer"
    assert (culprit["kind"], culprit["field"], culprit["reference"], culprit["candidate"]) == (
        "optimizer",
        "beta2",
        0.999,
        0.99,
    )
    assert 1e-3 < culprit["update_error"] < 4.5e-3
    assert not first["semantic"] and first["float64_error"]["update"] < 1e-6
    assert first["float64_error"]["moments"] == pytest.approx(9, rel=1e-3)  # (1 - 0.99) / (1 - 0.999) - 1
    assert second["float64_error"]["loss"] < 1e-9 and second["float64_error"]["gradient"] < 1e-8
    assert second["error"]["update"] > 10 * culprit["update_error"]


def test_a_gpt2_port_that_decays_its_biases_and_norms_is_the_optimizer_at_step_1_naming_them():
    status, result = train_json(GPT2, "--candidate", "candidate_decay_all", "--steps", 3)
    culprit, first = result["culprit"], result["steps"][0]
    assert status == 1 and result["first_step"] == 1 and result["stage"] == "optimizer"
    assert culprit["field"] == "weight decay on 34 parameters the reference exempts (9 norm weights, 25 biases)"
    assert (culprit["reference"], culprit["candidate"]) == (0.0, 0.01)
    # the decay over the update, lr * 0.01 * w against lr, at the largest LayerNorm weight (about 1.27)
    assert ".ln_" in culprit["parameter"] and 0.01 < culprit["update_error"] < 0.02
    assert first["float64_error"]["loss"] < 1e-9 and first["float64_error"]["gradient"] < 1e-8
    assert first["error"]["update"] > 10 * culprit["update_error"]


WIDE_STACK = """
import torch


def reference():
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU()) for _ in range(4)]
    return torch.nn.Sequential(*layers), (torch.randn(8, 512, generator=torch.Generator().manual_seed(1)),)


candidate = reference


def reference_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


candidate_optimizer = reference_optimizer
"""


def test_the_steps_hold_no_copy_of_every_gradient_update_and_moment(tmp_path):
    """What numpy holds while training (the four trainers' tensors are not numpy's, nor the values before each
    step, which the updates need and the framework keeps) stays within the parameter being compared: no step
    keeps a numpy copy of every parameter."""
    from bisectr.training import train

    model_file = tmp_path / "wide_stack.py"
    model_file.write_text(WIDE_STACK)
    parameters = 4 * (512 * 512 + 512)
    numpy_before_steps = parameters * (2 * 4 + 2 * 8)  # what numpy copies of the values before each step would hold
    at_step_1 = []

    def progress(message: str) -> None:
        if message.startswith("step 1 "):
            at_step_1.append(tracemalloc.get_traced_memory()[0])  # the trace's and the imports' share
            tracemalloc.reset_peak()

    import torch._dynamo  # noqa: F401  (what an optimizer's first step imports, outside the measure)

    tracemalloc.start()
    try:
        result = train(str(model_file), steps=3, progress=progress)
        peak = tracemalloc.get_traced_memory()[1] - at_step_1[0]
    finally:
        tracemalloc.stop()
    assert result.verdict == "match" and len(result.steps) == 3
    comparing_one = 6 * 512 * 512 * 8  # a few float64 arrays of the largest parameter while it is compared
    assert 0 < peak < comparing_one < numpy_before_steps, (peak, comparing_one)
