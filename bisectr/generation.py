"""Greedy generation compared step by step (`bisectr generate`): the first step where two implementations part,
and the op inside that step.

1. **Decoding.** Each side decodes where its model lives (`engines.decoding`, through its `DecodeStep`
   requests): step 0 is the prefill of the prompt, then one step per generated token, each side with its own
   cache. Both sides are fed the reference's top-1 token of the step before (teacher forcing), so that the
   steps stay comparable after the tokens part; until the first flip the candidate's tokens are its own, so
   the first flip is also where free-running decoding would part.
2. **Per step**, the last position's logits and the cache the step leaves are compared. Both sides also
   decode as float64 copies in lockstep (fed the same tokens): rounding predicts each side's distance to its
   own float64 run, summed (`rounding`), and the float64 runs' own difference is what is left without
   rounding (`float64_error`). A step is `divergent` where rounding does not explain that difference
   (`measure.numerics.rounding_explains`), else `noise` (`match` when the logits agree bit for bit). The
   caches are compared entry by entry, each candidate entry in the layout that brings it closest to the
   reference's at the prefill ([batch, heads, seq, dim] against [batch, seq, heads, dim]).
3. **The step searched** is the first whose logits or cache rounding does not explain: a cache written wrong
   at an earlier step is searched at the step that wrote it (`first_divergent_step`, the first step whose
   logits differ, may come later). That step runs again as a forward pass of its own (`OpenStep`): its inputs
   the step's tokens and the cache the steps before it wrote (as leaves), its outputs the logits and the cache
   it leaves, and `Run.bisect` finds and confirms the culprit there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import numpy as np

from .adapters import CannotUpcast
from .capture.modelfile import load_module
from .capture.store import SIDES
from .engines.decoding import StepOutputs
from .errors import ModelFileError
from .measure.align import Permutation
from .measure.numerics import (
    coarsest_dtype,
    magnitude,
    noise_floor,
    relative_to,
    rounding_allowance,
    rounding_explains,
)
from .measure.result import Result
from .measure.runrecord import in_layout, layouts_by_error
from .run import Run, how_traced, record_run, start_sides, temporary_run_dir
from .serial import to_plain
from .sides.ranks import Rendezvous
from .sides.runner import DecodeStep, OpenStep, SideRunner

StepVerdict = Literal["match", "noise", "divergent"]
# A generation's verdict: a step's, or `nondeterministic` where the search of the step finds a side that does not
# repeat itself.
Verdict = Literal["match", "noise", "divergent", "nondeterministic"]


@dataclass
class Judged:
    """One thing a step computed (its logits, or one cache entry), compared: the float32 runs' relative
    error, what rounding predicts, the float64 runs' difference, and the verdict."""

    error: float
    rounding: float
    float64_error: float
    verdict: StepVerdict


@dataclass
class StepRow:
    step: int  # 0: the prefill
    verdict: StepVerdict  # the step's: `divergent` where its logits or its cache is
    reference_tokens: list[int]  # each row's top-1 token
    candidate_tokens: list[int]
    logits: Judged
    margin: float  # the reference's smallest gap between its top-1 and top-2 logits, over rows
    cache: Judged | None  # the cache entry rounding explains least (None: the caches are not compared)
    cache_entry: str | None = None  # that entry, by where it sits in the candidate's cache


@dataclass
class Flip:
    """The first step where the top-1 tokens part, in the first row where they do."""

    step: int
    row: int
    reference_token: int
    candidate_token: int
    margin: float  # the reference's gap between its top-1 logit and the candidate's token's
    rounding: bool  # the step's logits differ by rounding only: a near-tie that rounding tipped


@dataclass
class GenerationResult:
    verdict: Verdict
    tokens: int  # decode steps after the prefill
    steps: list[StepRow]
    first_divergent_step: int | None = None  # the first step whose logits rounding does not explain
    first_flip: Flip | None = None
    culprit_step: int | None = None  # the step searched: the first whose logits or cache rounding does not explain
    search: Result | None = None  # the forward search of that step
    note: str = ""  # what was not compared or searched, and why
    run: Run | None = field(default=None, repr=False, compare=False, metadata={"plain": False})

    def to_dict(self) -> dict:
        """The JSON form: `bisect`'s culprit and confirmation with the step they are at, then the steps."""
        plain = to_plain(self)
        search = plain.pop("search")
        culprit = search and search["culprit"]
        plain["culprit"] = {**culprit, "step": self.culprit_step} if culprit else None
        plain["confirmation"] = None if search is None else search["confirmation"]
        plain["step_search"] = search
        return plain


