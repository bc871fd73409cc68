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
   caches are compared entry by entry (`EntryPair`), each pair found at the prefill: the entries in order, or,
   where one side stacks several tensors in one (k and v in [2, batch, heads, seq, dim]), each of its parts
   along the first axis with one of the other side's entries; each candidate entry in the layout that brings it
   closest to the reference's (its axes permuted: [batch, heads, seq, dim] against [batch, seq, heads, dim];
   then each head's dimensions reordered where each candidate column is one reference column, as a rotary
   convention that pairs them otherwise keeps them), over the positions both keep where one side keeps fewer
   along one axis (a sliding window that evicts). Entries that pair no way are not compared (the note says so).
3. **The step searched** is the first whose logits or cache rounding does not explain: a cache written wrong
   at an earlier step is searched at the step that wrote it (`first_divergent_step`, the first step whose
   logits differ, may come later). That step runs again as a forward pass of its own (`OpenStep`): its inputs
   the step's tokens and the cache the steps before it wrote (as leaves), its outputs the logits and the cache
   it leaves, and `Run.bisect` finds and confirms the culprit there. Its outputs pair as `pair_outputs` pairs
   outputs: the logits, and the cache entries that pair whole in a permutation of axes at that step; the others
   (parts, reordered dimensions, windows of other lengths) are compared by the steps alone, and a cache that
   differs only there is searched at the first step whose logits or a cache entry the search compares differ.
