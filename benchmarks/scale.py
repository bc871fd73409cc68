#!/usr/bin/env python
"""bisectr at seed 000's size: the CTRL-sized pair (benchmarks/models/ctrl.py), plain against bisect.

    python benchmarks/scale.py [--layers N] [--pairs torch,paddle] [--value-budget MB] [--isolate] [--train STEPS]
                               [--json PATH] [--device cuda] [--dtype bfloat16]

For each pair (torch vs torch: `candidate`; torch vs paddle: `candidate_paddle`), two subprocesses,
one after the other on the same machine:

- **plain**: build both models and run one forward of each (no gradients), the forwards also timed alone;
- **bisect**: `bisectr.trace` into a run directory, then `Run.bisect()`, as `bisectr bisect` does
  (op values stored up to `--value-budget` MB per side, bisectr's default unless given).

Each row: the verdict and culprit (expected: `divergent` in the planted layer's MLP), peak resident
memory (the child's maximum RSS) over plain's, wall time over plain's, the run directory's size over
the bytes of both sides' weights, the search (`Run.bisect()`) in forwards of both sides, and the time of
each stage of the bisect. Targets (issue 29): peak <= 1.5x plain, time <= 5x plain, the search <= 10x
one forward of both sides. `--isolate` runs each side of the bisect in its own worker process, as
`bisectr bisect --isolate` does; its peak is then the largest process's (each worker holds one model).
`--device` and `--dtype` put the torch candidate on another device (`cuda`) and in another dtype (`bfloat16`);
the reference stays float32 on the CPU. The peak is the host's memory, not the GPU's.

`--train STEPS` measures `bisectr train` instead: **plain** builds both models and trains each STEPS
AdamW steps (both held at once, the loss the sum of the outputs); **train** is `bisectr.training.train`
over STEPS steps (two float32 and two float64 trainers, and the search at the initial weights when
step 1 differs). Each row: the verdict, first step, stage and culprit, peak memory and time over plain's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL_FILE = HERE / "models" / "ctrl.py"
PAIRS = {"torch": "candidate", "paddle": "candidate_paddle"}
TARGET_PEAK = 1.5
TARGET_TIME = 5.0
TARGET_SEARCH_FORWARDS = 10.0

PLAIN = """
import json, sys, time
start = time.perf_counter()
from bisectr.capture.modelfile import build_side, load_module
from bisectr.adapters import adapter_for
module = load_module(sys.argv[1])
weights, forwards = 0, 0.0
for role, function in (("reference", "reference"), ("candidate", sys.argv[2])):
    side = build_side(module, sys.argv[1], role, function)
    adapter = side.adapter
    weights += sum(
        adapter.to_numpy(t).nbytes for name, t in adapter.named_leaves(side.model) if name.startswith("param:")
    )
    started = time.perf_counter()
    with adapter.no_grad():
        side.forward()
    forwards += time.perf_counter() - started
print(json.dumps({"seconds": time.perf_counter() - start, "weights": weights, "forwards": forwards}))
"""

BISECT = """
import json, os, sys, time
start = time.perf_counter()
import bisectr
stages, last = {}, [time.perf_counter(), "trace"]
def progress(message):
    now = time.perf_counter()
    stages[last[1]] = stages.get(last[1], 0.0) + now - last[0]
    last[:] = [now, message]
budget = {} if sys.argv[4] == "default" else {"value_budget": round(float(sys.argv[4]) * 2**20)}
run = bisectr.trace(sys.argv[1], "reference", sys.argv[2], out=sys.argv[3], commit=False,
                    isolate=sys.argv[5] == "isolate", **budget)
progress("bisect: start")
searching = time.perf_counter()
result = run.bisect(progress=lambda m: progress("bisect: " + m))
search = time.perf_counter() - searching
run.save()  # with the values the search fetched, as `bisectr trace` saves a run
progress("end")
size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(sys.argv[3]) for f in fs)
culprit = result.culprit
print(json.dumps({"seconds": time.perf_counter() - start, "search": search, "verdict": result.verdict, "run_dir": size,
                  "culprit": None if culprit is None else f"{culprit.candidate.module} {culprit.op}",
                  "confirmed": bool(result.confirmation and result.confirmation.confirmed), "reruns": result.reruns,
                  "ops": len(run.candidate.ops), "stages": stages}))
"""

PLAIN_TRAIN = """
import json, sys, time
start = time.perf_counter()
from bisectr.adapters import Training, facet
from bisectr.capture.modelfile import build_side, load_module
from bisectr.capture.recording import output_pairs
module = load_module(sys.argv[1])
sides = [build_side(module, sys.argv[1], role, function)
         for role, function in (("reference", "reference"), ("candidate", sys.argv[2]))]
optimizers = [getattr(module, function + "_optimizer")(side.model)
              for side, function in zip(sides, ("reference", sys.argv[2]))]
for step in range(int(sys.argv[3])):
    for side, optimizer in zip(sides, optimizers):
        training = facet(side.adapter, Training)
        training.clear_gradients(optimizer)
        with side.adapter.enable_grad():
            loss = sum(tensor.sum() for _, tensor in output_pairs(side.adapter, side.forward()))
        training.backward(loss)
        training.optimizer_step(optimizer, None)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""

