"""Readable text output (rich) for runs and results."""
from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table

from .run import Run


def fmt(value: float) -> str:
    return f"{value:.3g}" if value == value else "n/a"


def short_source(source: str) -> str:
    """`path:line` relative to the working directory when it lies below it."""
    path, _, line = source.rpartition(":")
    if not path:
        return source
    relative = os.path.relpath(path)
    return f"{path if relative.startswith('..') else relative}:{line}"


def print_trace_summary(console: Console, run: Run) -> None:
    sides = Table(title="Sides", title_justify="left")
    for column in ("side", "framework", "device", "dtype", "ops", "leaves", "stored tensors"):
        sides.add_column(column)
    for role, trace in run.traces.items():
        stored = sum(1 for t in trace.tensors.values() if t.stored)
        sides.add_row(role, trace.framework, trace.device, trace.dtype, str(len(trace.ops)), str(len(trace.leaves)), str(stored))
    console.print(sides)

    outputs = Table(title="Outputs", title_justify="left")
    for column in ("output", "shape", "max abs", "max rel", "cosine"):
        outputs.add_column(column)
    for pair in run.output_pairs():
        info = run.reference.tensors[pair.reference]
        metrics = pair.metrics
        outputs.add_row(pair.key, str(list(info.shape)), fmt(metrics["max_abs"]), fmt(metrics["max_rel"]), fmt(metrics["cosine"]))
    console.print(outputs)
    if run.run_dir is not None:
        console.print(f"run saved in {run.run_dir}  (reopen with: bisectr view {run.run_dir})", highlight=False)