def generate(
    model_file: str | os.PathLike,
    reference: str = "reference",
    candidate: str = "candidate",
    tokens: int = 16,
    tolerance: float = 0.0,
    exhaustive: bool = False,
    progress: Callable[[str], None] | None = None,
    isolate: bool = False,
    reference_python: str | None = None,
    candidate_python: str | None = None,
    reference_nproc: int | None = None,
    candidate_nproc: int | None = None,
    rendezvous: Rendezvous | None = None,
) -> GenerationResult:
    """Decode `tokens` steps after the prefill on both sides of `model_file` and compare them step by
    step (see the module docstring); with `isolate` (or a side's python), each side runs in its own process,
    and a side with its nproc (`run.trace`) on torchrun's ranks."""
    say = progress or (lambda message: None)
    if tokens < 1:
        raise ModelFileError(f"{model_file}: --tokens must be at least 1 (got {tokens})")
    model_file = Path(model_file)
    module = load_module(model_file)
    traced = how_traced(
        module,
        model_file,
        reference,
        candidate,
        isolate,
        reference_python,
        candidate_python,
        reference_nproc,
        candidate_nproc,
        rendezvous=rendezvous,
    )
    runners, pins = start_sides(module, model_file, traced, rendezvous)
    decoding = _Decoding(runners, model_file, tokens)
    rows = []
    for number in range(tokens + 1):
        say(f"decoding step {number} of {tokens}")
        rows.append(decoding.step(number))
    result = GenerationResult("noise", tokens, rows, first_flip=decoding.first_flip, note="; ".join(decoding.notes))
    divergent = [row.step for row in rows if row.verdict == "divergent"]
    result.first_divergent_step = next((row.step for row in rows if row.logits.verdict == "divergent"), None)
    if not divergent:
        exact = all(row.logits.error == 0 and (row.cache is None or row.cache.error == 0) for row in rows)
        result.verdict = "match" if exact else "noise"
        return result
    result.verdict, result.culprit_step = "divergent", divergent[0]
    say(f"searching inside step {result.culprit_step}")
    for role in SIDES:
        runners[role].run(OpenStep(result.culprit_step, decoding.fed[: result.culprit_step]))
    run_dir = temporary_run_dir(f"{model_file.stem}-step{result.culprit_step}")
    result.run = record_run(traced, runners, pins, run_dir, model_file, output_layouts=decoding.output_layouts())
    result.search = result.run.bisect(tolerance, exhaustive, progress)
    if result.search.verdict == "nondeterministic":  # what differs is a side against itself, not the sides
        result.verdict = "nondeterministic"
    return result