TRAIN = """
import json, sys, time
start = time.perf_counter()
from bisectr.training import train
result = train(sys.argv[1], "reference", sys.argv[2], steps=int(sys.argv[3]))
culprit = result.culprit
print(json.dumps({"seconds": time.perf_counter() - start, "verdict": result.verdict, "first_step": result.first_step,
                  "stage": result.stage, "culprit": None if culprit is None else
                  getattr(culprit, "parameter", None) or f"{culprit.candidate.module} {culprit.op}"}))
"""


def measured(script: str, *args: str) -> tuple[dict, float]:
    """Run `script` in a child interpreter: its JSON answer and its peak resident memory (bytes)."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")},
    )
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"{script.split(chr(10))[5]!r}... exited with {status}")
    return json.loads(output.strip().splitlines()[-1]), usage.ru_maxrss * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--pairs", default="torch,paddle")
    parser.add_argument("--value-budget", default="default", metavar="MB")
    parser.add_argument("--isolate", action="store_true", help="each side of the bisect in its own process")
    parser.add_argument("--train", type=int, metavar="STEPS", help="measure bisectr train over STEPS steps")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--device", default="cpu", help="where the torch candidate runs")
    parser.add_argument("--dtype", default="float32", help="the torch candidate's dtype")
    args = parser.parse_args()
    os.environ.update(
        BISECTR_CTRL_LAYERS=str(args.layers), BISECTR_CTRL_DEVICE=args.device, BISECTR_CTRL_DTYPE=args.dtype
    )
    rows = train_rows(args) if args.train else bisect_rows(args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def bisect_rows(args: argparse.Namespace) -> list[dict]:
    rows = []
    for pair in args.pairs.split(","):
        function = PAIRS[pair]
        plain, plain_peak = measured(PLAIN, str(MODEL_FILE), function)
        with tempfile.TemporaryDirectory() as scratch:
            bisect, bisect_peak = measured(
                BISECT,
                str(MODEL_FILE),
                function,
                str(Path(scratch) / "run"),
                args.value_budget,
                "isolate" if args.isolate else "in-process",
            )
        moved = pair == "torch" and (args.device, args.dtype) != ("cpu", "float32")
        label = f"torch vs {pair}" + (f" ({args.device}, {args.dtype})" if moved else "")
        rows.append(
            {
                "pair": label,
                "layers": args.layers,
                "isolate": args.isolate,
                "plain_seconds": plain["seconds"],
                "plain_peak": plain_peak,
                "weights": plain["weights"],
                **{f"bisect_{k}": v for k, v in bisect.items()},
                "bisect_peak": bisect_peak,
                "peak_ratio": bisect_peak / plain_peak,
                "time_ratio": bisect["seconds"] / plain["seconds"],
                "run_dir_ratio": bisect["run_dir"] / plain["weights"],
                "plain_forwards": plain["forwards"],
                "search_forwards": bisect["search"] / plain["forwards"],
            }
        )
        row = rows[-1]
        print(
            f"{row['pair']}, {args.layers} layers{', isolated' if args.isolate else ''}: "
            f"{bisect['verdict']} at {bisect['culprit']}"
            f"{'' if bisect['confirmed'] else ' (unconfirmed)'} "
            f"({bisect['reruns']} candidate re-runs, {bisect['ops']} ops); "
            f"{'largest process' if args.isolate else 'peak'} {bisect_peak / 1e9:.1f} GB / plain "
            f"{plain_peak / 1e9:.1f} GB = {row['peak_ratio']:.2f}x (target {TARGET_PEAK}x); "
            f"time {bisect['seconds']:.0f} s "
            f"/ plain {plain['seconds']:.0f} s = {row['time_ratio']:.1f}x (target {TARGET_TIME}x); run dir "
            f"{bisect['run_dir'] / 1e6:.0f} MB / weights {plain['weights'] / 1e9:.1f} GB = {row['run_dir_ratio']:.3f}; "
            f"search {bisect['search']:.0f} s / one forward of both sides {plain['forwards']:.1f} s = "
            f"{row['search_forwards']:.1f}x (target {TARGET_SEARCH_FORWARDS:.0f}x)",
            flush=True,
        )
        print("  stages: " + ", ".join(f"{k} {v:.0f} s" for k, v in bisect["stages"].items()), flush=True)
    return rows


def train_rows(args: argparse.Namespace) -> list[dict]:
    rows = []
    for pair in args.pairs.split(","):
        function, steps = PAIRS[pair], str(args.train)
        plain, plain_peak = measured(PLAIN_TRAIN, str(MODEL_FILE), function, steps)
        trained, train_peak = measured(TRAIN, str(MODEL_FILE), function, steps)
        rows.append(
            {
                "pair": f"torch vs {pair}",
                "layers": args.layers,
                "steps": args.train,
                "plain_seconds": plain["seconds"],
                "plain_peak": plain_peak,
                **{f"train_{k}": v for k, v in trained.items()},
                "train_peak": train_peak,
                "peak_ratio": train_peak / plain_peak,
                "time_ratio": trained["seconds"] / plain["seconds"],
            }
        )
        row = rows[-1]
        print(
            f"{row['pair']}, {args.layers} layers, {args.train} steps: {trained['verdict']}, first step "
            f"{trained['first_step']} ({trained['stage']}) at {trained['culprit']}; "
            f"peak {train_peak / 1e9:.1f} GB / plain "
            f"{plain_peak / 1e9:.1f} GB = {row['peak_ratio']:.2f}x; time {trained['seconds']:.0f} s / plain "
            f"{plain['seconds']:.0f} s = {row['time_ratio']:.1f}x",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
