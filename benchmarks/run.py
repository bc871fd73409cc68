#!/usr/bin/env python
"""bisectr benchmarks: recording overhead, store size and memory, search cost, aligner scaling, PaDiff.

    python benchmarks/run.py [--quick] [--threads N] [--json PATH]
    python benchmarks/run.py --profile torch|paddle small|base|deep stats|stored   (needs pyinstrument)

Prints one table, every figure measured in this run, torch and paddle side by side:

- **Recording overhead.** One side of a model (`bisectr.sides.runner.record_side`, the exact per-op work of
  `bisectr.trace`: interception, module paths, source lines, statistics, fingerprints and, when
  storing, every tensor appended to `tensors.bin`) against the plain forward of the same model under
  the framework's no-grad. Model building and the final `trace.json` write are not in either figure.
  Medians over several runs, the three variants interleaved (rotated order) in the same process.
- **Store and memory.** `tensors.bin` size against the bytes of the tensors it holds (activations =
  op outputs, plus the parameters/inputs read); peak resident memory (VmHWM, reset through
  `/proc/self/clear_refs` after identical warm-ups) of one plain forward and one traced forward
  with storage, each in its own subprocess, at the model's batch and at 4x that batch (same op graph,
  4x the bytes stored). Target: what recording adds to peak memory (traced minus plain) grows by at
  most one layer's activations from one batch to the other, i.e. it does not follow the bytes that go
  to disk. (It does not vanish: the trace itself, ~1.9 KB per tensor, and 1.25 MB of buffers stay.)
- **Search.** `bisectr.bisect()` (= `bisectr.trace()` + `Run.bisect()`) on the 48-layer stack against
  the same stack with the tanh GELU in one block (torch vs torch, paddle vs paddle): candidate
  re-runs against ceil(log2 ops) and wall time in plain forwards of that stack (the median of three
  searches of one recorded run; every search is timed beside plain forwards of its model); the exhaustive mode
  on a shallow stack, and a full bisect of the base encoder (torch), for contrast.
- **Aligner.** `align_traces` on synthetic traces of 1k/10k/100k ops built by repeating a recorded
  one-block model (module paths and parameter names renumbered `layers.{i}.`, block i reading block
  i-1's output): torch vs torch and torch vs paddle.
- **PaDiff** (`pip install padiff`) on the cross-framework pair (torch stack vs paddle port with the
  tanh GELU), next to bisectr on the same pair.

`--quick` shrinks every model and size (smoke test; the figures then mean little).
Torch is pinned to `--threads` (default 1) math threads, and so are numpy's BLAS/OpenMP pools unless
OPENBLAS_NUM_THREADS etc. are set; paddle's CPU build runs one by default. (On this shared 2-core
machine a 2-thread torch forward of the base encoder measured 2.2-2.8 s against 0.5 s single-threaded.)
PaDiff needs `pip install padiff pyyaml` (it imports yaml without declaring it).
Exit status: 0 unless a torch (core) measurement failed; paddle failures are reported as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import io
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable


def _pin_math_threads() -> None:
    """Before numpy/torch load: BLAS/OpenMP pools get --threads (default 1) unless the environment says
    otherwise. On a shared 2-core machine, multi-threaded OpenBLAS calls on small vectors (numpy's
    dot/norm in bisectr's error metrics) otherwise spin against other processes and swamp the figures."""
    threads = "1"
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            threads = sys.argv[i + 1]
        elif arg.startswith("--threads="):
            threads = arg.split("=", 1)[1]
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, threads)


if __name__ == "__main__":
    _pin_math_threads()

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
MODEL_FILE = HERE / "models" / "bench_models.py"
FRAMEWORKS = ("torch", "paddle")
MODEL_TITLES = {"small": "small encoder", "base": "base encoder", "deep": "narrow pre-LN stack"}

TARGET_STATS = 1.3
TARGET_STORED = 2.5
TARGET_RERUN_SLACK = 3
TARGET_SEARCH_FORWARDS = 20.0
TARGET_ALIGN_SECONDS = 10.0
# Memory is bounded when what recording adds to peak memory does not follow the bytes stored: the same
# op graph with this many times bigger tensors may add at most one (bigger) layer's activations.
MEMORY_BATCH_SCALE = 4
FLAT_PROFILE_LINES = 25
LINEAR_EXPONENT = 1.2  # time ~ ops^k with k <= this counts as "about linear"


@dataclasses.dataclass
class Plan:
    quick: bool
    repeats: dict[str, int]
    memory_models: tuple[str, ...]
    align_sizes: tuple[int, ...]
    align_repeats: int
    base_search: tuple[str, ...]  # frameworks whose base encoder gets a full bisect (contrast row)
    training_steps: int  # of `bisectr train`


FULL = Plan(
    False, {"small": 7, "base": 3, "deep": 5}, ("small", "base", "deep"), (1_000, 10_000, 100_000), 3, ("torch",), 20
)
QUICK = Plan(True, {"small": 1, "base": 1, "deep": 1}, ("small",), (300, 1_000, 3_000), 1, ("torch",), 2)


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# -- framework helpers ---------------------------------------------------------------------------
def set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def grad_off(framework: str):
    if framework == "torch":
        import torch

        return torch.no_grad()
    import paddle

    return paddle.no_grad()


def build(function: str, role: str = "candidate"):
    from bisectr.capture.modelfile import build_side, load_module

    return build_side(load_module(MODEL_FILE), MODEL_FILE, role, function)


def models_module():
    from bisectr.capture.modelfile import load_module

    return load_module(MODEL_FILE)


def dtype_bytes(name: str) -> int:
    if name == "bfloat16":
        return 2
    try:
        return np.dtype(name).itemsize
    except TypeError:
        return 4


def tensor_bytes(info) -> int:
    return info.size * dtype_bytes(info.dtype)


def layer_activation_bytes(trace, layer: str = "layers.0") -> int:
    """Bytes of the outputs of every op under module `layer` (one layer's activations)."""
    total = 0
    for op in trace.ops:
        if op.module == layer or op.module.startswith(layer + "."):
            total += sum(tensor_bytes(trace.tensors[t]) for t in op.outputs)
    return total


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Skipped(Exception):
    """A measurement that could not be made; the message goes into the table."""


def paddle_problem() -> str | None:
    """None if the paddle adapter records a small model, else why not."""
    try:
        import paddle  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"paddlepaddle not importable ({type(exc).__name__})"
    try:
        from bisectr.capture.recording import RecordOptions
        from bisectr.sides.runner import record_side

        trace, _ = record_side(build("paddle_small"), None, RecordOptions(store_values=False))
        if not trace.ops:
            return "paddle adapter unavailable (recorded no ops)"
        if not any(op.module.startswith("layers.") for op in trace.ops):
            return "paddle adapter unavailable (no module paths recorded)"
    except Exception as exc:  # noqa: BLE001
        return f"paddle adapter unavailable ({type(exc).__name__}: {str(exc).splitlines()[0][:90] if str(exc) else ''})"
    return None


