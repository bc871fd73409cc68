"""One device against tensor parallel: the candidate runs on 2 ranks that torchrun starts (gloo, CPU).

End to end, `bisectr bisect MODEL --candidate-nproc 2 --json` on a small decoder of our own
(`models/tp_decoder.py`, also sequence parallel with a vocabulary-parallel embedding) and on Hugging
Face Llama (`models/tp_hf_llama.py`), both sharded with `parallelize_module`: a correct plan is `noise`;
each planted bug is `divergent` at its first layer's module, confirmed; a rank that raises, runs an extra
op, exits or waits in a collective the others never join is exit 2 naming the rank (and the op), within a
timeout. Without processes (torch's `LocalTensorMode` simulates the ranks): a DTensor is read whole, and
a value is made into a DTensor placed as a recorded one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import MODELS

# Torch's own machinery (torch.compile, torchrun's ranks, signals) or the benchmarks: the first CI
# environment runs these, the PaddleFormers one (numpy 1.26) does not (see .ci/run).
pytestmark = pytest.mark.once

DECODER = MODELS / "tp_decoder.py"
LLAMA = MODELS / "tp_hf_llama.py"
MEGATRON = MODELS / "tp_megatron.py"
MEGATRON_LLAMA = MODELS / "tp_megatron_llama.py"
TIMEOUT_S = 180


def bisect_on_two_ranks(model, *options: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(model), "--candidate-nproc", "2", *options],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, **env},
    )


def result_of(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return json.loads(done.stdout)


def source_line(source: str) -> str:
    path, line = source.rsplit(":", 1)
    with open(path) as file:
        return file.readlines()[int(line) - 1]


@pytest.mark.parametrize(
    "model, env",
    [
        (DECODER, {}),
        (DECODER, {"TP_PLAN": "sequence"}),
        (DECODER, {"TP_PLAN": "sequence_local"}),
        (DECODER, {"TP_QK_NORM": "1"}),
        (LLAMA, {}),
        (LLAMA, {"TP_PLAN": "torchtitan"}),
        (MEGATRON, {}),
        (MEGATRON_LLAMA, {}),
    ],
    ids=[
        "decoder",
        "decoder_sequence_parallel",
        "decoder_sequence_parallel_local_norms",
        "decoder_qk_norm",
        "hf_llama",
        "hf_llama_torchtitan_plan",
        "megatron_by_hand",
        "hf_llama_against_megatron_fused_port",
    ],
)
def test_a_correct_plan_is_noise(model, env):
    result = result_of(bisect_on_two_ranks(model, "--json", **env))
    assert result["verdict"] == "noise"
    assert result["output_error"]["max_rel"] < 1e-6
    check = result["fp64_check"]
    assert (
        check["status"] == "agree" and check["float64_error"] < 1e-12 and not check["narrow_ops"]
    )  # float64 throughout
    assert result["ops"]["aligned"] >= 0.85 * result["ops"]["candidate"]  # local parts of shards are never paired


# bug -> (module of the culprit, the planted line's tag or the line it shows, op)
DECODER_BUGS = {
    "partial": (
        "layers.0.mlp.down",
        "return self.down(",
        "DTensor.to_local",
    ),  # in the row-parallel style's output hook
    "global_heads": ("layers.0.attention", "nn.functional.scaled_dot_product_attention", None),
    "bias_every_rank": ("layers.0.attention", "+ self.o_proj.bias.to_local()", "Tensor.add"),
    "qk_norm_on_shard": ("layers.0.attention", "nn.functional.scaled_dot_product_attention", None),
}


@pytest.mark.parametrize(
    "bug, env",
    [(bug, {}) for bug in DECODER_BUGS if bug != "qk_norm_on_shard"]
    + [
        ("global_heads", {"TP_PLAN": "sequence"}),
        ("global_heads", {"TP_PLAN": "sequence_local"}),
        ("qk_norm_on_shard", {"TP_QK_NORM": "1"}),
    ],
)
def test_a_planted_tp_bug_is_divergent_at_its_first_layer_confirmed(bug, env):
    result = result_of(bisect_on_two_ranks(DECODER, "--json", TP_BUG=bug, **env))
    module, line, op = DECODER_BUGS[bug]
    culprit = result["culprit"]
    assert result["verdict"] == "divergent", result["bracket"]
    assert culprit["candidate"]["module"] == module
    assert line in source_line(culprit["candidate"]["source"])
    assert op is None or culprit["candidate"]["op"] == op
    assert result["confirmation"]["confirmed"] and result["confirmation"]["output_error"] < 1e-6
    layers = [r["module"] for r in result["recurrences"]]  # one difference in every layer
    assert len(layers) == 2 and all(m.startswith(module.replace(".0.", f".{i}.")) for i, m in enumerate(layers)), layers
    assert culprit["placements"]["ranks"] == 2


def test_an_mlp_by_hand_on_each_ranks_columns_whose_input_gradient_is_reduced_is_backward_noise():
    backward = result_of(bisect_on_two_ranks(LLAMA, "--backward", "--json", TP_MLP="local"))["backward"]
    assert backward["verdict"] == "noise" and backward["output_error"]["max_rel"] < 1e-5
    assert backward["unreduced_gradient"] is None


def test_a_gradient_placed_replicate_that_no_rank_reduced_is_named_at_its_first_layer_confirmed():
    backward = result_of(bisect_on_two_ranks(LLAMA, "--backward", "--json", TP_BUG="unreduced_mlp"))["backward"]
    culprit = backward["culprit"]
    assert backward["verdict"] == "divergent" and backward["output_error"]["max_rel"] > 0.1
    assert (culprit["candidate"]["op"], culprit["candidate"]["module"]) == ("DTensor.to_local", "model.layers.0.mlp")
    assert "@unreduced_mlp" in source_line(culprit["candidate"]["source"])
    assert culprit["reference"]["module"] == "model.layers.0.mlp.gate_proj"
    confirmation = backward["confirmation"]
    assert confirmation["confirmed"] and confirmation["output_error"] < 1e-5 and len(confirmation["patched_ops"]) == 2
    assert (
        "placed Replicate (every rank holds the same), but the 2 ranks hold different values"
        in (backward["unreduced_gradient"])
    )


@pytest.mark.parametrize("plan", ["layers", "torchtitan"])
def test_a_forgotten_reduce_in_hf_llama_is_named_at_layer_0s_o_proj(plan):
    done = bisect_on_two_ranks(LLAMA, TP_BUG="forgotten_reduce", TP_PLAN=plan)
    assert done.returncode == 1, done.stderr[-3000:]
    text = done.stdout
    assert "verdict: divergent" in text and "confirmed: taking out" in text
    culprit = text.split("culprit (first semantic difference): copy")[1]
    assert "DTensor.to_local             model.layers.0.self_attn" in culprit
    assert "attn_output = self.o_proj(attn_output)" in culprit
    assert (
        "on 2 ranks: reads Partial(sum); hands on differs by rank (each rank's own values; rank 0's shown)" in culprit
    )


def test_megatron_style_bugs_in_the_row_parallel_class_are_named_where_they_enter():
    """Plain tensors and an explicit all-reduce: a partial sum that goes only into the all-reduce is
    each rank's part, never compared; one that goes on without it is compared, as rank 0 holds it, and
    its own difference is replayed from the paired values that the rank's heads or columns are made from."""
    forgotten = result_of(bisect_on_two_ranks(MEGATRON, "--json", TP_BUG="forgotten_reduce"))
    culprit = forgotten["culprit"]
    assert forgotten["verdict"] == "divergent" and culprit["candidate"]["module"] == "layers.0.attention.o"
    assert "partial = nn.functional.linear(x, self.weight)" in source_line(culprit["candidate"]["source"])
    assert culprit["placements"]["hands_on"] == ["differs by rank"]
    assert (
        len(forgotten["recurrences"]) == 4 and forgotten["confirmation"]["confirmed"]
    )  # attention.o and down, 2 layers
    twice = bisect_on_two_ranks(MEGATRON, TP_BUG="bias_every_rank")
    assert twice.returncode == 1 and "verdict: divergent" in twice.stdout, twice.stderr[-3000:]
    culprit = twice.stdout.split("culprit (first semantic difference)")[1].split("error by op")[0]
    assert "distributed.all_reduce       layers.0.attention.o" in culprit
    assert "partial = partial + self.bias  # @bias_every_rank" in culprit  # among the block's lines
    # attention's and the MLP's blocks end in the same all-reduce line of the class: one difference
    assert "the same difference in 4 places" in culprit and "confirmed: taking out" in culprit


