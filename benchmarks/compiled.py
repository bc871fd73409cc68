#!/usr/bin/env python
"""The whole search of a compiled model against one compile plus one forward of it, side by side.

    python benchmarks/compiled.py [--model hf_llama|hf_resnet] [--bug]

On `tests/models/compiled_hf_<model>.py` (a tiny Hugging Face model against itself `torch.compile`d by
inductor on this CPU; `--bug`: the planted wrong decomposition, Llama only): first, in a fresh process,
`torch.compile(model)` and its first forward (the compile) and the median of 20 forwards after it;
then, in another fresh process, the whole `bisectr bisect` (build, trace both sides, search, and for
a divergent one the search inside the compiled code), from start to result. Prints both, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_ONE_COMPILE = """\
import importlib.util, json, statistics, sys, time
import torch
spec = importlib.util.spec_from_file_location("model", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
model, inputs = module.candidate()
with torch.no_grad():
    start = time.perf_counter()
    model(**inputs)
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(20):
        start = time.perf_counter()
        model(**inputs)
        times.append(time.perf_counter() - start)
print(json.dumps({"compile_s": compile_s, "forward_s": statistics.median(times)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["hf_llama", "hf_resnet"], default="hf_llama")
    parser.add_argument("--bug", action="store_true", help="plant the wrong decomposition (hf_llama)")
    args = parser.parse_args()
    model = ROOT / "tests" / "models" / f"compiled_{args.model}.py"
    env = {**os.environ, **({"COMPILE_BUG": "mean_decomposition"} if args.bug else {})}
    done = subprocess.run(
        [sys.executable, "-c", _ONE_COMPILE, str(model)], capture_output=True, text=True, env=env, timeout=600
    )
    if done.returncode != 0:
        raise SystemExit(f"the plain compile failed:\n{done.stderr[-3000:]}")
    plain = json.loads(done.stdout.splitlines()[-1])
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(model), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"bisectr bisect failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout)
    one = plain["compile_s"] + plain["forward_s"]
    compiled = (result.get("culprit") or {}).get("compiled")
    inside = (
        f", of which the search inside the compiled code {compiled['seconds']:.0f} s ({compiled['compiles']} compiles)"
        if compiled
        else ""
    )
    print(f"bisect of compiled_{args.model}.py ({result['verdict']}): {seconds:.1f} s{inside}")
    print(
        f"one compile + one forward: {one:.1f} s (compile {plain['compile_s']:.1f} s, "
        f"forward {plain['forward_s'] * 1e3:.2f} ms)"
    )
    print(f"ratio: {seconds / one:.1f}x one compile + one forward")


if __name__ == "__main__":
    main()