# -- 1. recording overhead, store size ----------------------------------------------------------
class PassThrough:
    """An op listener that records nothing: what intercepting the framework alone costs,
    the floor under any recording."""

    def enter_module(self, path: str) -> None:
        pass

    def exit_module(self) -> None:
        pass

    def call(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        return fn(*args, **kwargs)


@dataclasses.dataclass
class Overhead:
    plain: float
    intercept: float
    stats: float
    stored: float
    ops: int
    tensors: int
    store_bytes: int
    activation_bytes: int
    leaf_bytes: int
    json_bytes: int
    layer_bytes: int

    @property
    def intercept_ratio(self) -> float:
        return self.intercept / self.plain

    @property
    def stats_ratio(self) -> float:
        return self.stats / self.plain

    @property
    def stored_ratio(self) -> float:
        return self.stored / self.plain


def record_once(side, store_dir: Path | None) -> tuple[Any, int]:
    """One recording of `side` as `bisectr.trace` makes it: statistics only, or every tensor stored
    under `store_dir`. Returns the trace and the bytes of `tensors.bin` (0 when nothing is stored)."""
    from bisectr.capture.recording import RecordOptions
    from bisectr.sides.runner import record_side
    from bisectr.capture.store import TensorWriter

    if store_dir is None:
        return record_side(side, None, RecordOptions(store_values=False))[0], 0
    writer = TensorWriter(store_dir)
    try:
        trace = record_side(side, writer, RecordOptions(store_values=True))[0]
    finally:
        writer.close()
    return trace, writer.path.stat().st_size


def measure_overhead(framework: str, model: str, repeats: int, scratch: Path) -> Overhead:
    side = build(f"{framework}_{model}")
    store_dir = scratch / f"store-{framework}-{model}"

    def plain():
        with grad_off(framework):
            return side.forward()

    def intercept():
        with side.adapter.intercept(side.model, PassThrough()):
            return side.forward()

    def stats():
        return record_once(side, None)

    def stored():
        return record_once(side, store_dir)

    variants = {"plain": plain, "intercept": intercept, "stats": stats, "stored": stored}
    first = {name: fn() for name, fn in variants.items()}  # warm-up; keeps one trace of each kind
    shutil.rmtree(store_dir, ignore_errors=True)
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            gc.collect()
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
            shutil.rmtree(store_dir, ignore_errors=True)
    stored_trace, store_bytes = first["stored"]
    infos = stored_trace.tensors.values()
    return Overhead(
        plain=statistics.median(times["plain"]),
        intercept=statistics.median(times["intercept"]),
        stats=statistics.median(times["stats"]),
        stored=statistics.median(times["stored"]),
        ops=len(stored_trace.ops),
        tensors=len(stored_trace.tensors),
        store_bytes=store_bytes,
        activation_bytes=sum(tensor_bytes(t) for t in infos if t.producer is not None),
        leaf_bytes=sum(tensor_bytes(t) for t in infos if t.producer is None and t.stored),
        json_bytes=len(json.dumps(stored_trace.to_json())),
        layer_bytes=layer_activation_bytes(first["stats"][0]),
    )


def profile_recording(framework: str, model: str, mode: str, repeats: int = 5) -> str:
    """pyinstrument's profile of `repeats` recordings of one side (`mode`: `stats` or `stored`), after one
    warm-up: the call tree, then the functions with the most time of their own."""
    from pyinstrument import Profiler

    side = build(f"{framework}_{model}")
    scratch = Path(tempfile.mkdtemp(prefix="bisectr-bench-profile-"))
    store_dir = scratch / "store" if mode == "stored" else None
    try:
        record_once(side, store_dir)
        profiler = Profiler(interval=0.0005)
        profiler.start()
        for _ in range(repeats):
            record_once(side, store_dir)
            shutil.rmtree(scratch / "store", ignore_errors=True)
        profiler.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tree = profiler.output_text(time="percent_of_total")
    flat = profiler.output_text(time="percent_of_total", flat=True).strip().splitlines()
    return f"{tree}\nFunctions by own time, the top {FLAT_PROFILE_LINES}:\n" + "\n".join(flat[:FLAT_PROFILE_LINES])


# -- 2. peak memory, one subprocess per configuration --------------------------------------------
def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def probe_memory(framework: str, model: str, mode: str) -> dict:
    """Runs in its own process: build, one plain warm-up forward and one recording of a one-block model
    (identical in both modes), reset the peak, then one plain forward or one recording with storage,
    keeping what `bisectr.trace` keeps (the trace and the replay calls)."""
    from bisectr.capture.recording import RecordOptions
    from bisectr.sides.runner import record_side
    from bisectr.capture.store import TensorWriter

    side = build(f"{framework}_{model}")
    scratch = Path(tempfile.mkdtemp(prefix="bisectr-bench-mem-"))
    try:
        with grad_off(framework):
            side.forward()
        # one-time costs of the recorder (lazy imports, caches) paid on a one-block model, in both modes
        warm = TensorWriter(scratch / "warm-up")
        try:
            record_side(build("torch_block" if framework == "torch" else "paddle_block_ported"), warm, RecordOptions())
        finally:
            warm.close()
        gc.collect()
        reset = _reset_peak()
        before = _status_kb("VmRSS")
        if mode == "plain":
            with grad_off(framework):
                kept = side.forward()
        else:
            writer = TensorWriter(scratch / "store")
            try:
                kept = (*record_side(side, writer, RecordOptions(store_values=True)), writer.index)
            finally:
                writer.close()
        peak = _status_kb("VmHWM") if reset else _maxrss()
        result = {"before": before, "peak": peak, "reset": reset}
        if mode != "plain":
            result["layer_bytes"] = layer_activation_bytes(kept[0])
            result["metadata_bytes"] = deep_size(kept)  # trace, replay calls, the writer's index
            result["store_bytes"] = writer.path.stat().st_size
        del kept
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def deep_size(root: Any) -> int:
    """Bytes of the Python objects reachable from `root` through containers and instance attributes
    (functions, classes, modules and framework objects are shared, not counted)."""
    seen: set[int] = set()
    total = 0
    stack = [root]
    scalars = (str, bytes, int, float, bool, type(None))
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, scalars):
            total += sys.getsizeof(obj)
        elif isinstance(obj, dict):
            total += sys.getsizeof(obj)
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            total += sys.getsizeof(obj)
            stack.extend(obj)
        elif isinstance(obj, np.ndarray):
            total += obj.nbytes if obj.base is None else sys.getsizeof(obj)
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            total += sys.getsizeof(obj)
            stack.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
    return total


def _maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_probe(args: list[str], threads: int, timeout: float = 600, env: dict[str, str] | None = None) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), *args, "--threads", str(threads)]
    # A fixed glibc mmap threshold returns freed tensors to the OS, so RSS follows live memory
    # (otherwise a warm-up's freed blocks are reused and every forward shows ~0 growth).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072", **(env or {})}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise Skipped(f"probe failed (exit {done.returncode}): {tail[:120]}")
    return json.loads(lines[-1])


# -- 3. the search -------------------------------------------------------------------------------
@contextlib.contextmanager
def phase_timer():
    """Times the phases of `bisectr.trace` and `Run.bisect` by wrapping (in this process only, restored
    on exit) the functions they call: `align_traces` where `bisectr.run` binds it (the alignment is
    made as the run is traced), `pair_leaves` (the leaves' pairing and comparison, also made as it is
    traced), the search's leaf phase, `Analysis.compute`, `rerun` where `bisectr.sides.runner` binds it."""
    import bisectr.measure.analysis as analysis
    import bisectr.search.forward as forward
    import bisectr.run as run_module
    import bisectr.sides.runner as sides_module

    spent = {
        "align": 0.0,
        "analysis": 0.0,
        "reruns": 0.0,
        "float64": 0.0,
        "reproduce": 0.0,
        "leaves": 0.0,
        "leaf_search": 0.0,
    }
    patches: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[phase] += time.perf_counter() - start

        patches.append((owner, name, original))
        setattr(owner, name, timed)

    wrap(run_module, "align_traces", "align")
    wrap(run_module, "pair_leaves", "leaves")
    wrap(forward, "_differing_leaves", "leaf_search")
    wrap(analysis.Analysis, "compute", "analysis")
    wrap(forward, "float64_check", "float64")
    wrap(forward, "check_reproducible", "reproduce")
    wrap(sides_module, "rerun", "reruns")
    try:
        yield spent
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)