# bug -> (the culprit's module, the line it shows, a line among its block's)
MEGATRON_LLAMA_BUGS = {
    "gate_up_as_stored": (
        "layers.0.mlp.down",
        "dist.all_reduce(partial)",
        "gate, up = self.gate_up(x).chunk(2, dim=-1)",
    ),
    "head_gathered_wrong_dim": ("(top level)", "# @head_gathered_wrong_dim", "dist.all_gather(parts, local)"),
}


@pytest.mark.parametrize("bug", MEGATRON_LLAMA_BUGS)
def test_bugs_of_a_megatron_port_of_hf_llama_with_fused_weights_are_named_where_they_enter(bug):
    """Hugging Face Llama against a hand port on 2 ranks with fused qkv and gate_up, a vocabulary-parallel
    embedding and head (NPROC in the model file: no flag): the converter's gate_up sharded as stored is
    the first layer's MLP, its all-reduce completing it; the head's halves gathered along the wrong dim
    the stack that interleaves them. The residual adds pair the MLP's output, not the norm's copy of the
    residual, and the halves `all_gather` writes are its outputs, not the empty tensors it fills."""
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(MEGATRON_LLAMA)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "TP_BUG": bug},
    )
    assert done.returncode == 1, done.stderr[-3000:]
    module, line, among = MEGATRON_LLAMA_BUGS[bug]
    assert re.search(r"^verdict: divergent {3}outputs differ", done.stdout, re.M), done.stdout
    culprit = done.stdout.split("culprit (first semantic difference)")[1].split("error by op")[0]
    site = culprit.split("\n")[1:3]
    assert site[0].rstrip().endswith(f"  {module}") and line in site[1], culprit
    assert among in culprit and "on 2 ranks" in culprit
    assert "confirmed: taking out" in culprit


