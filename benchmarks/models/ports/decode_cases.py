"""One case of the `decode_port` form, drawn: `drawn(family, kind, seed)`.

As `cases.py` draws a `port` case: the seed draws the framework, a decoding port's choices (`DECODING_CHOICES`) and
names, then tries the sites of mutation `kind` in a seeded order until one gives a valid mutant. Its sites are at the
lines that run at decode steps only (`writer.Written.decode_lines`: the cache class, the positions, masks and tables,
the attention's cached path): a syntax-tree kind of `mutate.py` at those lines, or a decoding mistake of
`decoding.KINDS` as the writer registered it (a line rewritten, or two exchanged). A control (`none`, `bfloat16`)
plants nothing.

Every run decodes the prompt and `STEPS` tokens, teacher-forced on the reference's float32 tokens (`greedy.py`). A
mutant is valid when it runs every step, repeats itself bit for bit, and at some step its float64 logits differ from
the reference's by at least `VISIBLE` times the pair's float32 rounding (over the steps, the largest of the
reference's own float32 distance from its float64 logits and the correct port's float32 error): the first such step
is its `first_step`. Its `culprit_step` is the step at which the mutated code first runs with an effect: where the
mutant's float64 logits or cache first differ from the correct port's by more than that rounding (or take another
shape), 0 for a cache written wrong at the prefill though its logits part a step later. Where the mistake is
(`locate.py`): its line, and the modules that line runs in over the correct port's decoding.

Cached as `cases.py` caches (`<tempdir>/bisectr-ports/decode_cases/<code hash>/`), the port's source in the same
cache folder.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ports import decoding, greedy, locate, mutate, references, running
from ports.architectures import DECODING_ARCHS, DECODERS
from ports.cases import CACHE, CONTROLS, FRAMEWORKS, MAX_ATTEMPTS, PROBE_SEED, REDRAWS, VISIBLE, code_hash, port_file, \
    write_atomically
from ports.choices import DECODING_CHOICES, draw, draw_decoding_names
from ports.writer import Written, written

STEPS = 6  # tokens decoded after the prefill
KINDS = mutate.KINDS + decoding.KINDS


@dataclass(frozen=True)
class Rewrite:
    """One mistake at decode lines: its kind and the lines it rewrites, `(line, text)` (1-based, the text without its
    indentation), the first the line it is judged at."""

    kind: str
    lines: tuple[tuple[int, str], ...]

    @property
    def line(self) -> int:
        return self.lines[0][0]

    def applied(self, source: str) -> str:
        """`source` with the lines rewritten, each keeping its indentation."""
        lines = source.splitlines(keepends=True)
        for number, text in self.lines:
            old = lines[number - 1]
            lines[number - 1] = old[:len(old) - len(old.lstrip())] + text + "\n"
        return "".join(lines)

    def what(self, source: str) -> str:
        """What the mistake changes in `source`: each line before and after."""
        before = source.splitlines()
        return "; ".join(f"line {number}: {before[number - 1].strip()}  ->  {text}" for number, text in self.lines)


@dataclass
class Case:
    """A case as drawn: the decoding port (framework, choices, names, its file), the mistake, where it is, the steps it
    shows at, its validity."""

    family: str
    kind: str  # a kind of `KINDS`, or a control
    seed: int
    framework: str
    choices: dict[str, str]
    names: dict[str, object]
    port_file: str  # the source the candidate imports: the mutant's, or the correct port's for a control
    site: str | None = None  # what was changed
    source_line: str | None = None  # "<port file>:<line>" of the mistake
    modules: list[str] = field(default_factory=list)  # the modules the mistaken line runs in
    rounding: float | None = None  # relative: the pair's float32 rounding
    float64_error: float | None = None  # relative: the mutant's logits against the reference's, both in float64, at
    # the step they differ most
    first_step: int | None = None  # the first step whose logits show the mistake
    culprit_step: int | None = None  # the step at which the mutated code first runs with an effect
    attempts: int = 0  # sites tried in the last port drawn
    excluded: str | None = None  # why no mutant counts (no valid site)


def drawn(family: str, kind: str, seed: int) -> Case:
    """The case, from the cache where an earlier call drew it."""
    path = CACHE / "decode_cases" / code_hash() / f"{family}_{kind}_{seed}.json"
    if not path.exists():
        write_atomically(path, json.dumps(asdict(_draw(family, kind, seed)), indent=1))
    return Case(**json.loads(path.read_text()))


def kind_applies(family: str, kind: str) -> bool:
    """Have `family`'s decoding ports valid mutants of `kind` at all? Its probe case, drawn once per version of this
    code (cached), says."""
    return family in DECODERS and drawn(family, kind, PROBE_SEED).excluded is None


def sites(port: Written, kind: str) -> list[Rewrite]:
    """Every mistake of `kind` at `port`'s decode lines, in source order."""
    if kind in decoding.KINDS:
        return [Rewrite(kind, lines) for mistake, lines in port.mistakes if mistake == kind]
    return [Rewrite(kind, ((site.line, mutate.mutated(port.source, site).splitlines()[site.line - 1].strip()),))
            for site in mutate.sites(port.source, kind) if site.line in port.decode_lines and not site.in_converter]


