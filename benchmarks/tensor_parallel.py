#!/usr/bin/env python
"""A TP=2 bisect against the plain TP=2 forward: time and peak memory per rank, side by side.

    python benchmarks/tensor_parallel.py [--forwards N]

Both on `examples/tensor_parallel.py` (4 MLP blocks sharded with `parallelize_module`, the planted
partial sum): the plain forward of `candidate()` on 2 ranks under torchrun (median of N forwards after
one warm-up, each rank's peak resident memory), then `bisectr.bisect(..., candidate_nproc=2)` in this
process (wall time from start to result, the peak resident memory of each of its ranks read from
/proc before they exit). Prints both, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "examples" / "tensor_parallel.py"

# Run on each rank by torchrun: build the candidate, time N forwards, write DIR/rank<R>.json.
_PLAIN_FORWARD = """\
import importlib.util, json, os, statistics, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
spec = importlib.util.spec_from_file_location("model", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
model, inputs = module.candidate()
times = []
with torch.no_grad():
    model(*inputs)
    for _ in range(int(sys.argv[2])):
        start = time.perf_counter()
        model(*inputs)
        times.append(time.perf_counter() - start)
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
with open(os.path.join(sys.argv[3], f"rank{dist.get_rank()}.json"), "w") as out:
    json.dump({"forward_s": statistics.median(times), "peak_kb": peak}, out)
"""


def plain_forward(forwards: int) -> list[dict]:
    """Each rank's median forward time and peak memory, by rank."""
    with tempfile.TemporaryDirectory(prefix="bisectr-tp-bench-") as rows:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node=2",
                "--no-python",
                sys.executable,
                "-c",
                _PLAIN_FORWARD,
                str(MODEL),
                str(forwards),
                rows,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        written = sorted(Path(rows).glob("rank*.json"))
        if done.returncode != 0 or len(written) != 2:
            raise SystemExit(f"the plain TP=2 forward failed:\n{done.stderr[-3000:]}")
        return [json.loads(path.read_text()) for path in written]


def rank_peaks_kb(torchrun_pid: int) -> list[int]:
    """VmHWM of torchrun's children (the ranks), in pid order."""
    children = Path(f"/proc/{torchrun_pid}/task/{torchrun_pid}/children").read_text().split()
    peaks = []
    for pid in sorted(map(int, children)):
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        peaks.append(next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")))
    return peaks


def bisect_on_two_ranks() -> tuple[float, list[int], str]:
    from bisectr.run import trace

    start = time.perf_counter()
    run = trace(MODEL, candidate_nproc=2)
    result = run.bisect()
    seconds = time.perf_counter() - start
    peaks = rank_peaks_kb(run.live.runners["candidate"].process.pid)
    run.live.runners["candidate"].close()
    return seconds, peaks, result.verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forwards", type=int, default=20, help="plain forwards timed per rank (default 20)")
    args = parser.parse_args()
    plain = plain_forward(args.forwards)
    seconds, peaks, verdict = bisect_on_two_ranks()
    forward = max(row["forward_s"] for row in plain)
    print(
        f"TP=2 bisect of {MODEL.name} ({verdict}): {seconds:.2f} s = {seconds / forward:.0f} plain TP=2 forwards "
        f"({forward * 1e3:.2f} ms each, the slower rank's median of {args.forwards})"
    )
    for rank, (row, peak) in enumerate(zip(plain, peaks)):
        print(
            f"rank {rank}: peak memory {peak / 1024:.0f} MB in the bisect, {row['peak_kb'] / 1024:.0f} MB in the plain "
            f"forward ({peak / row['peak_kb']:.2f}x)"
        )


if __name__ == "__main__":
    main()