HF_PLAN = MODELS / "tp_hf_plan.py"


def test_hugging_faces_own_tensor_parallelism_is_rounding_and_a_converters_mistake_is_named_at_its_layer():
    """`from_pretrained(..., tp_plan="auto")`: transformers' own parallel styles shard the model (their
    layout query makes a meta tensor, structure and no values). Correct it is rounding; a checkpoint holding
    layer 1's o_proj weight transposed is named at that leaf, read whole: of the two layers' square o_proj
    weights, one fits either layout, and the layout of the weights that are not square decides."""
    correct = result_of(bisect_on_two_ranks(HF_PLAN, "--json"))
    assert correct["verdict"] == "noise" and correct["output_error"]["max_rel"] < 1e-6
    assert correct["ops"]["aligned"] == correct["ops"]["candidate"]
    result = result_of(bisect_on_two_ranks(HF_PLAN, "--json", "--candidate", "candidate_o_proj_transposed"))
    culprit = result["culprit"]
    assert result["verdict"] == "divergent" and result["confirmation"]["confirmed"]
    assert (
        culprit["leaf"] == "model.layers.1.self_attn.o_proj.weight"
        and culprit["candidate"]["module"] == "model.layers.1.self_attn.o_proj"
    )
    assert culprit["description"] == "transposed"
    assert 0.9 < result["confirmation"]["before"] < 0.97 and result["confirmation"]["output_error"] < 1e-6


def test_a_rank_that_raises_is_named_with_its_traceback():
    done = bisect_on_two_ranks(DECODER, TP_FAULT="raise")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "rank 1 of the candidate side:" in done.stderr and "raised RuntimeError: rank 1 cannot go on" in done.stderr
    assert 'raise RuntimeError("rank 1 cannot go on")  # @raise' in done.stderr
    assert not done.stdout


def test_a_rank_that_runs_an_extra_op_is_named_with_the_op():
    done = bisect_on_two_ranks(DECODER, TP_FAULT="extra_op")
    assert done.returncode == 2, done.stderr[-3000:]
    assert (
        f"the candidate side's ranks ran different ops: op 1 is Tensor.mul in the model at {DECODER}:" in done.stderr
        and "on rank 1 and nn.functional.rms_norm in layers.0.attention_norm" in done.stderr
    )


def test_ranks_that_run_the_same_ops_in_another_order_are_named_with_the_op_that_reads_them():
    done = bisect_on_two_ranks(DECODER, TP_FAULT="order")
    assert done.returncode == 2, done.stderr[-3000:]
    assert (
        f"the candidate side's ranks ran their ops in different orders: op 3, Tensor.add in the model at {DECODER}:"
        in done.stderr
        and "reads the outputs of ops 2, 1 on rank 1 and of ops 1, 2 on rank 0" in done.stderr
    )


def test_a_rank_whose_process_exits_is_named():
    done = bisect_on_two_ranks(DECODER, TP_FAULT="die")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "bisectr: error: rank 1 of the candidate side" in done.stderr and "exited while recording" in done.stderr
    assert "exitcode  : 7" in done.stderr  # torchrun's own report, above


