"""Smoke test: `python benchmarks/run.py --quick` runs end to end and prints every section of its table.

No timing assertions: the figures of a quick run on a shared machine mean little.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Torch's own machinery (torch.compile, torchrun's ranks, signals) or the benchmarks: the first CI
# environment runs these, the PaddleFormers one (numpy 1.26) does not (see .ci/run).
pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parent.parent


def run_benchmark(script: str, *args: str, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    """`python benchmarks/SCRIPT ARGS` from the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


def documentation() -> str:
    """The README and every page of docs/, where the benchmarks' commands are given."""
    return "\n".join(page.read_text() for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


HEADINGS = [
    "bisectr benchmarks",
    "Recording overhead",
    "Store size and peak memory",
    "Search for the planted tanh GELU",
    "Aligner on synthetic traces",
    "PaDiff vs bisectr",
    "Targets",
]


def test_quick_benchmark_runs_and_prints_the_table(tmp_path):
    raw = tmp_path / "figures.json"
    done = run_benchmark("run.py", "--quick", "--json", str(raw), timeout=900, COLUMNS="200")
    assert done.returncode == 0, (
        f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    )
    for heading in HEADINGS:
        assert heading in done.stdout, f"missing {heading!r} in:\n{done.stdout[-3000:]}"
    for row in ("interception alone", "the search (Run.bisect()", "whole `bisectr bisect`", "recording's extra memory"):
        assert row in done.stdout, f"missing row {row!r}"
    for column in ("torch", "paddle", "target", "holds"):
        assert column in done.stdout
    assert raw.is_file() and raw.stat().st_size > 0


def scale(tmp_path, *args: str) -> tuple[list[dict], str]:
    """`benchmarks/scale.py ARGS` at one layer: its JSON rows and what it printed."""
    raw = tmp_path / "scale.json"
    done = run_benchmark("scale.py", "--layers", "1", *args, "--json", str(raw), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(raw.read_text()), done.stdout


def test_scale_benchmark_finds_the_planted_gelu_in_a_one_layer_ctrl_sized_pair(tmp_path):
    """benchmarks/scale.py at one layer (d_model 1280, d_ff 8192: 27M parameters per side), no op values
    stored: both pairs name the planted exact GELU's layer and print the ratios."""
    rows, printed = scale(tmp_path, "--value-budget", "0")
    assert [row["pair"] for row in rows] == ["torch vs torch", "torch vs paddle"]
    for row in rows:
        assert row["bisect_verdict"] == "divergent" and row["bisect_confirmed"], row
        assert row["bisect_culprit"].startswith("h.0.mlp"), row
        assert (
            row["peak_ratio"] > 0
            and row["time_ratio"] > 0
            and 0 < row["run_dir_ratio"] < 1
            and row["search_forwards"] > 0
        )
    assert "peak" in printed and "run dir" in printed and "one forward of both sides" in printed


def test_scale_benchmark_isolates_each_side_in_its_own_process(tmp_path):
    """`--isolate`: the torch vs paddle pair at one layer, each side in a worker, names the same
    planted GELU; the largest process holds one side's model, under what plain holds for both."""
    (row,), printed = scale(tmp_path, "--pairs", "paddle", "--isolate")
    assert row["isolate"] and row["bisect_verdict"] == "divergent" and row["bisect_confirmed"], row
    assert row["bisect_culprit"].startswith("h.0.mlp"), row
    assert row["peak_ratio"] < 1.0, row
    assert "largest process" in printed


def test_scale_benchmark_trains_the_one_layer_pair_as_the_readme_quotes(tmp_path):
    """`benchmarks/scale.py --layers 1 --train 3`, sampled to its torch vs paddle pair (the benchmark runs
    both): it finds the planted GELU at step 1, in the forward; bisectr train's peak stays under 4.5x plain
    training's (measured 2.8x-3.1x; 5.2x-6.0x when every step's gradients, updates and moments were kept
    as copies)."""
    assert "python benchmarks/scale.py --layers 1 --train 3" in documentation().replace("\n", " ")
    rows, _ = scale(tmp_path, "--train", "3", "--pairs", "paddle")
    assert [row["pair"] for row in rows] == ["torch vs paddle"]
    for row in rows:
        assert (
            row["train_verdict"] == "divergent" and row["train_first_step"] == 1 and row["train_stage"] == "forward"
        ), row
        assert row["train_culprit"].startswith("h.0.mlp"), row
        assert 1 < row["peak_ratio"] < 4.5 and row["time_ratio"] > 0, row


def test_profile_names_the_recorders_own_functions():
    done = run_benchmark("run.py", "--quick", "--profile", "torch", "deep", "stats")
    assert done.returncode == 0, f"exit {done.returncode}\nstderr:\n{done.stderr[-3000:]}"
    tree, flat = done.stdout.split("Functions by own time")
    for frame in ("record_side", "Recorder.call"):
        assert frame in tree, f"missing {frame!r} in:\n{tree[-3000:]}"
    assert "recording.py" in flat


def test_tensor_parallel_benchmark_prints_time_and_each_ranks_memory():
    assert "python benchmarks/tensor_parallel.py" in documentation()
    done = run_benchmark("tensor_parallel.py", "--forwards", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(
        r"TP=2 bisect of tensor_parallel.py \(divergent\): [\d.]+ s = \d+ plain TP=2 forwards", done.stdout
    ), done.stdout
    ratios = [float(r) for r in re.findall(r"in the plain forward \(([\d.]+)x\)", done.stdout)]
    assert len(ratios) == 2 and all(1.0 <= ratio < 2.0 for ratio in ratios), done.stdout


def test_training_ranks_benchmark_prints_each_ranks_memory_against_plain_fsdp2_training():
    assert "python benchmarks/training_ranks.py" in documentation()
    done = run_benchmark("training_ranks.py", "--steps", "1", "--width", "64", "--layers", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    printed = re.search(r"FSDP2 on 2 ranks, 0\.1M parameters .* bisectr train \(noise\) [\d.]+ s", done.stdout)
    assert printed, done.stdout
    ratios = re.findall(
        r"plain FSDP2 training \d+ MB \(([\d.]+)x\), and with bisectr's ranks' MALLOC_MMAP_THRESHOLD_=1048576 "
        r"\d+ MB \(([\d.]+)x\)",
        done.stdout,
    )
    assert len(ratios) == 2 and all(1.0 <= float(r) < 5.0 for pair in ratios for r in pair), done.stdout


def test_compiled_benchmark_prints_the_search_against_one_compile_and_forward():
    assert "python benchmarks/compiled.py" in documentation()
    done = run_benchmark("compiled.py", "--model", "hf_resnet", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"bisect of compiled_hf_resnet.py \(noise\): [\d.]+ s\n", done.stdout), done.stdout
    assert re.search(r"one compile \+ one forward: [\d.]+ s \(compile [\d.]+ s, forward [\d.]+ ms\)", done.stdout), (
        done.stdout
    )
    assert re.search(r"ratio: [\d.]+x one compile \+ one forward", done.stdout), done.stdout


def test_store_checksum_benchmark_prints_write_and_read_with_and_without_crc32():
    done = run_benchmark("store_checksums.py", "--tensors", "40", "--total-mb", "4", "--repeats", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"store checksums: 40 tensors, [\d.]+ MB", done.stdout), done.stdout
    for title in ("write (TensorWriter, closed)", "first read of each + max (checked)", "second read of each + max"):
        assert re.search(re.escape(title) + r"\s+[\d.]+ s\s+[\d.]+ s\s+[\d.]+x", done.stdout), done.stdout


def test_generate_cost_benchmark_prints_bisectr_against_plain_generation():
    assert "python benchmarks/generate_cost.py" in documentation()
    done = run_benchmark("generate_cost.py", "--tokens", "4", "--repeat", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"plain generation, both sides\s+[\d.]+ s", done.stdout), done.stdout
    assert re.search(r"bisectr generate \((match|noise)\s*\)\s+[\d.]+ s\s+x[\d.]+\s+target x3", done.stdout), (
        done.stdout
    )
