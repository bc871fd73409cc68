"""Training on several processes against one (`bisectr train` with a side on torchrun's ranks): DDP, FSDP2 and
tensor parallel with sequence parallel, correct (`noise`) and with the bugs of `ranks_training.py`, each named at
its step and stage; bad input refused naming its cause; the same on two machines (two torchrun agents here)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import MODELS, line_of

RANKS = MODELS / "ranks_training.py"

pytestmark = pytest.mark.once


def train(candidate: str, steps: int, *options: str, model: Path = RANKS) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bisectr", "train", str(model), "--candidate", candidate, "--steps", str(steps)]
        + list(options),
        capture_output=True,
        text=True,
        timeout=600,
    )


def train_json(candidate: str, steps: int, model: Path = RANKS) -> dict:
    done = train(candidate, steps, "--json", model=model)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "candidate", ["candidate_ddp", "candidate_fsdp_bf16_reduce", "candidate_tp_sp", "candidate_tp_sp_local_up"]
)
def test_correct_training_on_2_ranks_is_noise_over_5_steps(candidate):
    result = train_json(candidate, 5)
    assert result["verdict"] == "noise" and len(result["steps"]) == 5
    for row in result["steps"]:
        assert row["float64_error"]["gradient"] < 1e-12 and row["float64_error"]["update"] < 1e-12
        assert row["error"]["loss"] < 1e-4
    bf16 = candidate == "candidate_fsdp_bf16_reduce"
    assert (result["steps"][0]["error"]["gradient"] > 1e-4) == bf16  # a bf16 reduction rounds, within its own rounding


def test_hugging_face_llama_under_fsdp2_is_noise_and_averaged_twice_under_ddp_is_the_reduction():
    llama = MODELS / "hf_llama_ranks_training.py"
    assert train_json("candidate_fsdp", 2, model=llama)["verdict"] == "noise"
    result = train_json("candidate_ddp_averaged_twice", 2, model=llama)
    assert (result["verdict"], result["first_step"], result["stage"]) == ("divergent", 1, "reduction")
    assert result["culprit"]["factor"] == pytest.approx(0.5, rel=1e-6) and len(result["culprit"]["parameters"]) == 21


def test_the_sequence_parallel_plan_bisected_pairs_each_norm_weight_with_its_own():
    """The norm's input is made by the plan's conversion on the candidate and a leaf on the reference: its
    weight and bias still pair by argument position, not one place early."""
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(RANKS), "--candidate", "candidate_tp_sp", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = json.loads(done.stdout)
    assert result["verdict"] == "noise" and result["leaves"]["summary"] == "14 leaves paired (14 equal)", done.stderr


def test_accumulation_over_micro_batches_divided_by_their_number_is_noise():
    result = train_json("candidate_ddp_accumulation", 2)
    assert result["verdict"] == "noise"


def test_gradients_averaged_twice_are_the_reduction_at_step_1_with_their_factor():
    result = train_json("candidate_ddp_averaged_twice", 2)
    culprit = result["culprit"]
    assert (result["verdict"], result["first_step"], result["stage"]) == ("divergent", 1, "reduction")
    assert culprit["kind"] == "reduction" and culprit["side"] == "candidate"
    assert culprit["factor"] == pytest.approx(0.5, rel=1e-6) and "averaged twice" in culprit["what"]
    assert len(culprit["parameters"]) == 14 and "module.blocks.0.up.weight" in culprit["parameters"]
    assert result["steps"][0]["float64_error"]["loss"] < 1e-12  # the losses agree: not the forward


def test_norms_left_out_of_the_sequence_parallel_plan_are_never_reduced():
    result = train_json("candidate_tp_sp_norm_unreduced", 2)
    culprit = result["culprit"]
    assert (result["verdict"], result["first_step"], result["stage"]) == ("divergent", 1, "reduction")
    assert sorted(culprit["parameters"]) == sorted(
        f"blocks.{block}.norm.{name}" for block in (0, 1) for name in ("weight", "bias")
    )
    assert "never reduced across the 2 ranks" in culprit["what"] and "their sum" in culprit["what"]


def test_accumulation_without_dividing_by_the_micro_batches_is_named_by_its_factor():
    result = train_json("candidate_ddp_undivided", 2)
    assert (result["verdict"], result["first_step"], result["stage"]) == ("divergent", 1, "forward")
    first = result["steps"][0]["loss"]
    assert first["candidate"] == pytest.approx(2 * first["reference"], rel=1e-5)
    assert "accumulates 2 micro-batches, each loss not divided by 2" in result["note"]


def test_a_world_size_that_does_not_divide_the_batch_is_refused():
    done = train("candidate_ddp_uneven", 2, "--no-tui")
    assert done.returncode == 2, done.stderr
    assert "2 ranks were given batches of different shapes at step 1" in done.stderr
    assert "rank 0: (3, 8, 16); rank 1: (1, 8, 16)" in done.stderr and "does not divide the batch" in done.stderr


def test_a_rank_that_raises_in_its_step_is_named_with_the_step_and_line():
    done = train("candidate_ddp_raises", 3, "--no-tui")
    assert done.returncode == 2, done.stderr
    assert "rank 1 of the candidate side" in done.stderr
    assert "candidate_ddp_raises_batch(2) raised RuntimeError: the data loader of rank 1 failed" in done.stderr
    assert f'ranks_training.py", line {line_of(RANKS, "@raises")}' in done.stderr


def test_a_local_shard_taken_without_its_backward_reduction_is_named_at_step_1_in_the_backward():
    result = train_json("candidate_tp_sp_missing_reduction", 1)
    assert (result["verdict"], result["first_step"], result["stage"]) == ("divergent", 1, "backward")
    culprit = result["culprit"]
    assert culprit["candidate"]["source"].endswith(f"ranks_training.py:{line_of(RANKS, '@missing_reduction')}")
    assert (culprit["candidate"]["module"], culprit["reference"]["op"]) == ("blocks.0", "nn.functional.linear")
    assert "placed Replicate" in result["note"] and "2 ranks hold different values" in result["note"]
    assert "summed over the ranks there, the candidate's gradients are the reference's" in result["note"]


def test_a_parameter_unused_on_one_rank_under_ddp_is_named_before_its_reduction_hangs():
    done = train("candidate_ddp_unused", 2, "--reference", "reference_routed", "--no-tui")
    assert done.returncode == 2, done.stderr
    assert "at step 1, the candidate's module.expert.bias, module.expert.weight are unused on rank 1" in done.stderr
    assert "find_unused_parameters=True" in done.stderr


def test_ddp_told_of_unused_parameters_averages_without_them_and_is_noise():
    done = train("candidate_ddp_unused_found", 2, "--reference", "reference_routed", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verdict"] == "noise"


# -- two machines: two torchrun agents on this one, one rank each ------------------------------------


def free_port_pair() -> int:
    """A port whose next port is free too (torchrun's store, and bisectr's on the next)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        try:
            with socket.socket() as following:
                following.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise AssertionError("no two free ports in a row")