def test_a_rank_waiting_in_a_collective_the_others_skip_ends_within_the_timeout():
    """Its collective times out, or fails once another rank's timed out (gloo says either); the rank
    whose collective fails first is named, with its line (rank 1's barrier, as a rule)."""
    started = time.monotonic()
    done = bisect_on_two_ranks(DECODER, TP_FAULT="hang", BISECTR_RANK_TIMEOUT="5")
    assert done.returncode == 2, done.stderr[-3000:]
    named = re.search(r"bisectr: error: rank ([01]) of the candidate side:", done.stderr)
    assert named, done.stderr[-3000:]
    assert named.group(1) == "0" or "torch.distributed.barrier()  # @hang" in done.stderr
    assert time.monotonic() - started < 60


def test_a_side_that_needs_ranks_started_on_one_process_is_told_the_flag():
    """The example declares NPROC; overriding it with one process is the mistake a user makes without it."""
    example = MODELS.parent.parent / "examples" / "tensor_parallel.py"
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(example), "--candidate-nproc", "1"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert (
        "candidate() builds a side on several ranks (reads WORLD_SIZE, which a launcher sets for each rank) but "
        "the candidate side runs on one process: pass --candidate-nproc N, or declare it in the model file: "
        "NPROC = {'candidate': N}"
    ) in done.stderr


def test_an_interpreter_without_torch_cannot_start_the_ranks(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=60)
    bare = tmp_path / "bare" / "bin" / "python"
    done = bisect_on_two_ranks(DECODER, "--candidate-python", str(bare))
    assert done.returncode == 2, done.stderr[-3000:]
    assert (
        f"torchrun for the candidate side ({bare} -m torch.distributed.run) exited with status 1 "
        "before its ranks started" in done.stderr
    )


# -- without processes -------------------------------------------------------------------------------
@pytest.fixture
def two_simulated_ranks():
    """A fake process group of 2 ranks and torch's `LocalTensorMode` simulating them in this process."""
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", world_size=2, rank=0, store=FakeStore())
    try:
        with LocalTensorMode(2) as mode:
            yield mode, init_device_mesh("cpu", (2,))
    finally:
        dist.destroy_process_group()


WHOLE = np.arange(12, dtype=np.float32).reshape(4, 3)


def local_parts(dtensor) -> list[np.ndarray]:
    local = dtensor.to_local()
    return (
        [local._local_tensors[rank].numpy() for rank in range(2)]
        if hasattr(local, "_local_tensors")
        else [local.numpy()] * 2
    )


@pytest.mark.parametrize("placement", ["Shard(dim=0)", "Shard(dim=1)", "Replicate()"])
def test_a_dtensor_is_read_whole_and_a_value_made_as_it_is_placed(two_simulated_ranks, placement):
    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from bisectr.adapters.torch import TorchAdapter

    _, mesh = two_simulated_ranks
    placed = {"Shard(dim=0)": Shard(0), "Shard(dim=1)": Shard(1), "Replicate()": Replicate()}[placement]
    adapter = TorchAdapter()
    dtensor = distribute_tensor(torch.from_numpy(WHOLE), mesh, [placed])
    assert adapter.placement(dtensor) == placement and adapter.sharded(dtensor) == placed.is_shard()
    assert np.array_equal(adapter.to_numpy(dtensor), WHOLE)
    made = adapter.from_numpy(WHOLE + 1, "float32", "cpu", adapter.layout(dtensor))
    assert np.array_equal(adapter.to_numpy(made), WHOLE + 1)
    expected = np.array_split(WHOLE + 1, 2, axis=placed.dim) if placed.is_shard() else [WHOLE + 1] * 2
    for part, wanted in zip(local_parts(made), expected):
        assert np.array_equal(part, wanted)


def test_a_partial_sum_is_read_reduced_and_a_new_value_keeps_each_ranks_part(two_simulated_ranks):
    import torch
    from torch.distributed.tensor import DTensor, Partial

    from bisectr.adapters.torch import TorchAdapter

    mode, mesh = two_simulated_ranks
    adapter = TorchAdapter()
    parts = mode.rank_map(lambda rank: torch.from_numpy(WHOLE) * (0.25 if rank == 0 else 0.75))
    dtensor = DTensor.from_local(parts, mesh, [Partial()])
    assert adapter.placement(dtensor) == "Partial(sum)" and not adapter.sharded(dtensor)
    assert np.array_equal(adapter.to_numpy(dtensor), WHOLE)
    made = adapter.from_numpy(WHOLE + 2, "float32", "cpu", adapter.layout(dtensor))
    assert np.array_equal(adapter.to_numpy(made), WHOLE + 2)
    first, second = local_parts(made)  # each rank's own part, moved by half the difference
    assert np.array_equal(first, WHOLE * 0.25 + 1) and np.array_equal(second, WHOLE * 0.75 + 1)