def measure_search(reference: str, candidate: str, scratch: Path, exhaustive: bool = False, repeats: int = 1) -> dict:
    """Trace the pair once, then `Run.bisect()` on it `repeats` times, each beside plain forwards
    of the same candidate model: the median search, its phases, and the median forward."""
    import bisectr

    out = scratch / f"search-{reference}-{candidate}-{int(exhaustive)}"
    with phase_timer() as traced:  # the alignment is made as the run is traced
        start = time.perf_counter()
        run = bisectr.trace(MODEL_FILE, reference, candidate, out=out)
        trace_time = time.perf_counter() - start
    side = run.live.runners["candidate"].side

    def forward():
        with grad_off(candidate.split("_")[0]):
            side.forward()

    searches, forwards = [], []
    for _ in range(repeats):
        forwards.append(median_time(forward, 5))
        with phase_timer() as spent:
            started = time.perf_counter()
            result = run.bisect(exhaustive=exhaustive)
            searches.append((time.perf_counter() - started, dict(spent), result))
    shutil.rmtree(out, ignore_errors=True)
    bisect_time, spent, result = sorted(searches, key=lambda entry: entry[0])[len(searches) // 2]
    culprit = result.culprit
    cand = culprit.candidate if culprit else None
    return {
        "total": trace_time + bisect_time,
        "trace": trace_time,
        "bisect": bisect_time,
        "forward": statistics.median(forwards),
        "align": traced["align"],
        "analysis": spent["analysis"],
        "rerun_time": spent["reruns"],
        "float64": spent["float64"],
        "reproduce": spent["reproduce"],
        "leaves": traced["leaves"] + spent["leaf_search"],
        "reruns": result.reruns,
        "reference_reruns": result.reference_reruns,
        "ops": result.ops.candidate,
        "verdict": result.verdict,
        "culprit_op": culprit and culprit.op,
        "culprit_module": cand and cand.module,
        "culprit_index": cand and cand.index,
        "culprit_source": cand and cand.source,
    }


def measure_backward(reference: str, candidate: str, scratch: Path, repeats: int = 3) -> dict:
    """Trace the pair once, then search its backward pass (`BackwardRules`, what `--backward` adds)
    `repeats` times, each beside plain forward+backward passes of the candidate from the same seeds."""
    import bisectr
    from bisectr.search.backward import BackwardRules, output_seeds
    from bisectr.search.core import decide
    from bisectr.capture.recording import output_pairs

    out = scratch / f"backward-{reference}-{candidate}"
    run = bisectr.trace(MODEL_FILE, reference, candidate, out=out)
    side = run.live.runners["candidate"].side
    adapter = side.adapter
    seeds = output_seeds(run)["candidate"]
    parameters = [
        t for name, t in adapter.named_leaves(side.model) if name.startswith("param:") and adapter.requires_grad(t)
    ]

    def forward_backward():
        with adapter.enable_grad():
            outputs = dict(output_pairs(adapter, side.forward()))
        upstream = [
            adapter.from_numpy(np.asarray(values), adapter.dtype_name(outputs[key]), adapter.device_name(outputs[key]))
            for key, values in seeds.items()
        ]
        adapter.gradients([outputs[key] for key in seeds], upstream, parameters)

    passes, searches = [], []
    for _ in range(repeats):
        passes.append(median_time(forward_backward, 5))
        started = time.perf_counter()
        result = decide(BackwardRules(run.live))
        searches.append((time.perf_counter() - started, result))
    shutil.rmtree(out, ignore_errors=True)
    seconds, result = sorted(searches, key=lambda entry: entry[0])[len(searches) // 2]
    culprit = result.culprit
    return {
        "seconds": seconds,
        "pass": statistics.median(passes),
        "reruns": result.reruns,
        "ops": result.ops.candidate,
        "verdict": result.verdict,
        "culprit_op": culprit and culprit.op,
        "culprit_module": culprit and culprit.candidate.module,
    }


TRAINING_MODEL = HERE.parent / "tests" / "models" / "training_ports.py"


def measure_training(candidate: str, steps: int) -> dict:
    """`bisectr train` on the training ports (four trainers in lockstep: both sides as run and in
    float64, the comparison, a forward trace first) against plain training steps of the candidate
    (its optimizer on a copy of its model), timed side by side."""
    from bisectr.capture.modelfile import build_side, load_module
    from bisectr.engines.training import Trainer
    from bisectr.training import train

    module = load_module(TRAINING_MODEL)
    side = build_side(module, TRAINING_MODEL, "candidate", candidate)
    plain = Trainer(side, module, {key: np.ones(shape) for key, shape in _output_shapes(side).items()}, float64=False)
    counter = iter(range(1, 10**9))
    step_time = median_time(lambda: plain.step(next(counter)), 9)
    started = time.perf_counter()
    result = train(str(TRAINING_MODEL), "reference", candidate, steps)
    return {
        "seconds": time.perf_counter() - started,
        "steps": steps,
        "plain_step": step_time,
        "verdict": result.verdict,
    }


def _output_shapes(side) -> dict:
    from bisectr.capture.recording import output_pairs

    adapter = side.adapter
    with adapter.no_grad():
        return {key: tuple(t.shape) for key, t in output_pairs(adapter, side.forward())}


# -- 4. aligner scaling --------------------------------------------------------------------------
_LAYER_ZERO = re.compile(r"(^|\.)layers\.0(?=\.|$)")


def replicate(trace, blocks: int):
    """`blocks` copies of a recorded one-block trace, chained: block i reads block i-1's output;
    module paths and parameter names renumbered `layers.{i}`, constants made unique."""
    from bisectr.capture.trace import Trace

    ((output_key, output_tid),) = trace.outputs.items()
    chained = [tid for tid, info in trace.tensors.items() if info.leaf == "input:0"]
    if len(chained) != 1:
        raise Skipped("the one-block trace has no single input:0 leaf")
    chained_tid = chained[0]
    shared = {
        tid
        for tid, info in trace.tensors.items()
        if info.leaf and info.leaf.startswith("input:") and tid != chained_tid
    }
    n_ops = len(trace.ops)
    out = Trace(trace.side, trace.framework, trace.device, trace.dtype)
    next_tid = 0
    mapping_shared: dict[int, int] = {}
    previous_output = None
    for block in range(blocks):
        mapping: dict[int, int] = {}
        for tid, info in trace.tensors.items():
            if tid == chained_tid and previous_output is not None:
                mapping[tid] = previous_output
                continue
            if tid in shared and tid in mapping_shared:
                mapping[tid] = mapping_shared[tid]
                continue
            leaf = info.leaf
            if leaf is not None and leaf.startswith(("param:", "buffer:")):
                kind, name = leaf.split(":", 1)
                leaf = f"{kind}:{_LAYER_ZERO.sub(lambda m: f'{m.group(1)}layers.{block}', name)}"
            elif leaf is not None and leaf.startswith("const:"):
                leaf = f"const:{block * n_ops + int(leaf.split(':', 1)[1])}"
            producer = None if info.producer is None else info.producer + block * n_ops
            mapping[tid] = next_tid
            out.tensors[next_tid] = dataclasses.replace(info, tid=next_tid, producer=producer, leaf=leaf)
            if tid in shared:
                mapping_shared[tid] = next_tid
            next_tid += 1
        for op in trace.ops:
            out.ops.append(
                dataclasses.replace(
                    op,
                    index=op.index + block * n_ops,
                    module=_LAYER_ZERO.sub(lambda m: f"{m.group(1)}layers.{block}", op.module),
                    inputs=[mapping[t] for t in op.inputs],
                    outputs=[mapping[t] for t in op.outputs],
                )
            )
        previous_output = mapping[output_tid]
    out.outputs = {output_key: previous_output}
    return out


def measure_alignment(reference_fn: str, candidate_fn: str, sizes: tuple[int, ...], repeats: int) -> dict:
    import bisectr.adapters as adapters
    from bisectr.measure.align import align_traces, layer_numbers
    from bisectr.capture.recording import RecordOptions
    from bisectr.sides.runner import record_side

    # what `bisectr.trace` passes (older cores had no `adapters.input_layout`)
    input_layout = getattr(adapters, "input_layout", None) or (
        lambda framework, op, position: adapters.adapter_named(framework).input_layout(op, position)
    )

    options = RecordOptions(store_values=False)
    base_ref = record_side(build(reference_fn, "reference"), None, options)[0]
    base_cand = record_side(build(candidate_fn, "candidate"), None, options)[0]
    rows = []
    for size in sizes:
        blocks = max(1, math.ceil(size / len(base_cand.ops)))
        reference, candidate = replicate(base_ref, blocks), replicate(base_cand, blocks)
        times = []
        for _ in range(repeats if size < 50_000 else 1):
            gc.collect()
            start = time.perf_counter()
            alignment = align_traces(reference, candidate, None, input_layout)
            times.append(time.perf_counter() - start)
        aligned = len(alignment.aligned_ops("candidate")) / len(candidate.ops)
        same_layer = sum(
            layer_numbers(candidate.ops[p.candidate].module) == layer_numbers(reference.ops[p.reference].module)
            for p in alignment.pairs
        ) / max(1, len(alignment.pairs))
        rows.append(
            {
                "size": size,
                "ops": len(candidate.ops),
                "reference_ops": len(reference.ops),
                "blocks": blocks,
                "seconds": statistics.median(times),
                "aligned": aligned,
                "same_layer": same_layer,
            }
        )
        del reference, candidate, alignment
    first, last = rows[0], rows[-1]
    exponent = (
        math.log(last["seconds"] / first["seconds"]) / math.log(last["ops"] / first["ops"])
        if len(rows) > 1 and first["seconds"] > 0
        else float("nan")
    )
    return {"rows": rows, "exponent": exponent, "block_ops": (len(base_ref.ops), len(base_cand.ops))}


# -- 5. PaDiff -----------------------------------------------------------------------------------
def probe_padiff() -> dict:
    """Runs in its own process (importing padiff patches torch and paddle globally)."""
    workdir = tempfile.mkdtemp(prefix="bisectr-bench-padiff-")
    try:
        return _padiff_runs(workdir)
    finally:
        os.chdir(HERE)
        shutil.rmtree(workdir, ignore_errors=True)


def _padiff_runs(workdir: str) -> dict:
    os.chdir(workdir)
    # padiff puts its diff_log/ under sys.path[0], read both at import and at each log write
    sys.path.insert(0, workdir)
    import padiff

    sys.path.remove(workdir)
    module = models_module()
    results: dict[str, Any] = {"version": getattr(padiff, "__version__", "?")}
    for mode, options in (
        ("default", {"diff_phase": "forward"}),
        ("single_step", {"diff_phase": "forward", "single_step": True}),
    ):
        torch_model, (torch_x,) = module.torch_deep()
        paddle_model, (paddle_x,) = module.paddle_deep_tanh_ported()
        sys.path.insert(0, workdir)
        log = io.StringIO()
        start = time.perf_counter()
        error = None
        ret = None
        try:
            with contextlib.redirect_stdout(log):
                ret = padiff.auto_diff(
                    paddle_model,
                    torch_model,
                    ({"x": paddle_x}, {"x": torch_x}),
                    auto_weights=False,
                    options=dict(options),
                )
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:100] if str(exc).strip() else ''}"
        finally:
            sys.path.remove(workdir)
        elapsed = time.perf_counter() - start
        text = log.getvalue()
        found = re.search(r"diff found at torch: (.*?) vs paddle: (.*)", text)
        results[mode] = {
            "seconds": elapsed,
            "ret": ret,
            "error": error,
            "torch_at": found.group(1).strip() if found else None,
            "paddle_at": found.group(2).strip() if found else None,
            "api_count_differs": "number of api is different" in text,
        }
    return results


