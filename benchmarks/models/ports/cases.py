"""One case of the `port` form, drawn: `drawn(family, kind, seed)`.

The seed draws the framework, the structural choices and the port's names, then tries the sites of the mutation
`kind` (`mutate.py`) in a seeded order until one gives a valid mutant: it runs, repeats itself bit for bit, and with
both sides in float64 its outputs differ from the reference's by at least `VISIBLE` times the pair's float32
rounding (the larger of the reference's own float32 distance from its float64 outputs and the correct port's
float32 error). A control (`none`, `bfloat16`) plants nothing. Where the mistake is (`locate.py`) is recorded with
it: for a mistake in the forward, the line and the modules it runs in; in the converter, the leaves it changes.

The port's source (the mutant's, for a mutant) is written to a cache folder outside the repository,
`<tempdir>/bisectr-ports/<hash of the source>/<family>_port.py`, atomically and once, so that bisectr names its
lines; the case itself is cached beside, under a hash of this package's code, so that the harness and the model
file draw it once.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ports import locate, mutate, references, running
from ports.architectures import ARCHS
from ports.choices import draw, draw_names
from ports.writer import write

FRAMEWORKS = ("torch", "paddle")
CONTROLS = ("none", "bfloat16")
VISIBLE = 10.0  # a mutant's float64 error must be this many times the pair's float32 rounding (as mutants.py's)
MAX_ATTEMPTS = 200  # sites of one port tried before another port is drawn
REDRAWS = 5  # ports drawn before the case is given up as having no valid mutant
PROBE_SEED = -1  # the case `kind_applies` draws
CACHE = Path(tempfile.gettempdir()) / "bisectr-ports"


@dataclass
class Case:
    """A case as drawn: the port (framework, choices, names, its file), the mistake and where it is, its validity."""

    family: str
    kind: str  # a mutation kind of `mutate.KINDS`, or a control
    seed: int
    framework: str
    choices: dict[str, str]
    names: dict[str, object]
    port_file: str  # the source the candidate imports: the mutant's, or the correct port's for a control
    site: str | None = None  # what was changed, one line
    source_line: str | None = None  # "<port file>:<line>" of the mistake
    in_converter: bool = False
    modules: list[str] = field(default_factory=list)  # the modules the mistaken line runs in, or the changed leaves'
    leaves: list[str] = field(default_factory=list)  # the converted leaves the mistake changes
    rounding: float | None = None  # relative: the pair's float32 rounding
    float64_error: float | None = None  # relative: the mutant against the reference, both in float64
    attempts: int = 0  # sites tried in the last port drawn
    excluded: str | None = None  # why no mutant counts (no valid site)


def drawn(family: str, kind: str, seed: int) -> Case:
    """The case, from the cache where an earlier call drew it."""
    path = CACHE / "cases" / code_hash() / f"{family}_{kind}_{seed}.json"
    if not path.exists():
        write_atomically(path, json.dumps(asdict(_draw(family, kind, seed)), indent=1))
    return Case(**json.loads(path.read_text()))


def _draw(family: str, kind: str, seed: int) -> Case:
    """The case: a port drawn, and a valid site of `kind` in it; a port with none is drawn again (`REDRAWS`)."""
    rng = random.Random(f"port:{family}:{kind}:{seed}")
    reference = references.build(family)
    for _ in range(REDRAWS):
        framework = rng.choice(FRAMEWORKS)
        choices = draw(ARCHS[family], framework, rng)
        names = draw_names(rng)
        source = write(family, framework, choices, names)
        case = Case(family, kind, seed, framework, choices, names, str(port_file(family, source)))
        if kind in CONTROLS:
            return case
        candidates = mutate.sites(source, kind)
        rng.shuffle(candidates)
        if candidates and _plant(case, Pair(reference, framework, source, case.port_file), candidates):
            return case
    case.excluded = f"no valid mutant in {REDRAWS} ports drawn"
    return case


def _plant(case: Case, pair: "Pair", candidates: list[mutate.Site]) -> bool:
    """Try the sites in turn; fill `case` with the first valid mutant's (True), or say there is none."""
    case.rounding = pair.rounding
    for site in candidates[:MAX_ATTEMPTS]:
        case.attempts += 1
        mutant = mutate.mutated(pair.source, site)
        float64_error = pair.float64_error(mutant)
        if float64_error is None or float64_error < VISIBLE * pair.rounding:
            continue
        mutant_file = port_file(case.family, mutant)
        case.port_file, case.float64_error, case.site = str(mutant_file), float64_error, site.what(pair.source)
        case.source_line, case.in_converter = f"{mutant_file}:{site.line}", site.in_converter
        if site.in_converter:
            weights = running.from_source(mutant, str(mutant_file)).convert(pair.hf)
            case.leaves = locate.changed_leaves(pair.weights, weights)
            case.modules = locate.owners(case.leaves)
        else:
            case.modules = sorted(pair.modules_by_line().get(site.line, ()))
        return True
    return False


