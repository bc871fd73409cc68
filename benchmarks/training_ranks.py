#!/usr/bin/env python
"""`bisectr train` with an FSDP2 side on 2 ranks against plain FSDP2 training: each rank's peak memory and
the time, side by side.

    python benchmarks/training_ranks.py [--steps N] [--width W] [--layers L]

Both on `benchmarks/models/fsdp_stack.py` (L blocks of width W, AdamW): first its candidate trained N steps
under torchrun as a training script would (each rank's peak resident memory, VmHWM), then
`bisectr.training.train(..., steps=N)` in this process, whose ranks' VmHWM is read from /proc while they run.
Plain training runs twice: as is, and with the allocator setting bisectr gives its ranks (`RANK_ALLOCATOR`: a
fixed mmap threshold, which lowers plain training's peak too). Prints all three, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tensor_parallel import rank_peaks_kb

from bisectr.sides.ranks import RANK_ALLOCATOR

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "benchmarks" / "models" / "fsdp_stack.py"

# Run on each rank by torchrun: the candidate trained N steps; DIR/rank<R>.json gets its time and peak.
_PLAIN_TRAINING = """\
import importlib.util, json, os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
spec = importlib.util.spec_from_file_location("model", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
model, _ = module.candidate()
optimizer = module.candidate_optimizer(model)
start = time.perf_counter()
for step in range(1, int(sys.argv[2]) + 1):
    optimizer.zero_grad()
    module.candidate_loss(model(*module.candidate_batch(step))).backward()
    optimizer.step()
seconds = time.perf_counter() - start
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
with open(os.path.join(sys.argv[3], f"rank{dist.get_rank()}.json"), "w") as out:
    json.dump({"seconds": seconds, "peak_kb": peak}, out)
"""


def plain_training(steps: int, allocator: dict[str, str]) -> list[dict]:
    """Each rank's training time and peak memory, by rank, with `allocator`'s settings in its environment."""
    with tempfile.TemporaryDirectory(prefix="bisectr-train-bench-") as rows:
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--no-python"]
            + [sys.executable, "-c", _PLAIN_TRAINING, str(MODEL), str(steps), rows],
            capture_output=True,
            text=True,
            timeout=1800,
            env={**os.environ, **allocator},
        )
        written = sorted(Path(rows).glob("rank*.json"))
        if done.returncode != 0 or len(written) != 2:
            raise SystemExit(f"plain FSDP2 training failed:\n{done.stderr[-3000:]}")
        return [json.loads(path.read_text()) for path in written]


def _torchruns(parent: int) -> list[int]:
    """The torchrun processes `parent` started (each the parent of a side's ranks)."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(pid) for pid in children if b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def bisectr_training(steps: int) -> tuple[float, list[int], str]:
    """`bisectr train`'s time, its ranks' peak memory (by pid order) and verdict."""
    from bisectr.training import train

    peaks: dict[int, int] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.2):
            for torchrun in _torchruns(os.getpid()):
                try:
                    peaks.update(enumerate(rank_peaks_kb(torchrun)))  # VmHWM only grows: the last read is the peak
                except (OSError, StopIteration):  # the ranks are exiting
                    pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.perf_counter()
    result = train(str(MODEL), steps=steps)
    seconds = time.perf_counter() - start
    stop.set()
    watcher.join()
    return seconds, [peaks[rank] for rank in sorted(peaks)], result.verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    parser.add_argument("--width", type=int, default=512, help="the blocks' width (default 512)")
    parser.add_argument("--layers", type=int, default=8, help="blocks (default 8)")
    args = parser.parse_args()
    os.environ["BENCH_WIDTH"], os.environ["BENCH_LAYERS"] = str(args.width), str(args.layers)
    parameters = args.layers * 8 * args.width * args.width
    plain = plain_training(args.steps, {})
    like_bisectr = plain_training(args.steps, RANK_ALLOCATOR)
    seconds, peaks, verdict = bisectr_training(args.steps)
    print(
        f"FSDP2 on 2 ranks, {parameters / 1e6:.1f}M parameters ({parameters * 4 / 2**20:.0f} MB in float32), "
        f"{args.steps} steps: bisectr train ({verdict}) {seconds:.1f} s, plain training "
        f"{max(row['seconds'] for row in plain):.2f} s"
    )
    settings = " ".join(f"{name}={value}" for name, value in RANK_ALLOCATOR.items())
    for rank, (row, alike, peak) in enumerate(zip(plain, like_bisectr, peaks)):
        print(
            f"rank {rank}: peak memory {peak / 1024:.0f} MB in bisectr train; plain FSDP2 training "
            f"{row['peak_kb'] / 1024:.0f} MB ({peak / row['peak_kb']:.2f}x), and with bisectr's ranks' {settings} "
            f"{alike['peak_kb'] / 1024:.0f} MB ({peak / alike['peak_kb']:.2f}x)"
        )


if __name__ == "__main__":
    main()
