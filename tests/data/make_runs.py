"""Writes the saved runs the TUI tests open, `tests/data/runs/<name>/`:

    python tests/data/make_runs.py

A saved run is data: the TUI shows it with the same digits on every CPU, where a run made by the
tests themselves carries the digits of the machine's math kernels. Sources and the model file are
stored relative to the repository root, where the tests run. Run again after a change to what a
run directory holds (the tests then show what changed in the snapshots).
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = Path(__file__).resolve().parent / "runs"
MODELS = {"tui_mlp": "tests/models/tui_mlp.py", "span_head": "examples/span_head.py"}


def make(name: str, model_file: str) -> Path:
    import bisectr

    out = RUNS / name
    shutil.rmtree(out, ignore_errors=True)
    run = bisectr.trace(ROOT / model_file, out=out)
    run.bisect()
    run.save()
    for document in out.rglob("*.json"):
        document.write_text(document.read_text().replace(f"{ROOT}/", ""))
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for name, model_file in MODELS.items():
        print(make(name, model_file))