def _draw(family: str, kind: str, seed: int) -> Case:
    """The case: a decoding port drawn, and a valid site of `kind` in it; a port with none is drawn again."""
    rng = random.Random(f"decode_port:{family}:{kind}:{seed}")
    for _ in range(REDRAWS):
        framework = rng.choice(FRAMEWORKS)
        choices = draw(DECODING_ARCHS[family], framework, rng, DECODING_CHOICES)
        names = draw_decoding_names(rng)
        port = written(family, framework, choices, names)
        case = Case(family, kind, seed, framework, choices, names, str(port_file(family, port.source)))
        if kind in CONTROLS:
            return case
        candidates = sites(port, kind)
        rng.shuffle(candidates)
        if candidates and _plant(case, DecodingPair(family, framework, port.source, case.port_file), candidates):
            return case
    case.excluded = f"no valid mutant in {REDRAWS} ports drawn"
    return case


def _plant(case: Case, pair: "DecodingPair", candidates: list[Rewrite]) -> bool:
    """Try the sites in turn; fill `case` with the first valid mutant's (True), or say there is none."""
    case.rounding = pair.rounding
    for site in candidates[:MAX_ATTEMPTS]:
        case.attempts += 1
        mutant = site.applied(pair.source)
        steps = pair.judged(mutant)
        if steps is None or steps.first_step is None:
            continue
        mutant_file = port_file(case.family, mutant)
        case.port_file, case.site = str(mutant_file), site.what(pair.source)
        case.source_line = f"{mutant_file}:{site.line}"
        case.float64_error, case.first_step, case.culprit_step = (steps.float64_error, steps.first_step,
                                                                  steps.culprit_step)
        case.modules = sorted(pair.modules_by_line().get(site.line, ()))
        return True
    return False


@dataclass
class Judged:
    """A mutant's steps against the pair: its largest float64 error, the first step that shows it, the first step
    its code has an effect at."""

    float64_error: float
    first_step: int | None
    culprit_step: int | None


class DecodingPair:
    """A decoder's reference and a decoding port of it: the reference's steps (float32, its tokens fed to every run,
    and float64), the correct port's, the pair's rounding, and each mutant's steps judged."""

    def __init__(self, family: str, framework: str, source: str, filename: str):
        self.framework, self.source, self.filename = framework, source, filename
        reference, prompt = references.build_for_decoding(family)
        self.prompt = {name: values.numpy() for name, values in prompt.items()}
        self.hf = references.state_dict(reference)
        reference32 = greedy.decoded(reference, "torch", self.prompt, STEPS)
        self.fed = reference32.tokens()[:STEPS]
        with running.float64_defaults("torch"):
            reference64, _ = running.in_float64(reference, {}, "torch")
            self.reference64 = greedy.decoded(reference64, "torch", self.prompt, STEPS, self.fed)
        correct32, self.correct64 = self.decoded(source), self.decoded(source, float64=True)
        self.rounding = max(max(running.relative(ref32, ref64), running.relative(port32, ref32))
                            for ref32, ref64, port32 in zip(reference32.logits, self.reference64.logits,
                                                            correct32.logits))

    def decoded(self, source: str, float64: bool = False) -> greedy.Decoded:
        """The port of `source` decoding the pair's prompt and tokens (with `float64`, a float64 copy of it)."""
        port = running.from_source(source, self.filename)
        model = running.built(port, port.convert(self.hf))
        if not float64:
            return greedy.decoded(model, self.framework, self.prompt, STEPS, self.fed)
        with running.float64_defaults(self.framework):
            model64, _ = running.in_float64(model, {}, self.framework)
            return greedy.decoded(model64, self.framework, self.prompt, STEPS, self.fed)

    def judged(self, mutant_source: str) -> Judged | None:
        """The mutant's steps judged, or None where it does not run every step, gives logits of another shape than
        the port's, or does not repeat itself."""
        try:
            first, again = self.decoded(mutant_source), self.decoded(mutant_source)
            if not all(a.shape == b.shape == c.shape and np.array_equal(a, b)
                       for a, b, c in zip(first.logits, again.logits, self.correct64.logits)):
                return None
            mutant64 = self.decoded(mutant_source, float64=True)
        except Exception:  # a mutant that does not run is no mutant
            return None
        errors = [running.relative(mine, theirs) for mine, theirs in zip(mutant64.logits, self.reference64.logits)]
        effects = [max([running.relative(mine, correct)] + _cache_differences(cache, correct_cache))
                   for mine, correct, cache, correct_cache in zip(mutant64.logits, self.correct64.logits,
                                                                  mutant64.caches, self.correct64.caches)]
        return Judged(max(errors), _first(errors, VISIBLE * self.rounding), _first(effects, self.rounding))

    def modules_by_line(self) -> dict[int, set[str]]:
        """The correct port decoding under `locate.modules_by_line`: line -> the modules it ran in, at any step."""
        port = running.imported(Path(self.filename))
        model = running.built(port, port.convert(self.hf))
        return locate.modules_by_line(
            model, self.framework, lambda: greedy.decoded(model, self.framework, self.prompt, STEPS, self.fed),
            self.filename)


def _cache_differences(cache: list[np.ndarray], correct: list[np.ndarray]) -> list[float]:
    """Each cache entry's relative difference from the correct port's (infinite for one of another shape or count)."""
    if len(cache) != len(correct):
        return [float("inf")]
    return [running.relative(mine, theirs) for mine, theirs in zip(cache, correct)]


def _first(values: list[float], threshold: float) -> int | None:
    """The first step whose value reaches `threshold`."""
    return next((step for step, value in enumerate(values) if value >= threshold), None)
