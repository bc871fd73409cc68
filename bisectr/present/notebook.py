"""`bisectr.compare`: the search on live model objects, for notebooks and scripts.

    import bisectr
    result = bisectr.compare(reference=(torch_model, (x,)), candidate=(paddle_model, (y,)))
    result          # in Jupyter: the verdict, the culprit with its source lines, the error profile
    result.culprit  # typed, as from `Run.bisect()`

The same recording, alignment and search as a model file, in this process. The run is
saved like any other (`out`, or a temporary directory) and opens in `bisectr view`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from ..capture.modelfile import side_of
from ..measure.runrecord import HowTraced
from .report import print_result
from ..measure.result import Result
from ..run import Run, record_run, temporary_run_dir
from ..sides.runner import LocalSide

ORIGIN = Path("bisectr.compare")  # what messages name instead of a model file
HTML_WIDTH = 120


@dataclass
class Comparison(Result):
    """A `Result` that remembers its run, to show itself (`_repr_html_` in Jupyter, `str` elsewhere)."""

    run: Run | None = field(default=None, repr=False, compare=False, metadata={"plain": False})

    def _repr_html_(self) -> str:
        return self._recorded().export_html(inline_styles=True)

    def __str__(self) -> str:
        return self._recorded().export_text()

    def _recorded(self) -> Console:
        """A console that printed the result (as `bisectr bisect` does) and kept what it printed."""
        with open(os.devnull, "w") as nowhere:
            console = Console(record=True, width=HTML_WIDTH, file=nowhere)
            print_result(console, self.run, self)
        return console


def compare(
    reference: tuple[Any, Any],
    candidate: tuple[Any, Any],
    out: str | os.PathLike | None = None,
    tolerance: float = 0.0,
    exhaustive: bool = False,
    align_modules: dict[str, str] | None = None,
    store_values: bool = True,
) -> Comparison:
    """Record `reference` and `candidate`, each `(model, inputs)` as a model file's functions return
    them, and search for the culprit. `align_modules` pins candidate module paths to reference ones
    (a model file's `ALIGN_MODULES`). The run is saved in `out` (a temporary directory if None)."""
    sides = {
        role: LocalSide(side_of(role, built, ORIGIN, role, f"the {role} argument is"))
        for role, built in (("reference", reference), ("candidate", candidate))
    }
    traced = HowTraced("", "compare(reference=...)", "compare(candidate=...)", store_values=store_values)
    run_dir = Path(out) if out is not None else temporary_run_dir("compare")
    run = record_run(traced, sides, align_modules, run_dir, ORIGIN, commit=False)
    try:
        result = run.bisect(tolerance, exhaustive)
    except BaseException:
        run.discard()
        raise
    run.save()
    return Comparison(**vars(result), run=run)