def kind_applies(family: str, kind: str) -> bool:
    """Has `family` valid mutants of `kind` at all (ResNet has no slice, and no axis a mistake can move and still
    run)? Its probe case, drawn once per version of this code (cached), says."""
    return drawn(family, kind, PROBE_SEED).excluded is None


class Pair:
    """The reference and a port of it in one framework: the reference's outputs (float32, float64), its weights
    converted, and each mutant's float64 error."""

    def __init__(self, reference: tuple, framework: str, source: str, filename: str):
        self.framework, self.filename, self.source = framework, filename, source
        self.reference, inputs = reference
        self.hf = references.state_dict(self.reference)
        self.inputs = running.framework_inputs(inputs, framework)
        self.reference32 = running.reference_output(self.reference, inputs)
        self.reference64 = running.reference_output(*_reference_in_float64(self.reference, inputs))
        self.port = running.from_source(source, filename)
        self.weights = self.port.convert(self.hf)
        correct = running.outputs(running.built(self.port, self.weights), self.inputs, framework)
        self.shapes = {name: values.shape for name, values in correct.items()}
        self.rounding = max(running.relative(self.reference32, self.reference64),
                            running.relative(next(iter(correct.values())), self.reference32))

    def float64_error(self, mutant_source: str) -> float | None:
        """The mutant's float64 error against the reference's, or None where it does not run, gives outputs of
        other shapes than the port's, or does not repeat itself."""
        try:
            port = running.from_source(mutant_source, self.filename)
            model = running.built(port, port.convert(self.hf))
            first = running.outputs(model, self.inputs, self.framework)
            again = running.outputs(model, self.inputs, self.framework)
            if {name: values.shape for name, values in first.items()} != self.shapes or not all(
                    np.array_equal(first[name], again[name]) for name in first):
                return None
            with running.float64_defaults(self.framework):
                model64, inputs64 = running.in_float64(model, self.inputs, self.framework)
                return running.relative(running.first_output(model64, inputs64, self.framework), self.reference64)
        except Exception:  # a mutant that does not run is no mutant
            return None

    def modules_by_line(self) -> dict[int, set[str]]:
        """The correct port run under `locate.modules_by_line`: line -> the modules it ran in."""
        port = running.imported(Path(self.filename))
        model = running.built(port, port.convert(self.hf))
        return locate.modules_by_line(model, self.framework, lambda: model(**self.inputs), self.filename)


def _reference_in_float64(model, inputs: dict):
    import copy

    import torch

    return copy.deepcopy(model).double(), {k: v.double() if torch.is_tensor(v) and torch.is_floating_point(v) else v
                                           for k, v in inputs.items()}


def port_file(family: str, source: str) -> Path:
    """The port's source in the cache, written there once."""
    path = CACHE / hashlib.sha256(source.encode()).hexdigest()[:16] / f"{family}_port.py"
    if not path.exists():
        write_atomically(path, source)
    return path


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(scratch, path)


def code_hash() -> str:
    """A hash of this package's code: a case drawn by other code is drawn again."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