def padiff_installed() -> str | None:
    if importlib.util.find_spec("padiff") is None:
        return "padiff is not installed (pip install padiff into this environment)"
    if importlib.util.find_spec("yaml") is None:
        return "padiff needs PyYAML, which it does not declare (pip install pyyaml)"
    return None


# -- the table -----------------------------------------------------------------------------------
def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.1f} ms"


def secs(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"


def mb(n: float) -> str:
    value = n / 2**20
    if abs(value) < 0.05:
        value = 0.0
    return f"{value:.1f} MB" if abs(value) < 10 else f"{value:.0f} MB"


def yes_no(ok: bool | None) -> str:
    return "[dim]-[/]" if ok is None else ("[green]yes[/]" if ok else "[bold red]NO[/]")


def holds_cell(verdicts: dict[str, bool | None]) -> str:
    shown = [(fw, ok) for fw, ok in verdicts.items() if ok is not None]
    if not shown:
        return yes_no(None)
    if len(shown) == 1:
        return yes_no(shown[0][1])
    return " / ".join(f"{fw} {yes_no(ok)}" for fw, ok in shown)


class Report:
    """Collects rows (label, per-framework cells, target, per-framework verdicts) and target results."""

    def __init__(self):
        self.sections: list[tuple[str, list[tuple[str, dict[str, str], str, dict[str, bool | None]]]]] = []
        self.targets: list[tuple[str, dict[str, bool | None], str]] = []
        self.data: dict[str, Any] = {}
        self.failures: list[str] = []

    def section(self, title: str) -> None:
        self.sections.append((title, []))

    def row(self, label: str, cells: dict[str, str], target: str = "", verdicts: dict[str, bool | None] | None = None):
        self.sections[-1][1].append((label, cells, target, verdicts or {}))

    def target(self, name: str, verdicts: dict[str, bool | None], detail: str = "") -> None:
        self.targets.append((name, verdicts, detail))

    def render(self, title: str, caption: str) -> None:
        from rich.console import Console
        from rich.table import Table

        console = Console(width=None if sys.stdout.isatty() else 200)
        table = Table(title=title, caption=caption, caption_justify="left", show_lines=False, expand=False)
        table.add_column("benchmark", overflow="fold")
        for fw in FRAMEWORKS:
            table.add_column(fw, overflow="fold")
        table.add_column("target", overflow="fold")
        table.add_column("holds", no_wrap=True)
        for title_, rows in self.sections:
            table.add_section()
            table.add_row(f"[bold cyan]{title_}[/]", "", "", "", "")
            for label, cells, target, verdicts in rows:
                table.add_row(label, *(cells.get(fw, "") for fw in FRAMEWORKS), target, holds_cell(verdicts))
        table.add_section()
        table.add_row("[bold cyan]Targets[/]", "", "", "", "")
        for name, verdicts, detail in self.targets:
            cells = {fw: yes_no(verdicts.get(fw)) if fw in verdicts else "" for fw in FRAMEWORKS}
            table.add_row(name, *(cells[fw] for fw in FRAMEWORKS), detail, holds_cell(verdicts))
        console.print(table)


def guarded(report: Report, framework: str | None, paddle_reason: str | None, what: str, fn: Callable[[], Any]):
    """Run one measurement; a failure becomes a table cell, not a crash."""
    if framework == "paddle" and paddle_reason:
        return Skipped(f"skipped: {paddle_reason}")
    try:
        return fn()
    except Skipped as exc:
        return exc
    except Exception as exc:  # noqa: BLE001
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
        say(f"{what} failed: {message}\n{traceback.format_exc()}")
        if framework == "paddle":
            return Skipped(f"skipped: paddle adapter unavailable ({message})")
        report.failures.append(f"{what}: {message}")
        return Skipped(f"error: {message}")


def ok(value: Any) -> bool:
    return not isinstance(value, Skipped)


def describe_size(cfg: dict) -> str:
    return (
        f"{cfg['layers']} layers, d={cfg['dim']}, {cfg['heads']} heads, FFN {cfg['hidden']}, "
        f"batch {cfg['batch']} x seq {cfg['seq']}"
    )


# -- main ----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    parser.add_argument("--threads", type=int, default=1, help="torch math threads (default 1; paddle uses 1)")
    parser.add_argument("--json", type=Path, help="also write every raw figure to this file")
    parser.add_argument("--no-padiff", action="store_true", help="skip the PaDiff comparison")
    parser.add_argument(
        "--profile",
        nargs=3,
        metavar=("FRAMEWORK", "MODEL", "MODE"),
        help="instead of the table, pyinstrument's profile of recording one side: FRAMEWORK torch|paddle, "
        "MODEL small|base|deep, MODE stats|stored",
    )
    parser.add_argument("--probe-memory", nargs=3, metavar=("FRAMEWORK", "MODEL", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--probe-padiff", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        os.environ["BISECTR_BENCH_QUICK"] = "1"
    set_threads(args.threads)
    if args.profile:
        framework, model, mode = args.profile
        if framework not in FRAMEWORKS or model not in MODEL_TITLES or mode not in ("stats", "stored"):
            parser.error("--profile FRAMEWORK MODEL MODE: torch|paddle small|base|deep stats|stored")
        if importlib.util.find_spec("pyinstrument") is None:
            parser.error("--profile needs pyinstrument: pip install pyinstrument")
        print(profile_recording(framework, model, mode))
        return 0
    if args.probe_memory:
        print(json.dumps(probe_memory(*args.probe_memory)))
        return 0
    if args.probe_padiff:
        print(json.dumps(probe_padiff()))
        return 0

    plan = QUICK if args.quick else FULL
    started = time.perf_counter()
    sizes = models_module().size
    scratch = Path(tempfile.mkdtemp(prefix="bisectr-bench-"))
    report = Report()
    try:
        run_all(plan, args, sizes, scratch, report)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.perf_counter() - started
    import torch

    try:
        import paddle

        paddle_version = f"paddle {paddle.__version__} (1 thread)"
    except Exception:  # noqa: BLE001
        paddle_version = "paddle not importable"
    caption = (
        f"torch {torch.__version__} ({torch.get_num_threads()} thread{'s' if torch.get_num_threads() != 1 else ''}), "
        f"{paddle_version}, numpy BLAS/OpenMP threads {os.environ.get('OPENBLAS_NUM_THREADS', 'default')}, "
        f"{os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.1f} at the end; "
        f"{'QUICK (smoke-test sizes)' if plan.quick else 'full run'} in {elapsed:.0f} s.\n"
        "plain = model(*inputs) under no-grad; traced = bisectr.sides.runner.record_side() on one side "
        "(interception, module "
        "paths, source lines, stats + fingerprint per tensor; 'stored' also appends every tensor to tensors.bin), "
        "model building and trace.json excluded; medians, variants interleaved.\n"
        "memory: VmHWM during one forward in a fresh subprocess (glibc mmap threshold fixed at 128 KiB so freed "
        "tensors leave RSS; warm-ups identical: one plain forward + one recording of a one-block model; peak reset "
        "via clear_refs), as growth over the RSS just before it; batch xK = the same model built with K times the "
        "batch (BISECTR_BENCH_BATCH_SCALE); trace metadata = Python size of the trace, replay "
        "calls and store index kept in memory.\n"
        "search: Run.bisect() (op analysis, re-runs; tolerance 0) on the run bisectr.trace() recorded (48-layer "
        "stack: median of 3); whole command = bisectr.trace() (building both models, recording both sides, aligning "
        "them, writing the run) + the search; x forward = wall time / plain forward of the same candidate model, "
        "the median of 5 "
        "measured beside each search; phases timed by wrapping "
        "align_traces (in the trace), Analysis.compute and the side's rerun (bisectr.engines.patched.rerun); "
        "interception alone = the adapter's intercept() around a "
        "listener that only calls each op."
    )
    report.render("bisectr benchmarks", caption)
    if args.json:
        args.json.write_text(json.dumps(report.data, indent=2, default=str))
    if report.failures:
        print("failures:\n  " + "\n  ".join(report.failures))
        return 1
    return 0


def run_all(plan: Plan, args, sizes: Callable[[str], dict], scratch: Path, report: Report) -> None:
    say("checking the paddle adapter")
    paddle_reason = paddle_problem()
    if paddle_reason:
        say(f"paddle: {paddle_reason}")

    # 1. overhead ---------------------------------------------------------------------------------
    overhead: dict[tuple[str, str], Any] = {}
    for model in ("small", "base", "deep"):
        for fw in FRAMEWORKS:
            say(f"recording overhead: {fw} {model}")
            overhead[fw, model] = guarded(
                report,
                fw,
                paddle_reason,
                f"overhead {fw} {model}",
                lambda fw=fw, model=model: measure_overhead(fw, model, plan.repeats[model], scratch),
            )
    report.data["overhead"] = {
        f"{fw}/{m}": dataclasses.asdict(v) if ok(v) else str(v) for (fw, m), v in overhead.items()
    }

    def short(model: str) -> str:
        cfg = sizes(model)
        return f"{MODEL_TITLES[model]} {cfg['layers']}L d={cfg['dim']}"

    report.section("Recording overhead (one side, median)")
    for model in ("small", "base", "deep"):
        title = f"{MODEL_TITLES[model]} ({describe_size(sizes(model))})"
        results = {fw: overhead[fw, model] for fw in FRAMEWORKS}
        cell = lambda fw, f: f(results[fw]) if ok(results[fw]) else str(results[fw])  # noqa: E731
        report.row(
            f"{title}: ops recorded", {fw: cell(fw, lambda o: f"{o.ops} ops, {o.tensors} tensors") for fw in FRAMEWORKS}
        )
        report.row(
            "  plain forward",
            {fw: cell(fw, lambda o: f"{ms(o.plain)} ({o.plain / o.ops * 1e6:.0f} us/op)") for fw in FRAMEWORKS},
        )
        report.row(
            "  interception alone, nothing recorded (the floor)",
            {
                fw: cell(
                    fw,
                    lambda o: (
                        f"{ms(o.intercept)} = {o.intercept_ratio:.2f}x "
                        f"(+{(o.intercept - o.plain) / o.ops * 1e6:.0f} us/op)"
                    ),
                )
                for fw in FRAMEWORKS
            },
        )
        stats_ok = {fw: results[fw].stats_ratio <= TARGET_STATS if ok(results[fw]) else None for fw in FRAMEWORKS}
        report.row(
            "  traced, statistics only",
            {
                fw: cell(
                    fw,
                    lambda o: (
                        f"{ms(o.stats)} = [bold]{o.stats_ratio:.2f}x[/] "
                        f"(+{(o.stats - o.plain) / o.ops * 1e6:.0f} us/op)"
                    ),
                )
                for fw in FRAMEWORKS
            },
            f"<= {TARGET_STATS}x",
            stats_ok,
        )
        stored_ok = {fw: results[fw].stored_ratio <= TARGET_STORED if ok(results[fw]) else None for fw in FRAMEWORKS}
        report.row(
            "  traced, every tensor stored",
            {
                fw: cell(
                    fw,
                    lambda o: (
                        f"{ms(o.stored)} = [bold]{o.stored_ratio:.2f}x[/] "
                        f"(+{(o.stored - o.plain) / o.ops * 1e6:.0f} us/op)"
                    ),
                )
                for fw in FRAMEWORKS
            },
            f"<= {TARGET_STORED}x",
            stored_ok,
        )
        report.target(
            f"stats-only <= {TARGET_STATS}x plain, {short(model)}",
            stats_ok,
            " / ".join(f"{fw} {results[fw].stats_ratio:.2f}x" for fw in FRAMEWORKS if ok(results[fw])),
        )
        report.target(
            f"stored <= {TARGET_STORED}x plain, {short(model)}",
            stored_ok,
            " / ".join(f"{fw} {results[fw].stored_ratio:.2f}x" for fw in FRAMEWORKS if ok(results[fw])),
        )

    # 2. store size and memory --------------------------------------------------------------------
    memory: dict[tuple[str, str, int, str], Any] = {}
    for model in plan.memory_models:
        for fw in FRAMEWORKS:
            for scale in (1, MEMORY_BATCH_SCALE):
                for mode in ("plain", "stored"):
                    say(f"peak memory: {fw} {model} batch x{scale} {mode}")
                    memory[fw, model, scale, mode] = guarded(
                        report,
                        fw,
                        paddle_reason,
                        f"memory {fw} {model} x{scale} {mode}",
                        lambda fw=fw, model=model, scale=scale, mode=mode: run_probe(
                            ["--probe-memory", fw, model, mode],
                            args.threads,
                            env={"BISECTR_BENCH_BATCH_SCALE": str(scale)},
                        ),
                    )
    report.data["memory"] = {"/".join(map(str, k)): v if ok(v) else str(v) for k, v in memory.items()}

    report.section("Store size and peak memory")
    memory_ok: dict[str, bool | None] = {fw: None for fw in FRAMEWORKS}
    memory_detail = []
    for model in ("small", "base", "deep"):
        results = {fw: overhead[fw, model] for fw in FRAMEWORKS}
        cell = lambda fw, f: f(results[fw]) if ok(results[fw]) else str(results[fw])  # noqa: E731
        report.row(
            f"{short(model)}: tensors.bin vs tensors held",
            {
                fw: cell(
                    fw,
                    lambda o: (
                        f"{mb(o.store_bytes)} for {mb(o.activation_bytes)} activations + "
                        f"{mb(o.leaf_bytes)} params/inputs = "
                        f"{o.store_bytes / max(1, o.activation_bytes + o.leaf_bytes):.2f}x; "
                        f"trace.json {mb(o.json_bytes)}"
                    ),
                )
                for fw in FRAMEWORKS
            },
        )
        if model not in plan.memory_models:
            continue
        growth_cells, scaling_cells, verdicts = {}, {}, {}
        for fw in FRAMEWORKS:
            probes = [
                memory[fw, model, scale, mode] for scale in (1, MEMORY_BATCH_SCALE) for mode in ("plain", "stored")
            ]
            failed = next((probe for probe in probes if not ok(probe)), None)
            if failed is not None:
                growth_cells[fw] = scaling_cells[fw] = str(failed)
                verdicts[fw] = None
                continue
            plain, stored, big_plain, big_stored = probes
            growth = lambda probe: probe["peak"] - probe["before"]  # noqa: E731
            extra, big_extra = growth(stored) - growth(plain), growth(big_stored) - growth(big_plain)
            big_layer = big_stored["layer_bytes"]
            verdicts[fw] = big_extra - extra <= big_layer
            growth_cells[fw] = (
                f"forward +{mb(growth(plain))}, traced +{mb(growth(stored))} (one layer "
                f"{mb(stored['layer_bytes'])}; trace metadata {mb(stored['metadata_bytes'])})"
            )
            scaling_cells[fw] = (
                f"traced - forward +{mb(extra)} -> +{mb(big_extra)} while tensors.bin "
                f"{mb(stored['store_bytes'])} -> {mb(big_stored['store_bytes'])} (one layer {mb(big_layer)})"
            )
            memory_ok[fw] = verdicts[fw] if memory_ok[fw] is None else (memory_ok[fw] and verdicts[fw])
            memory_detail.append(
                (verdicts[fw], f"{fw} {short(model)} +{mb(extra)} -> +{mb(big_extra)}, one layer {mb(big_layer)}")
            )
        report.row("  peak RSS growth in one forward: plain, traced+stored", growth_cells)
        report.row(
            f"  recording's extra memory, batch x1 -> x{MEMORY_BATCH_SCALE}",
            scaling_cells,
            "grows <= 1 layer",
            verdicts,
        )
    report.target(
        f"memory bounded with tensors on disk (what recording adds grows <= one layer at batch x{MEMORY_BATCH_SCALE})",
        memory_ok,
        f"{sum(held for held, _ in memory_detail)}/{len(memory_detail)} configurations"
        + "".join(f"; {text}" for held, text in memory_detail if not held),
    )

    # 3. the search -------------------------------------------------------------------------------
    deep_layers = sizes("deep")["layers"]
    shallow_layers = sizes("shallow")["layers"]
    tanh_deep = models_module().tanh_layer("deep")
    tanh_shallow = models_module().tanh_layer("shallow")
    search: dict[tuple[str, str], Any] = {}
    forwards: dict[tuple[str, str], Any] = {}
    for fw in FRAMEWORKS:
        say(f"search: {fw} deep")
        search[fw, "deep"] = guarded(
            report,
            fw,
            paddle_reason,
            f"search {fw} deep",
            lambda fw=fw: measure_search(f"{fw}_deep", f"{fw}_deep_tanh", scratch, repeats=3),
        )
        for mode in ("binary", "exhaustive"):
            say(f"search: {fw} shallow {mode}")
            search[fw, f"shallow-{mode}"] = guarded(
                report,
                fw,
                paddle_reason,
                f"search {fw} shallow {mode}",
                lambda fw=fw, mode=mode: measure_search(
                    f"{fw}_shallow", f"{fw}_shallow_tanh", scratch, mode == "exhaustive"
                ),
            )
        if fw in plan.base_search:
            say(f"search: {fw} base")
            search[fw, "base"] = guarded(
                report,
                fw,
                paddle_reason,
                f"search {fw} base",
                lambda fw=fw: measure_search(f"{fw}_base", f"{fw}_base_tanh", scratch),
            )
        else:
            search[fw, "base"] = Skipped("not run in the full benchmark (time: ~25 paddle forwards of ~2 s)")
        say(f"search: {fw} deep, backward")
        search[fw, "backward"] = guarded(
            report,
            fw,
            paddle_reason,
            f"backward search {fw} deep",
            lambda fw=fw: measure_backward(f"{fw}_deep", f"{fw}_deep_tanh", scratch),
        )
        say(f"training: torch vs {fw}")
        search[fw, "training"] = guarded(
            report,
            fw,
            paddle_reason,
            f"training torch vs {fw}",
            lambda fw=fw: measure_training("torch_port" if fw == "torch" else "candidate", plan.training_steps),
        )
        for key, measured in (
            ("deep", search[fw, "deep"]),
            ("shallow", search[fw, "shallow-binary"]),
            ("base", search[fw, "base"]),
        ):
            forwards[fw, key] = measured["forward"] if ok(measured) else None  # beside the search it divides
    report.data["search"] = {"/".join(k): v if ok(v) else str(v) for k, v in search.items()}

    report.section("Search for the planted tanh GELU (torch vs torch, paddle vs paddle)")
    deep = {fw: search[fw, "deep"] for fw in FRAMEWORKS}
    cell = lambda fw, f, results=deep: f(results[fw]) if ok(results[fw]) else str(results[fw])  # noqa: E731
    expected_module = f"layers.{tanh_deep}.ffn"
    found = {
        fw: (
            deep[fw]["verdict"] == "divergent"
            and deep[fw]["culprit_op"] == "gelu"
            and deep[fw]["culprit_module"] == expected_module
        )
        if ok(deep[fw])
        else None
        for fw in FRAMEWORKS
    }
    report.row(
        f"{deep_layers}-layer stack, GELU of {expected_module} is tanh: culprit",
        {
            fw: cell(
                fw, lambda s: f"{s['verdict']}: {s['culprit_op']} at {s['culprit_module']} (op {s['culprit_index']})"
            )
            for fw in FRAMEWORKS
        },
        f"gelu at {expected_module}",
        found,
    )
    bound = {fw: math.ceil(math.log2(deep[fw]["ops"])) if ok(deep[fw]) else None for fw in FRAMEWORKS}
    reruns_ok = {
        fw: deep[fw]["reruns"] <= bound[fw] + TARGET_RERUN_SLACK if ok(deep[fw]) else None for fw in FRAMEWORKS
    }
    report.row(
        "  candidate re-runs vs ceil(log2 ops)",
        {
            fw: cell(
                fw,
                lambda s, fw=fw: (
                    f"{s['reruns']} vs {bound[fw]} ({s['ops']} ops); +{s['reference_reruns']} reference re-runs"
                ),
            )
            for fw in FRAMEWORKS
        },
        f"<= ceil(log2 ops) + {TARGET_RERUN_SLACK}",
        reruns_ok,
    )
    training = {fw: search[fw, "training"] for fw in FRAMEWORKS}
    report.row(
        "`bisectr train` (torch vs torch | torch vs paddle): per step, in plain training steps of the candidate",
        {
            fw: cell(
                fw,
                lambda s: (
                    f"{secs(s['seconds'])} for {s['steps']} steps = "
                    f"[bold]{s['seconds'] / s['steps'] / s['plain_step']:.0f}x[/] "
                    f"one step ({ms(s['plain_step'])}); {s['verdict']}"
                ),
                training,
            )
            for fw in FRAMEWORKS
        },
    )
    backward = {fw: search[fw, "backward"] for fw in FRAMEWORKS}
    report.row(
        "  --backward: the backward search, in plain forward+backward passes of the candidate",
        {
            fw: cell(
                fw,
                lambda s: (
                    f"{secs(s['seconds'])} = [bold]{s['seconds'] / s['pass']:.0f}x[/] one pass "
                    f"({ms(s['pass'])}); {s['verdict']} at {s['culprit_op']} {s['culprit_module']}, "
                    f"{s['reruns']} re-runs ({s['ops']} ops)"
                ),
                backward,
            )
            for fw in FRAMEWORKS
        },
    )

    def in_forwards(fw, key="deep", phase="bisect"):
        s, f = search[fw, key], forwards[fw, key]
        return s[phase] / f if ok(s) and f is not None and not isinstance(f, Skipped) else None

    wall_ok = {
        fw: (in_forwards(fw) <= TARGET_SEARCH_FORWARDS) if in_forwards(fw) is not None else None for fw in FRAMEWORKS
    }
    report.row(
        "  the search (Run.bisect() on the recorded run)",
        {
            fw: cell(
                fw,
                lambda s, fw=fw: (
                    f"{secs(s['bisect'])} = [bold]{in_forwards(fw):.0f}x[/] one forward ({ms(forwards[fw, 'deep'])})"
                    if in_forwards(fw) is not None
                    else secs(s["bisect"])
                ),
            )
            for fw in FRAMEWORKS
        },
        f"<= {TARGET_SEARCH_FORWARDS:.0f}x forward",
        wall_ok,
    )
    report.row(
        "    of which: op analysis / re-runs",
        {
            fw: cell(
                fw,
                lambda s: (
                    f"{secs(s['analysis'])} / {secs(s['rerun_time'])} for {s['reruns'] + s['reference_reruns']} re-runs"
                ),
            )
            for fw in FRAMEWORKS
        },
    )
    report.row(
        "    the float64 check / the reproducibility check (both sides each), in forwards",
        {
            fw: cell(
                fw,
                lambda s, fw=fw: (
                    f"{in_forwards(fw, phase='float64'):.1f}x / {in_forwards(fw, phase='reproduce'):.1f}x"
                    if in_forwards(fw) is not None
                    else ""
                ),
            )
            for fw in FRAMEWORKS
        },
    )
    report.row(
        "  whole `bisectr bisect` (building both models, tracing both sides, the search)",
        {
            fw: cell(
                fw,
                lambda s, fw=fw: (
                    f"{secs(s['total'])} = {in_forwards(fw, phase='total'):.0f}x one forward "
                    f"(trace {secs(s['trace'])}, of which align {secs(s['align'])})"
                    if in_forwards(fw) is not None
                    else secs(s["total"])
                ),
            )
            for fw in FRAMEWORKS
        },
    )
    base = {fw: search[fw, "base"] for fw in FRAMEWORKS}
    base_cells = {}
    for fw in FRAMEWORKS:
        r = base[fw]
        if not ok(r):
            base_cells[fw] = str(r)
            continue
        times = (
            f" = [bold]{in_forwards(fw, 'base'):.0f}x[/] forward "
            f"(whole command {in_forwards(fw, 'base', 'total'):.0f}x, "
            f"float64 check {in_forwards(fw, 'base', 'float64'):.1f}x)"
            if in_forwards(fw, "base") is not None
            else ""
        )
        base_cells[fw] = (
            f"search {secs(r['bisect'])}{times}: analysis {secs(r['analysis'])}, "
            f"{r['reruns'] + r['reference_reruns']} re-runs {secs(r['rerun_time'])}, leaves paired, compared "
            f"and searched {secs(r['leaves'])} ({r['leaves'] / r['total']:.1%} of the whole command); "
            f"{r['culprit_op']} at {r['culprit_module']}"
        )
    report.row(
        f"contrast: base encoder {sizes('base')['layers']}L d={sizes('base')['dim']}, tanh GELU at "
        f"layers.{models_module().tanh_layer('base')}.ffn",
        base_cells,
    )
    for mode in ("binary", "exhaustive"):
        results = {fw: search[fw, f"shallow-{mode}"] for fw in FRAMEWORKS}
        label = (
            f"{shallow_layers}-layer stack (tanh at layers.{tanh_shallow}), {mode} search"
            if mode == "binary"
            else "  same, exhaustive=True (contrast)"
        )
        cells = {}
        for fw, r in results.items():
            if not ok(r):
                cells[fw] = str(r)
                continue
            times = f" = {r['bisect'] / forwards[fw, 'shallow']:.0f}x forward" if forwards[fw, "shallow"] else ""
            cells[fw] = (
                f"{r['reruns']} re-runs, search {secs(r['bisect'])}{times}; {r['culprit_op']} at {r['culprit_module']}"
            )
        report.row(label, cells)
    report.target(
        f"search re-runs <= ceil(log2 ops) + {TARGET_RERUN_SLACK}, {deep_layers}-layer stack",
        reruns_ok,
        " / ".join(
            f"{fw} {deep[fw]['reruns']} vs {bound[fw] + TARGET_RERUN_SLACK}" for fw in FRAMEWORKS if ok(deep[fw])
        ),
    )
    report.target(
        f"search within {TARGET_SEARCH_FORWARDS:.0f}x one forward, {deep_layers}-layer stack",
        wall_ok,
        " / ".join(f"{fw} {in_forwards(fw):.0f}x" for fw in FRAMEWORKS if in_forwards(fw) is not None),
    )

    # 4. aligner ----------------------------------------------------------------------------------
    pairs = {"torch": ("torch_block", "torch_block"), "paddle": ("torch_block", "paddle_block_ported")}
    alignment: dict[str, Any] = {}
    for fw, (ref_fn, cand_fn) in pairs.items():
        say(f"aligner scaling: {ref_fn} vs {cand_fn}")
        alignment[fw] = guarded(
            report,
            fw,
            paddle_reason,
            f"aligner {fw}",
            lambda ref_fn=ref_fn, cand_fn=cand_fn: measure_alignment(
                ref_fn, cand_fn, plan.align_sizes, plan.align_repeats
            ),
        )
    report.data["alignment"] = {k: v if ok(v) else str(v) for k, v in alignment.items()}
    report.section("Aligner on synthetic traces (a recorded block repeated): torch vs torch | torch vs paddle")
    biggest = plan.align_sizes[-1]
    for index, size in enumerate(plan.align_sizes):
        cells, verdicts = {}, {}
        for fw in FRAMEWORKS:
            a = alignment[fw]
            if not ok(a):
                cells[fw] = str(a)
                continue
            row = a["rows"][index]
            cells[fw] = (
                f"{secs(row['seconds'])} ({row['ops']} ops, {row['seconds'] / row['ops'] * 1e6:.0f} us/op); "
                f"{row['aligned']:.0%} aligned, {row['same_layer']:.0%} same layer"
            )
            if size == biggest:
                verdicts[fw] = row["seconds"] <= TARGET_ALIGN_SECONDS
        report.row(
            f"{size // 1000}k ops" if size >= 1000 else f"{size} ops",
            cells,
            f"<= {TARGET_ALIGN_SECONDS:.0f} s" if size == biggest else "",
            verdicts,
        )
    linear = {fw: alignment[fw]["exponent"] <= LINEAR_EXPONENT if ok(alignment[fw]) else None for fw in FRAMEWORKS}
    report.row(
        "  growth: time ~ ops^k",
        {
            fw: f"k = {alignment[fw]['exponent']:.2f} (blocks of {alignment[fw]['block_ops'][1]} ops)"
            if ok(alignment[fw])
            else str(alignment[fw])
            for fw in FRAMEWORKS
        },
        f"k <= {LINEAR_EXPONENT} (about linear)",
        linear,
    )
    big = {
        fw: alignment[fw]["rows"][-1]["seconds"] <= TARGET_ALIGN_SECONDS if ok(alignment[fw]) else None
        for fw in FRAMEWORKS
    }
    report.target(
        f"{biggest // 1000}k-op alignment <= {TARGET_ALIGN_SECONDS:.0f} s",
        big,
        " / ".join(f"{fw} {secs(alignment[fw]['rows'][-1]['seconds'])}" for fw in FRAMEWORKS if ok(alignment[fw])),
    )
    report.target(
        "alignment time about linear in ops",
        linear,
        " / ".join(f"{fw} k={alignment[fw]['exponent']:.2f}" for fw in FRAMEWORKS if ok(alignment[fw])),
    )

    # 5. PaDiff -----------------------------------------------------------------------------------
    report.section(
        f"PaDiff vs bisectr: torch {deep_layers}-layer stack vs its paddle port, tanh GELU at {expected_module}"
    )
    if args.no_padiff:
        padiff: Any = Skipped("skipped: --no-padiff")
    elif paddle_reason:
        padiff = Skipped(f"skipped: {paddle_reason}")
    else:
        reason = padiff_installed()
        say("PaDiff")
        padiff = (
            Skipped(f"skipped: {reason}")
            if reason
            else guarded(report, "paddle", None, "padiff", lambda: run_probe(["--probe-padiff"], args.threads))
        )
    say("bisectr on the cross-framework pair")
    cross = guarded(
        report,
        "paddle",
        paddle_reason,
        "search torch vs paddle",
        lambda: measure_search("torch_deep", "paddle_deep_tanh_ported", scratch),
    )
    report.data["padiff"] = padiff if ok(padiff) else str(padiff)
    report.data["cross_search"] = cross if ok(cross) else str(cross)
    for mode in ("default", "single_step"):
        if not ok(padiff):
            report.row(f"PaDiff auto_diff ({mode})", {"torch": "", "paddle": str(padiff)})
            continue
        p = padiff[mode]
        if p["torch_at"]:
            where = f"stops at {p['torch_at']} vs {p['paddle_at']}"
            if p["api_count_differs"]:
                where += " ('number of api is different')"
        elif p["ret"]:
            where = "reports SUCCESS: the planted difference is missed"
        else:
            where = f"no location ({p['error'] or 'failed'})"
        report.row(
            f"PaDiff {padiff['version']} auto_diff ({mode.replace('_', ' ')})",
            {"torch": "", "paddle": f"{secs(p['seconds'])}; {where}"},
            "the gelu op",
            {"paddle": False},
        )
    report.row(
        "bisectr.bisect() on the same pair",
        {
            "torch": "",
            "paddle": (
                f"{secs(cross['total'])}; {cross['verdict']}: {cross['culprit_op']} at "
                f"{cross['culprit_module']} (op {cross['culprit_index']}), {cross['reruns']} re-runs"
            )
            if ok(cross)
            else str(cross),
        },
        "the gelu op",
        {
            "paddle": (cross["culprit_op"] == "gelu" and cross["culprit_module"] == expected_module)
            if ok(cross)
            else None
        },
    )


if __name__ == "__main__":
    sys.exit(main())