class _Decoding:
    """Both sides decoding in lockstep, in float32 and float64, fed the reference's tokens; one `StepRow`
    per step."""

    def __init__(self, runners: dict[str, SideRunner], model_file: Path, tokens: int):
        self.runners, self.model_file, self.tokens = runners, model_file, tokens
        self.fed: list[np.ndarray] = []  # the token fed at each step from 1 on
        self.entry_pairs: list[tuple[str, str, Permutation]] | None = None  # (reference, candidate, layout)
        self.first_flip: Flip | None = None
        self.notes: list[str] = []  # what was not compared, and how the caches differ in kind

    def step(self, number: int) -> StepRow:
        token = self.fed[-1] if number else None
        outputs = {(role, width): self._decoded(role, width, number, token) for role in SIDES for width in (32, 64)}
        ref, cand = outputs["reference", 32], outputs["candidate", 32]
        if ref.logits.shape != cand.logits.shape:
            raise ModelFileError(
                f"{self.model_file}: the sides' logits have shapes {list(ref.logits.shape)} (reference) and "
                f"{list(cand.logits.shape)} (candidate): sides with different vocabularies or batches cannot be "
                "decoded against each other"
            )
        if number == 0:
            self._check_prompts(ref.prompt, cand.prompt)
            self.entry_pairs = self._pair_entries(ref.cache, cand.cache)
            self._note_narrower_cache(ref.cache_dtypes, cand.cache_dtypes)
        logits = _judged(*(outputs[key].logits for key in _FOUR))
        cache, entry = self._cache_judged(outputs)
        ref_top, cand_top = ref.logits.argmax(-1), cand.logits.argmax(-1)
        self.first_flip = self.first_flip or _flip(number, ref.logits, cand.logits, logits)
        self.fed.append(ref_top)
        verdict = "divergent" if "divergent" in (logits.verdict, cache and cache.verdict) else logits.verdict
        return StepRow(number, verdict, ref_top.tolist(), cand_top.tolist(), logits, _margin(ref.logits), cache, entry)

    def _check_prompts(self, reference: np.ndarray, candidate: np.ndarray) -> None:
        if reference.shape != candidate.shape or not np.array_equal(reference, candidate):
            shapes = (
                f" ({list(reference.shape)} and {list(candidate.shape)})" if reference.shape != candidate.shape else ""
            )
            raise ModelFileError(
                f"{self.model_file}: the sides' prompts differ{shapes}: generate feeds both the same tokens, so both "
                "sides' input_ids must hold the same ids (the same tokenizer and vocabulary)"
            )

    def _decoded(self, role: str, width: int, number: int, token: np.ndarray | None) -> StepOutputs:
        try:
            return self.runners[role].run(DecodeStep(width, number, token, self.tokens))
        except CannotUpcast as exc:
            raise ModelFileError(
                f"{self.model_file}: the {role} cannot be decoded in float64 ({exc}); bisectr generate tells "
                "rounding from a real difference at each step by its float64 run"
            ) from None

    def _pair_entries(
        self, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]
    ) -> list[tuple[str, str, Permutation]] | None:
        """Each candidate cache entry with the reference's at the same place in the cache, in the layout
        that brings it closest (None, said in the note, where the caches do not pair so)."""
        if len(reference) != len(candidate):
            self.notes.append(
                f"the caches are not compared: the reference's holds {len(reference)} tensors, the "
                f"candidate's {len(candidate)}"
            )
            return None
        pairs = []
        for (ref_key, ref_values), (cand_key, cand_values) in zip(reference.items(), candidate.items()):
            layouts = layouts_by_error(cand_values, ref_values) if ref_values.size == cand_values.size else []
            if not layouts:
                self.notes.append(
                    f"the caches are not compared: the candidate's {cand_key} {list(cand_values.shape)} has no "
                    f"layout of the reference's {ref_key} {list(ref_values.shape)}"
                )
                return None
            pairs.append((ref_key, cand_key, layouts[0][1]))
        return pairs

    def _note_narrower_cache(self, reference: dict[str, str], candidate: dict[str, str]) -> None:
        """Say where the candidate keeps its cache in a coarser dtype than the reference: its rounding is
        rounding by the float64 rule (as any cast down is), the cache error of every step its size."""
        narrower = [
            (cand_key, candidate[cand_key], reference[ref_key])
            for ref_key, cand_key, _ in self.entry_pairs or []
            if coarsest_dtype([candidate[cand_key], reference[ref_key]]) == candidate[cand_key]
            and candidate[cand_key] != reference[ref_key]
        ]
        if narrower:
            key, cand_dtype, ref_dtype = narrower[0]
            self.notes.append(
                f"the candidate keeps {len(narrower)} of its {len(candidate)} cache entries in {cand_dtype} (the "
                f"reference in {ref_dtype}; {key} first): their rounding is counted as rounding, and the cache error "
                "of each step is its size"
            )

    def _cache_judged(self, outputs: dict[tuple[str, int], StepOutputs]) -> tuple[Judged | None, str | None]:
        """The cache entry rounding explains least (by its float64 difference against what rounding allows)."""
        if self.entry_pairs is None:
            return None, None
        worst: tuple[float, Judged, str] | None = None
        for ref_key, cand_key, layout in self.entry_pairs:
            values = [outputs[key].cache[ref_key if key[0] == "reference" else cand_key] for key in _FOUR]
            shape = values[0].shape
            if any(v.size != values[0].size for v in values):
                raise ModelFileError(
                    f"{self.model_file}: the candidate's cache entry {cand_key} no longer has the size of the "
                    f"reference's {ref_key} ({list(shape)})"
                )
            values = [v if role == "reference" else in_layout(v, layout, shape) for v, (role, _) in zip(values, _FOUR)]
            judged = _judged(*values)
            # ordered by the float64 rule itself, so that the entry kept is divergent where any entry is
            excess = relative_to(judged.float64_error, rounding_allowance(judged.rounding, noise_floor("float32")))
            if worst is None or excess > worst[0]:
                worst = (excess, judged, cand_key)
        return (worst[1], worst[2]) if worst else (None, None)

    def output_layouts(self) -> dict[str, Permutation]:
        """The candidate's cache outputs of a step searched, in the layouts their entries pair in."""
        return {f"cache.{cand_key}": layout for _, cand_key, layout in self.entry_pairs or []}


# The order `_judged` takes a step's four runs in: (role, width).
_FOUR = (("reference", 32), ("candidate", 32), ("reference", 64), ("candidate", 64))


def _judged(reference: np.ndarray, candidate: np.ndarray, reference64: np.ndarray, candidate64: np.ndarray) -> Judged:
    scale = magnitude(reference)
    error = relative_to(magnitude(candidate - reference), scale)
    rounding = relative_to(magnitude(reference - reference64), scale) + relative_to(
        magnitude(candidate - candidate64), scale
    )
    float64_error = relative_to(magnitude(candidate64 - reference64), scale)
    if error == 0:
        verdict: StepVerdict = "match"
    elif rounding_explains(float64_error, rounding, noise_floor("float32")):
        verdict = "noise"
    else:
        verdict = "divergent"
    return Judged(error, rounding, float64_error, verdict)


def _margin(logits: np.ndarray) -> float:
    """The smallest gap between the top-1 and top-2 logits over rows."""
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return float((top2[:, 1] - top2[:, 0]).min())


def _flip(number: int, reference: np.ndarray, candidate: np.ndarray, logits: Judged) -> Flip | None:
    """The flip at this step, in the first row whose top-1 tokens part (None: they agree)."""
    ref_top, cand_top = reference.argmax(-1), candidate.argmax(-1)
    for row in np.flatnonzero(ref_top != cand_top)[:1].tolist():
        gap = float(reference[row, ref_top[row]] - reference[row, cand_top[row]])
        return Flip(number, row, int(ref_top[row]), int(cand_top[row]), gap, logits.verdict != "divergent")
    return None