"""

from __future__ import annotations

import itertools
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
from .measure.runrecord import LAYOUT_CONFIRMED, MAX_OUTPUT_DIMS
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
    result = GenerationResult("noise", tokens, rows, first_flip=decoding.first_flip)
    divergent = [row.step for row in rows if row.verdict == "divergent"]
    result.first_divergent_step = next((row.step for row in rows if row.logits.verdict == "divergent"), None)
    if not divergent:
        exact = all(row.logits.error == 0 and (row.cache is None or row.cache.error == 0) for row in rows)
        result.verdict = "match" if exact else "noise"
        result.note = "; ".join(decoding.notes)
        return result
    result.verdict, result.culprit_step = "divergent", decoding.step_to_search(rows)
    result.note = "; ".join(decoding.notes)
    say(f"searching inside step {result.culprit_step}")
    for role in SIDES:
        runners[role].run(OpenStep(result.culprit_step, decoding.fed[: result.culprit_step]))
    run_dir = temporary_run_dir(f"{model_file.stem}-step{result.culprit_step}")
    paired, layouts = decoding.step_outputs(result.culprit_step)
    result.run = record_run(traced, runners, pins, run_dir, model_file, output_layouts=layouts, paired_outputs=paired)
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
        self.entry_pairs: list[EntryPair] = []  # the cache entries compared, paired at the prefill
        self.first_flip: Flip | None = None
        self.notes: list[str] = []  # what was not compared, and how the caches differ in kind
        # By step: the entry pairs the search inside that step compares as its outputs (whole entries of the same
        # size), and whether the step's logits or one of those differ beyond rounding.
        self.searchable: list[list[EntryPair]] = []
        self.searchable_divergent: list[bool] = []
        self.window_noted = False

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
            self.entry_pairs, notes = paired_entries(ref.cache, cand.cache)
            self.notes += notes
            self._note_narrower_cache(ref.cache_dtypes, cand.cache_dtypes)
        logits = _judged(*(outputs[key].logits for key in _FOUR))
        cache, entry = self._cache_judged(outputs, logits)
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

    def _note_narrower_cache(self, reference: dict[str, str], candidate: dict[str, str]) -> None:
        """Say where the candidate keeps its cache in a coarser dtype than the reference: its rounding is
        rounding by the float64 rule (as any cast down is), the cache error of every step its size."""
        narrower = {
            pair.candidate: (candidate[pair.candidate], reference[pair.reference])
            for pair in self.entry_pairs
            if coarsest_dtype([candidate[pair.candidate], reference[pair.reference]]) == candidate[pair.candidate]
            and candidate[pair.candidate] != reference[pair.reference]
        }
        if narrower:
            key, (cand_dtype, ref_dtype) = next(iter(narrower.items()))
            self.notes.append(
                f"the candidate keeps {len(narrower)} of its {len(candidate)} cache entries in {cand_dtype} (the "
                f"reference in {ref_dtype}; {key} first): their rounding is counted as rounding, and the cache error "
                "of each step is its size"
            )

    def _cache_judged(
        self, outputs: dict[tuple[str, int], StepOutputs], logits: Judged
    ) -> tuple[Judged | None, str | None]:
        """The cache entry rounding explains least (by its float64 difference against what rounding allows), and
        its name; kept for the step: the entries its search would compare, and whether they or `logits` differ."""
        worst: tuple[float, Judged, str] | None = None
        searchable, divergent = [], logits.verdict == "divergent"
        for pair in self.entry_pairs:
            judged = _judged(*self._aligned(pair, outputs, 32), *self._aligned(pair, outputs, 64))
            if pair.whole and pair.same_size(outputs["reference", 32].cache, outputs["candidate", 32].cache):
                searchable.append(pair)
                divergent = divergent or judged.verdict == "divergent"
            # ordered by the float64 rule itself, so that the entry kept is divergent where any entry is
            excess = relative_to(judged.float64_error, rounding_allowance(judged.rounding, noise_floor("float32")))
            if worst is None or excess > worst[0]:
                worst = (excess, judged, pair.name)
        self.searchable.append(searchable)
        self.searchable_divergent.append(divergent)
        return (worst[1], worst[2]) if worst else (None, None)

    def _aligned(
        self, pair: EntryPair, outputs: dict[tuple[str, int], StepOutputs], width: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """`pair.aligned` in the caches of the runs at `width` bits, the model file refused where the entries no
        longer pair; the first time one side keeps fewer positions than the other, the note says so."""
        reference, candidate = outputs["reference", width].cache, outputs["candidate", width].cache
        aligned = pair.aligned(reference, candidate)
        if aligned is None:
            raise ModelFileError(
                f"{self.model_file}: {pair.described(reference, candidate)} no longer pair (they did at the prefill)"
            )
        if not self.window_noted and not pair.same_size(reference, candidate):
            self.window_noted = True
            self.notes.append(
                f"{pair.described(reference, candidate)} keep different numbers of positions (a sliding window): "
                "such entries are compared over the last positions both keep"
            )
        return aligned

    def step_to_search(self, rows: list[StepRow]) -> int:
        """The first step whose logits or a cache entry the search inside it compares differ beyond rounding,
        else the first divergent step; the note says where an earlier step's cache differs where that search
        does not compare it."""
        first = next(row.step for row in rows if row.verdict == "divergent")
        searched = next((step for step, divergent in enumerate(self.searchable_divergent) if divergent), first)
        if not self.searchable_divergent[searched]:
            self.notes.append(
                f"step {first}'s cache differs in {rows[first].cache_entry}, which the search inside a step does not "
                "compare as an output, and at no step do the logits or an entry it compares differ: searched there"
            )
        elif searched != first:
            self.notes.append(
                f"step {first}'s cache differs in {rows[first].cache_entry}, which the search inside a step does not "
                f"compare as an output: searched at step {searched}, the first whose logits or a cache entry it "
                "compares differ"
            )
        return searched

    def step_outputs(self, number: int) -> tuple[dict[str, str], dict[str, Permutation]]:
        """The outputs the search inside step `number` pairs (reference key -> candidate key: the logits and the
        cache entries that pair whole there), and the candidate's cache outputs' layouts."""
        pairs = self.searchable[number]
        paired = {"logits": "logits"} | {f"cache.{pair.reference}": f"cache.{pair.candidate}" for pair in pairs}
        return paired, {f"cache.{pair.candidate}": pair.layout for pair in pairs}


@dataclass(frozen=True)
class EntryPair:
    """A candidate cache entry, or one part of it, paired with the reference's: the candidate's values laid out as
    the reference's (its squeezed axes permuted, then its last axis's columns reordered), compared over the
    positions both keep where one side keeps fewer along one axis."""

    reference: str  # the reference's entry, by where it sits in its cache
    candidate: str
    reference_part: int | None = None  # the index along the first axis of an entry stacking several (k and v)
    candidate_part: int | None = None
    layout: Permutation = None  # the candidate's squeezed axes in the reference's order
    columns: tuple[int, ...] | None = None  # then the candidate's column holding each of the reference's last axis

    @property
    def name(self) -> str:
        """The candidate's entry, and its part, as the step rows name it."""
        return _part_name(self.candidate, self.candidate_part)

    @property
    def reference_name(self) -> str:
        return _part_name(self.reference, self.reference_part)

    @property
    def stacked(self) -> bool:
        """Is one side's entry a part of one stacking several?"""
        return self.reference_part is not None or self.candidate_part is not None

    @property
    def whole(self) -> bool:
        """Do whole entries pair, in a permutation of their axes (as `pair_outputs` pairs a step's outputs)?"""
        return not self.stacked and self.columns is None

    def values(self, cache: dict[str, np.ndarray], role: str) -> np.ndarray:
        """The `role` side's entry, or part, in one step's `cache`."""
        if role == "reference":
            return _part(cache[self.reference], self.reference_part)
        return _part(cache[self.candidate], self.candidate_part)

    def described(self, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> str:
        """Both entries, and their shapes in one step's caches."""
        return (
            f"the candidate's cache entry {self.name} {list(self.values(candidate, 'candidate').shape)} and the "
            f"reference's {self.reference_name} {list(self.values(reference, 'reference').shape)}"
        )

    def same_size(self, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> bool:
        """Do both sides keep as many values in one step's caches (the same positions, where one slides)?"""
        return self.values(candidate, "candidate").size == self.values(reference, "reference").size

    def aligned(
        self, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The pair's values in one step's caches, squeezed, the candidate's in the reference's layout, over the
        positions both keep (None: they no longer pair so)."""
        ref_values = np.squeeze(self.values(reference, "reference"))
        laid_out = np.squeeze(self.values(candidate, "candidate"))
        if self.layout is not None:
            if laid_out.ndim != len(self.layout):
                return None
            laid_out = np.transpose(laid_out, self.layout)
        if self.columns is not None:
            if laid_out.shape[-1] != len(self.columns):
                return None
            laid_out = laid_out[..., list(self.columns)]
        return _over_common_positions(ref_values, laid_out)


def paired_entries(
    reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]
) -> tuple[list[EntryPair], list[str]]:
    """The pairs of the sides' cache entries at the prefill, each in the layout that brings the candidate's values
    closest to the reference's (`entry_layout`), and the notes: the entries that pair no way, and how the others
    pair where not whole, entry for entry."""
    order = _pairing_order(reference, candidate)
    if order is None:
        note = (
            f"the caches are not compared: the reference's holds {len(reference)} tensors, the candidate's "
            f"{len(candidate)}, and neither stacks the other's along a first axis"
        )
        return [], [note]
    pairs, unpaired = [], []
    for (ref_key, ref_part), (cand_key, cand_part) in order:
        pair = EntryPair(ref_key, cand_key, ref_part, cand_part)
        layout = entry_layout(pair.values(reference, "reference"), pair.values(candidate, "candidate"))
        if layout is None:
            unpaired.append(pair)
        else:
            pairs.append(EntryPair(ref_key, cand_key, ref_part, cand_part, *layout))
    return pairs, _pairing_notes(pairs, unpaired, reference, candidate)


def _pairing_order(
    reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]
) -> list[tuple[tuple[str, int | None], tuple[str, int | None]]] | None:
    """The sides' cache entries paired in order, each `(entry, part)`: the entries themselves where both hold as
    many; else, where each entry of the side holding fewer stacks as many of the other's along its first axis, its
    parts along it (part None: the whole entry); None otherwise."""
    ref_items, cand_items = [(key, None) for key in reference], [(key, None) for key in candidate]
    if len(reference) == len(candidate):
        return list(zip(ref_items, cand_items))
    fewer, more = (reference, candidate) if len(reference) < len(candidate) else (candidate, reference)
    stacks = {values.shape[0] if values.ndim > 1 else None for values in fewer.values()}
    if len(stacks) != 1 or None in stacks or len(fewer) * stacks.pop() != len(more):
        return None
    parts = [(key, part) for key, values in fewer.items() for part in range(values.shape[0])]
    return list(zip(parts, cand_items)) if fewer is reference else list(zip(ref_items, parts))


def _pairing_notes(
    pairs: list[EntryPair],
    unpaired: list[EntryPair],
    reference: dict[str, np.ndarray],
    candidate: dict[str, np.ndarray],
) -> list[str]:
    """What the note says of the entries paired: those not compared, stacked entries, dimensions reordered."""
    notes = []
    if unpaired:
        compared = "the caches are not compared" if not pairs else f"{len(unpaired)} cache entries are not compared"
        notes.append(f"{compared}: {unpaired[0].described(reference, candidate)} have no layout of one another")
    stacked = next((pair for pair in pairs if pair.stacked), None)
    if stacked is not None:
        role = "candidate" if stacked.candidate_part is not None else "reference"
        key = stacked.candidate if role == "candidate" else stacked.reference
        shape = list((candidate if role == "candidate" else reference)[key].shape)
        notes.append(
            f"the {role}'s cache stacks {shape[0]} tensors in each entry ({key} {shape} first): each part pairs "
            "with an entry of the other side's, which the search inside a step does not compare as outputs"
        )
    reordered = [pair for pair in pairs if pair.columns is not None]
    if reordered:
        notes.append(
            f"{len(reordered)} of the candidate's cache entries hold each head's dimensions in another order than "
            f"the reference's ({reordered[0].name} first, as a rotary convention pairing them otherwise does): "
            "compared in the reference's order, which the search inside a step does not compare as outputs"
        )
    return notes


def _part(values: np.ndarray, part: int | None) -> np.ndarray:
    return values if part is None else values[part]


def _part_name(key: str, part: int | None) -> str:
    return key if part is None else f"{key}[{part}]"


def entry_layout(reference: np.ndarray, candidate: np.ndarray) -> tuple[Permutation, tuple[int, ...] | None] | None:
    """The layout of a candidate cache entry's values (`EntryPair.layout`, `.columns`) closest to the reference's
    at the prefill: a permutation of its squeezed axes giving the reference's squeezed shape, but for one axis
    along which one side keeps fewer positions (compared over the last both keep, taken where that brings them
    within `LAYOUT_CONFIRMED`: a window, not another number of heads); then, where that brings them closer, its
    last axis's columns reordered, each candidate column one reference column. None: no such layout."""
    ref_values, cand_values = np.squeeze(reference), np.squeeze(candidate)
    if ref_values.ndim != cand_values.ndim or cand_values.ndim > MAX_OUTPUT_DIMS:
        return None
    tried: list[tuple[float, Permutation, tuple[int, ...] | None]] = []
    for layout in itertools.permutations(range(cand_values.ndim)):
        laid_out = np.transpose(cand_values, layout)
        common = _over_common_positions(ref_values, laid_out)
        if common is None:
            continue
        error, columns = _relative_error(*common), _column_order(*common)
        if columns is not None:
            reordered = _relative_error(common[0], common[1][..., list(columns)])
            error, columns = (reordered, columns) if reordered < error else (error, None)
        if laid_out.shape == ref_values.shape or error <= LAYOUT_CONFIRMED:
            tried.append((error, layout, columns))
    if not tried:
        return None
    _, layout, columns = min(tried, key=lambda option: option[0])
    return layout, columns


def _over_common_positions(reference: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Both as they are where their shapes agree; where their lengths differ along one axis but the last (a sliding
    window's), the last positions both keep along it; None where their shapes differ otherwise."""
    if reference.ndim != candidate.ndim:
        return None
    differ = [axis for axis, (r, c) in enumerate(zip(reference.shape, candidate.shape)) if r != c]
    if not differ:
        return reference, candidate
    if len(differ) > 1 or differ[0] == reference.ndim - 1:
        return None
    axis = differ[0]
    kept = (slice(None),) * axis + (slice(-min(reference.shape[axis], candidate.shape[axis]), None),)
    return reference[kept], candidate[kept]


def _column_order(reference: np.ndarray, candidate: np.ndarray) -> tuple[int, ...] | None:
    """The candidate's column (along the last axis) nearest each of the reference's, where each reference column
    has a column of its own and they are not in the same order already; None otherwise."""
    width = reference.shape[-1]
    ref_columns, cand_columns = reference.reshape(-1, width), candidate.reshape(-1, width)
    distances = (ref_columns**2).sum(0)[:, None] + (cand_columns**2).sum(0)[None, :] - 2 * ref_columns.T @ cand_columns
    order = distances.argmin(axis=1)
    if len(set(order.tolist())) != width or np.array_equal(order, np.arange(width)):
        return None
    return tuple(order.tolist())


def _relative_error(reference: np.ndarray, candidate: np.ndarray) -> float:
    return relative_to(magnitude(candidate - reference), magnitude(reference))


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
