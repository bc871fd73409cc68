"""bisectr judges only what it recorded: sides it cannot see are refused (status 2), a model that fails
only under its interception is bisectr's failure (status 3), and `noise` needs rounding to explain
the outputs' error."""

import json
import re
import subprocess
import sys


from conftest import EXAMPLES, MODELS

UNSEEN = MODELS / "unseen_sides.py"


def bisect(candidate: str, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(UNSEEN), "--candidate", candidate, *options],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_candidate_whose_ranks_run_in_other_processes_is_refused_naming_what_was_seen():
    done = bisect("candidate_ranks")
    assert done.returncode == 2, done.stderr
    assert not done.stdout and "verdict" not in done.stderr
    assert (
        f"{UNSEEN}: the candidate model returned by candidate_ranks() ran no torch op that bisectr could record"
        in done.stderr
    )
    assert (
        "in another process" in done.stderr
        and "Give candidate_ranks() a model that computes its outputs here" in done.stderr
    )


def test_an_output_loaded_from_a_file_is_refused_though_ops_ran_on_it():
    done = bisect("candidate_from_file")
    assert done.returncode == 2, done.stderr
    assert (
        "returned 'output', which no recorded op computed from its inputs or parameters (3 ops recorded)" in done.stderr
    )


def test_a_model_that_fails_only_under_the_interception_is_bisectrs_failure():
    done = bisect("candidate_hiding_from_modes")
    assert done.returncode == 3, done.stderr
    assert (
        "the candidate model returned by candidate_hiding_from_modes() runs without bisectr but raised under its "
        "interception: RuntimeError: this model runs only without a torch function mode"
    ) in done.stderr
    assert "This is a bug in bisectr, not in your model" in done.stderr and "Traceback (user code)" not in done.stderr
    log = done.stderr.split("Its traceback is in ")[1].split(";")[0]
    with open(log) as written:
        logged = written.read()
    assert 'raise RuntimeError("this model runs only without a torch function mode")' in logged  # where it raised


def test_a_model_that_fails_on_its_own_too_is_the_users_error():
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(MODELS / "torch_raises.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback (user code)" in done.stderr, done.stderr


def test_a_paddle_rnn_runs_under_the_interception():
    """paddle's RNNs hand their kernel an uninitialised dropout state: no memory anywhere to describe."""
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(MODELS / "paddle_rnns.py"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "noise" and result["output_error"]["max_rel"] < 1e-6
    assert result["fp64_check"]["status"] == "agree"


def test_noise_is_never_said_where_no_float64_check_ran_and_no_op_explains_the_error():
    done = bisect("candidate_scaled_by_a_millionth", "--reference", "reference_function", "--json")
    result = json.loads(done.stdout)
    assert result["fp64_check"]["status"] == "skipped"
    assert 5e-7 < result["output_error"]["max_rel"] < 2e-6  # below float32's noise floor (16 eps = 1.9e-6)
    assert result["verdict"] == "divergent" and done.returncode == 1 and result["culprit"] is None
    bracket = result["bracket"]
    assert bracket["why"].startswith("rounding does not explain the outputs' error: the float64 check did not run")
    assert [site["op"] for site in bracket["candidate"]] == ["Tensor.mul"]


def test_under_torchrun_every_rank_refuses_instead_of_comparing_its_shard():
    """torchrun starts bisectr once per rank: each would record its own shards against the reference's
    whole tensors and write one run directory. A rank exits 2 saying why (torchrun then stops the
    others, which may not have printed yet), within the time bound."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            "29517",
            "-m",
            "bisectr",
            "bisect",
            str(EXAMPLES / "span_head.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert re.search(r"started by torchrun as rank [01] of 2 \(WORLD_SIZE=2\): run bisectr as one process", done.stderr)
    assert "verdict" not in done.stdout