def on_nodes(
    command: list[str], port: int, nodes: tuple[int, ...] = (0, 1), **env: str
) -> dict[int, subprocess.CompletedProcess]:
    """`command` run as each of `nodes` of 2 (every other node first, in the background), one rank each."""
    options = ["--candidate-nproc", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    environment = {**os.environ, **env}
    started = {
        node: subprocess.Popen(
            [sys.executable, "-m", "bisectr", *command, *options, "--node-rank", str(node)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        for node in sorted(nodes, reverse=True)
    }
    done = {}
    for node, process in started.items():
        stdout, stderr = process.communicate(timeout=600)
        done[node] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return done


def test_two_nodes_of_one_rank_give_the_answers_of_one_node_of_two():
    trained = ["train", str(RANKS), "--steps", "2", "--json", "--candidate"]
    correct = on_nodes([*trained, "candidate_ddp"], free_port_pair())
    averaged_twice = on_nodes([*trained, "candidate_ddp_averaged_twice"], free_port_pair())
    for done in (*correct.values(), *averaged_twice.values()):
        assert done.returncode in (0, 1), done.stderr
    assert "node 1 of 2: 1 rank(s) of the candidate side" in correct[1].stderr and not correct[1].stdout
    assert json.loads(correct[0].stdout)["verdict"] == "noise"
    result = json.loads(averaged_twice[0].stdout)
    assert (result["verdict"], result["first_step"], result["stage"]) == ("divergent", 1, "reduction")
    assert result["culprit"]["factor"] == pytest.approx(0.5, rel=1e-6) and len(result["culprit"]["parameters"]) == 14


def test_a_tensor_parallel_forward_on_two_nodes_is_bisected_as_on_one():
    done = on_nodes(["bisect", str(MODELS / "tp_decoder.py"), "--json"], free_port_pair())
    assert done[0].returncode == 0 and done[1].returncode == 0, done[0].stderr + done[1].stderr
    assert json.loads(done[0].stdout)["verdict"] == "noise"


def test_a_node_that_never_joins_is_named_within_the_join_timeout():
    started = time.monotonic()
    done = on_nodes(
        ["train", str(RANKS), "--candidate", "candidate_ddp"], free_port_pair(), (0,), BISECTR_JOIN_TIMEOUT="10"
    )[0]
    assert done.returncode == 2 and time.monotonic() - started < 120, done.stderr
    assert "node 1 of 2 never joined (the rendezvous at 127.0.0.1:" in done.stderr


def test_a_node_whose_node_0_never_comes_stops_within_the_join_timeout():
    done = on_nodes(
        ["train", str(RANKS), "--candidate", "candidate_ddp"], free_port_pair(), (1,), BISECTR_JOIN_TIMEOUT="10"
    )[1]
    assert done.returncode == 2, done.stderr
    assert "node 0 never came to the rendezvous at 127.0.0.1:" in done.stderr
