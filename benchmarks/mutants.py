"""The seeded-bug benchmark: bugs planted at random sites of many model families, and whether bisectr names them.

    python benchmarks/mutants.py [--sites N] [--seed S] [--families A,B] [--operators X,Y]
                                 [--forms copy,sdpa,kv_widened] [--sample N] [--workers N] [--json PATH]
                                 [--only FAMILY:OPERATOR:SEED[:FORM]] [--device cuda] [--paddle-python PATH]

Each case is a Hugging Face model from a tiny random config (`benchmarks/models/families.py`: 15 families,
decoders, encoders, a vision transformer and Mamba) against a copy of it through a converter (form `copy`:
the same op graph), against the same class with fused attention (form `sdpa`: another op graph) or, where the
family shares key-value heads, against the class with a key-value head per query head (form `kv_widened`: the
converter widens k and v, their weights of another shape), with one bug planted by an operator of
`benchmarks/models/mutations.py` at a site drawn at random (`--sites` draws per family and operator), or
with nothing planted (the controls: the copy as it is and the copy in bfloat16).

A mutant counts only once checked: its candidate repeats itself bit for bit, and with both sides in float64 its
outputs differ from the reference's by at least 10x the float32 rounding of the pair (the reference's own
float32 distance from its float64 outputs, or the unmutated copy's float32 error if larger; where an op has
no float64 kernel, float32 errors against float32's epsilon): a mutation that float32 rounding would hide is
no mutant. Every checked mutant then counts: one bisectr cannot localize is
a miss, never an exclusion.

A mutant is right when `bisect` says `divergent`, its culprit is at the planted site (the changed parameter as
the culprit leaf, or an op of the changed module) and the confirmation holds; a mutant of a `repeat` operator
(a candidate that does not repeat itself: dropout left on, unseeded noise, memory read uninitialised, a
shuffle) when it says `nondeterministic` at an op of the changed module with the operator's cause; a control
is right when it is `noise` or `match`. Printed: right by family and by operator, `noise` on any mutant,
`divergent` on any control, and re-runs against ceil(log2 ops) + 3. Exit status 1 when a case is wrong.

`--sample N` runs a stratified sample of N cases (every operator and every family at least once, with the
controls): what CI runs. `--only` runs one case and prints its row (`bisectr bisect
benchmarks/models/mutant_pair.py` with `BISECTR_MUTANT` set to the case prints bisectr's report of it).
`--paddle-python PATH` (an interpreter of an environment with PaddleFormers, which cannot import transformers'
torch models) adds the form `paddle`: the family's PaddleFormers port (Llama; Qwen2, whose q/k/v and gate/up it
fuses) loaded from the copy's checkpoint with a converter's mistake (`weight` operators) in it
(`benchmarks/models/paddle_ports.py`); its `bfloat16` control is that checkpoint rounded to bfloat16.
`--forms sp` shards the candidate as `tp` with sequence parallel (the hidden states split along the sequence
between the projections), with the converter's mistakes. `--forms decode` runs both sides of the causal
LMs inside a port's greedy decoding loop with a KV cache (`benchmarks/models/decoding.py`), the candidate's
loop with a `decode` operator's mistake in it.
`--forms port` (not a default form) runs each family of `benchmarks/models/ports/` (twelve: the decoders Llama,
Qwen2, Mixtral, Gemma-2, GPT-NeoX, GPT-2, Bloom and Falcon, BERT, ViT, T5 and ResNet) against a port written by
hand's rules (`ports/writer.py`): torch or paddle, its own module tree and names, fusions, rotary convention, masks,
norms and attention drawn from the case's seed, loaded through its own converter. Its operators are of kind `port`,
the mutation kinds of `ports/mutate.py`, planted in the port's forward code or its converter at a site drawn by the
seed among those that give a valid mutant (`ports/cases.py`, which checks validity as `check` does); such a
mutant is right when its culprit's candidate source is the mutated line, its leaf one the mistake changes, or its
module one the mutated line runs in (or under it, the root aside). Its rows carry the framework and the choices, and
the table adds the share right by structural choice. Its controls are the correct port and its converter's weights
rounded to bfloat16, one per seed drawn.
`--forms decode_port` (not a default form) decodes each decoder of the ports package (Llama, Qwen2, Mixtral,
Gemma-2 with a sliding window of 8, GPT-NeoX, GPT-2, Bloom, Falcon) with `bisectr generate` (`bisectr.generate`, the
prompt and `DECODE_STEPS` tokens): the reference is the Hugging Face causal LM with its own `DynamicCache`, the
candidate the port extended with its own cache class and a forward for cached decoding (`ports/decoding.py`), its
choices drawn too: the cache's layout, positions from the cache's length or from `position_ids`, the step's mask
offset by the cache's length or the attention_mask's width, a sliding layer keeping `window - 1` or `window`
positions. Its operators are the `port` kinds at the lines that run at decode steps and the `decode_port` kinds
(`mutations.py`), planted at a site drawn among those giving a valid mutant (`ports/decode_cases.py`: it runs every
step, repeats itself, and its float64 logits at some step differ from the reference's by at least 10x the pair's
float32 rounding). Such a mutant is right when the verdict is `divergent`, `first_divergent_step` is the first step
its logits show it, the culprit is confirmed and at its site (as the port form judges), and `culprit_step` is the
step at which the mutated code first runs with an effect (0 for a cache written wrong at the prefill). The table
adds the shares with the first divergent step right and with the culprit's step right. Its controls are the port's:
noise or match at every step; its `cache_bfloat16` kind (the cache made in bfloat16) is judged as a control too: by
bisectr's contract a cache kept in a coarser dtype is rounding, noise, not a mistake (`ROUNDING_KINDS`).
`--device cuda` runs every candidate on the GPU (the reference stays on the CPU): the controls are then CPU against
GPU rounding.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

MODELS = Path(__file__).resolve().parent / "models"
sys.path.insert(0, str(MODELS))
MODEL_FILE = MODELS / "mutant_pair.py"
PORT_MODEL_FILE = MODELS / "ports" / "pair.py"
DECODE_PORT_MODEL_FILE = MODELS / "ports" / "decode_pair.py"
PORT_FORMS = ("port", "decode_port")  # the forms whose candidates are hand-style ports (`ports/`)
CASE_TIMEOUT = 600  # seconds for one case
DEFAULT_FORMS = "copy,sdpa,kv_widened"
# The kinds a form plants that bisectr's contract counts as rounding, judged as controls: noise or match expected.
ROUNDING_KINDS = {"decode_port": ("cache_bfloat16",)}
PADDLE_PYTHON = "BISECTR_PADDLE_PYTHON"  # the interpreter of an environment with PaddleFormers (form `paddle`)
# A mutant's float64 error must be this many times the pair's float32 rounding (the port form's cases share it).
from ports.cases import VISIBLE  # noqa: E402
from ports.decode_cases import STEPS as DECODE_STEPS  # noqa: E402  (the tokens the decode_port form decodes)


@dataclass(frozen=True)
class Case:
    family: str
    operator: str  # an operator of mutations.OPERATORS, or a control (mutant_pair.CONTROLS)
    seed: int
    form: str = "copy"  # how the candidate is built (mutant_pair.FORMS)

    @property
    def key(self) -> str:
        return f"{self.family}:{self.operator}:{self.seed}:{self.form}"

    @classmethod
    def parse(cls, key: str) -> "Case":
        family, operator, seed, *form = key.split(":")
        return cls(family, operator, int(seed), *form)

    @property
    def is_control(self) -> bool:
        """Nothing planted, or what the form plants is rounding (`ROUNDING_KINDS`)."""
        from mutant_pair import CONTROLS

        return self.operator in CONTROLS or self.operator in ROUNDING_KINDS.get(self.form, ())


@dataclass
class Row:
    case: str
    family: str
    operator: str
    form: str
    control: bool
    site: str | None = None  # what was planted
    expected_module: str | None = None
    expected_leaf: str | None = None
    expected_aten: str | None = None
    expected_cause: str | None = None  # a `repeat` operator's: the candidate does not repeat itself, and why
    rounding: float | None = None  # relative: the pair's float32 rounding
    float64_error: float | None = None  # relative: the mutant's outputs against the reference's, both in float64
    excluded: str | None = None  # why the case is no mutant (invisible, not deterministic)
    verdict: str | None = None
    culprit: str | None = None
    confirmed: bool = False
    reruns: int = 0
    budget: int = 0
    right: bool = False
    problem: str | None = None
    seconds: float = 0.0
    framework: str | None = None  # the port form's: the port's framework and structural choices
    choices: dict | None = None
    expected_source: str | None = None  # the port form's: "<port file>:<line>" of the mistake
    expected_modules: list | None = None  # the modules the mistaken line runs in (or holding the changed leaves)
    expected_leaves: list | None = None  # the converted leaves the mistake changes
    expected_first_step: int | None = None  # the decode_port form's: the first step whose logits show the mistake
    expected_culprit_step: int | None = None  # the step at which the mutated code first runs with an effect
    first_divergent_step: int | None = None  # what `bisectr generate` said
    culprit_step: int | None = None


# The kind of operator each form holds: the compiler's bugs for the compiled form, the widening
# converter's for the widened one, the converter's for the paddle port, the converter's and the plan's
# for the tensor-parallel one, the converter's under sequence parallel, the decoding loop's for the
# decoding one, the rest for the others.
FORM_KINDS = {
    "compiled": ("compile",),
    "kv_widened": ("widen",),
    "paddle": ("weight",),
    "tp": ("weight", "tp"),
    "sp": ("weight",),
    "decode": ("decode",),
    "port": ("port",),
    "decode_port": ("port", "decode_port"),
}
OTHER_KINDS = ("weight", "op", "repeat")


def plant(families: list[str], operators: list[str], sites: int, seed: int, forms: list[str]) -> list[Case]:
    """Every case: per family and form, `sites` draws of each operator that applies to it (distinct sites
    only), and the controls. The `sdpa` form only where the family runs it, the `kv_widened` form only
    where it has grouped key-value heads, the `paddle` form where PaddleFormers has the family, the `tp` form
    where its layers shard as Megatron's; each form holds the operators of its kind (`FORM_KINDS`)."""
    from decoding import decodes
    from families import FAMILIES, build, has_grouped_kv_heads, runs_attention, shards_over_ranks, splits_sequence
    from mutant_pair import CONTROLS
    from mutations import OPERATORS
    from paddle_ports import PORTED

    cases = []
    for form in forms:
        if form in PORT_FORMS:
            cases += _port_cases(families, operators, sites, seed, form)
            continue
        for family in families:
            if (
                family not in FAMILIES  # one the ports package adds
                or (form == "sdpa" and not runs_attention(family, "sdpa"))
                or (form == "paddle" and family not in PORTED)
                or (form == "kv_widened" and not has_grouped_kv_heads(family))
                or (form == "tp" and not shards_over_ranks(family))
                or (form == "sp" and not splits_sequence(family))
                or (form == "decode" and not decodes(build(family)[0]))
            ):
                continue
            cases += [Case(family, control, 0, form) for control in CONTROLS]
            fitting = [o for o in operators if OPERATORS[o].kind in FORM_KINDS.get(form, OTHER_KINDS)]
            cases += [
                Case(family, operator, case_seed, form)
                for operator in fitting
                for case_seed in _sites(family, operator, sites, seed, form)
            ]
    return cases


def _port_cases(families: list[str], operators: list[str], sites: int, seed: int, form: str) -> list[Case]:
    """The port form's (or the decode_port form's) cases: per family of the ports package (its decoders), `sites`
    seeds of each operator of the form's kinds its ports have valid mutants of (`ports.cases.kind_applies`,
    `ports.decode_cases.kind_applies`), and of each control (every seed draws its own framework and choices; the site
    is drawn, valid, when the case is checked)."""
    from mutant_pair import CONTROLS
    from mutations import OPERATORS
    from ports import cases, decode_cases
    from ports.architectures import DECODERS
    from ports.references import PORT_FAMILIES

    covered, kind_applies = (
        (PORT_FAMILIES, cases.kind_applies) if form == "port" else (DECODERS, decode_cases.kind_applies)
    )
    kinds = [o for o in operators if OPERATORS[o].kind in FORM_KINDS[form]] + list(CONTROLS)
    return [
        Case(family, kind, random.Random(f"{seed}:{form}:{family}:{kind}:{draw}").randrange(10**6), form)
        for family in families
        if family in covered
        for kind in kinds
        if kind in CONTROLS or kind_applies(family, kind)
        for draw in range(sites)
    ]


def _sites(family: str, operator: str, sites: int, seed: int, form: str) -> list[int]:
    """Up to `sites` seeds at which `operator` plants at distinct sites of `family`'s candidate in `form`
    (none where it has none). A converter hands over the state dict: in the `paddle` form, a site outside it
    (a rotary table computed at build time) is none."""
    from mutant_pair import mutant
    from mutations import OPERATORS, NotApplicable

    seeds, seen = [], set()
    for draw in range(sites * 3):
        if len(seen) == sites:
            break
        case_seed = random.Random(f"{seed}:{form}:{family}:{operator}:{draw}").randrange(10**6)
        model, _, _ = mutant(family, "none", 0, form if form in ("kv_widened", "decode") else "copy")
        try:
            site = OPERATORS[operator].apply(model, random.Random(case_seed))
        except NotApplicable:
            break
        if form == "paddle" and site.leaf not in model.state_dict():
            break
        if site.what not in seen:
            seen.add(site.what)
            seeds.append(case_seed)
    return seeds


def sample(cases: list[Case], size: int, seed: int) -> list[Case]:
    """A stratified sample: one case of every operator (controls included) in every form, each in a family
    drawn at random, then cases of the families seen least, up to `size`."""
    rng = random.Random(seed)
    pool = list(cases)
    rng.shuffle(pool)
    chosen = list({(c.operator, c.form): c for c in reversed(pool)}.values())
    seen = defaultdict(int)
    for c in chosen:
        seen[c.family] += 1
    rest = [c for c in pool if c not in chosen]
    while len(chosen) < size and rest:
        least = min(rest, key=lambda c: seen[c.family])
        rest.remove(least)
        chosen.append(least)
        seen[least.family] += 1
    return chosen


def _outputs(model, inputs):
    import torch

    with torch.no_grad():
        out = model(**inputs)
    first = (
        out
        if torch.is_tensor(out)
        else next(v for v in (out.values() if hasattr(out, "values") else out) if torch.is_tensor(v))
    )
    return first.double().cpu()


def _relative(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def check(case: Case, row: Row) -> None:
    """Fill `row`'s site and validity: deterministic, and visible above float32 rounding."""
    if case.form == "port":
        return _check_port(case, row)
    if case.form == "decode_port":
        return _check_decode_port(case, row)
    import torch
    from mutant_pair import built_reference, mutant, on_candidate_device
    from mutations import OPERATORS
    from paddle_ports import ported_name

    torch_form = (
        "copy" if case.form in ("paddle", "tp", "sp") else case.form
    )  # a port's mistake is judged visible on the copy
    reference, inputs = built_reference(case.family, torch_form)
    reference32 = _outputs(reference, inputs)
    if not case.is_control:  # the unmutated copy first: a compiler bug is planted for the whole process
        copy, _, _ = mutant(case.family, "none", 0, torch_form)
        copy_error = _relative(_outputs(*on_candidate_device(copy, inputs)), reference32)
        torch._dynamo.reset()  # compiled code is cached by code object: the mutant's must be compiled anew
    candidate, _, site = mutant(case.family, case.operator, case.seed, torch_form)
    candidate, inputs = on_candidate_device(candidate, inputs)
    if site is not None:
        row.site, row.expected_module, row.expected_leaf, row.expected_aten = (
            site.what,
            site.module,
            site.leaf,
            site.aten,
        )
        row.expected_cause = OPERATORS[case.operator].cause
        if case.form == "paddle":
            row.expected_module, row.expected_leaf = (
                ported_name(case.family, site.module),
                ported_name(case.family, site.leaf),
            )
    # A plan's mistake shows on the ranks only (`judge`); a mutant that does not repeat itself counts as it is.
    if case.is_control or OPERATORS[case.operator].kind in ("tp", "repeat"):
        return
    first = _outputs(candidate, inputs)
    if not torch.equal(first, _outputs(candidate, inputs)):
        row.excluded = "not deterministic"
        return
    inputs64 = {k: v.double() if torch.is_tensor(v) and torch.is_floating_point(v) else v for k, v in inputs.items()}
    try:
        reference64 = _outputs(
            reference.double(), {k: v.cpu() if torch.is_tensor(v) else v for k, v in inputs64.items()}
        )
        row.rounding = max(_relative(reference32, reference64), copy_error)
        row.float64_error = _relative(_outputs(candidate.double(), inputs64), reference64)
    except RuntimeError:  # an op without a float64 kernel (torch._grouped_mm): the float32 errors judge
        row.rounding = max(copy_error, float(torch.finfo(torch.float32).eps))
        row.float64_error = _relative(first, reference32)
    _exclude_if_invisible(row)


def _check_port(case: Case, row: Row) -> None:
    """The port form's case drawn (`ports.cases`), valid by construction: its site, where it is, its validity."""
    from ports.cases import drawn

    port = drawn(case.family, case.operator, case.seed)
    row.framework, row.choices, row.excluded = port.framework, port.choices, port.excluded
    row.site, row.rounding, row.float64_error = port.site, port.rounding, port.float64_error
    row.expected_source, row.expected_modules, row.expected_leaves = port.source_line, port.modules, port.leaves


def _check_decode_port(case: Case, row: Row) -> None:
    """The decode_port form's case drawn (`ports.decode_cases`), valid by construction: its site, where it is, the
    steps it shows at, its validity."""
    from ports.decode_cases import drawn

    port = drawn(case.family, case.operator, case.seed)
    row.framework, row.choices, row.excluded = port.framework, port.choices, port.excluded
    row.site, row.rounding, row.float64_error = port.site, port.rounding, port.float64_error
    row.expected_source, row.expected_modules = port.source_line, port.modules
    row.expected_first_step, row.expected_culprit_step = port.first_step, port.culprit_step


def _exclude_if_invisible(row: Row) -> None:
    if not row.float64_error >= VISIBLE * row.rounding:
        row.excluded = f"float64 error {row.float64_error:.2g} < {VISIBLE:g}x float32 rounding {row.rounding:.2g}"


def _checked_by_the_search(row: Row, result: dict) -> None:
    """Validity of a mutant only the ranks run (a plan's mistake), from the search's own float64 check: its
    float64 error against the reference's float32 rounding."""
    check = result.get("fp64_check") or {}
    row.rounding, row.float64_error = check.get("reference_rounding"), check.get("float64_error")
    if row.rounding is None or row.float64_error is None:
        row.excluded = "no float64 check to judge it visible by"
    else:
        _exclude_if_invisible(row)


def judge(row: Row, result: dict) -> None:
    """Fill `row` from `bisect --json`'s result."""
    culprit = result.get("culprit") or {}
    row.verdict = result["verdict"]
    row.confirmed = bool((result.get("confirmation") or {}).get("confirmed"))
    row.reruns = result["reruns"]
    row.budget = math.ceil(math.log2(max(result["ops"]["candidate"], 2))) + 3
    if culprit:
        row.culprit = f"{culprit.get('leaf') or culprit['op']} at {culprit['candidate'].get('module')!r}"
        if culprit.get("compiled"):
            inside = culprit["compiled"]
            row.culprit += f", inside: {inside['op']} in {inside['module']!r}, {inside['step']} {inside['step_detail']}"
    if row.control:
        row.right = row.verdict in ("match", "noise")
        row.problem = None if row.right else f"{row.verdict} on a control"
        return
    module = (culprit.get("candidate") or {}).get("module")
    compiled = culprit.get("compiled") or {}
    if row.form == "port":
        at_site = culprit and _at_port_site(row, culprit)
    elif row.expected_aten is not None:  # a wrong decomposition: named as the compiler step applied to that op
        at_site = f"aten.{row.expected_aten}" in (compiled.get("step_detail") or "")
    else:
        at_site = culprit and (
            culprit.get("leaf") is not None
            and culprit.get("leaf") == row.expected_leaf
            or module is not None
            and _under(module, row.expected_module)
            or bool(compiled)
            and _under(compiled.get("module") or "", row.expected_module)
        )
    if row.expected_cause is not None:  # the candidate does not repeat itself
        found = (result.get("nondeterminism") or [{}])[0]
        if row.verdict != "nondeterministic":
            row.problem = f"{row.verdict} where the candidate does not repeat itself"
        elif not at_site:
            row.problem = "runs part elsewhere"
        elif found.get("cause") != row.expected_cause:
            row.problem = f"cause {found.get('cause')}, not {row.expected_cause}"
        row.right = row.problem is None
        return
    if row.verdict != "divergent":
        row.problem = f"{row.verdict} on a mutant"
    elif not at_site:
        row.problem = "culprit elsewhere"
    elif not row.confirmed:
        row.problem = "not confirmed"
    row.right = row.problem is None


def judge_generation(row: Row, result: dict) -> None:
    """Fill `row` from `bisectr.generate`'s result (`GenerationResult.to_dict()`): a mutant is right when divergent,
    first divergent at the step its logits first show it, its culprit confirmed and at its site, searched at the step
    its code first has an effect; a control when noise or match."""
    culprit, search = result.get("culprit") or {}, result.get("step_search") or {}
    row.verdict, row.confirmed = result["verdict"], bool((result.get("confirmation") or {}).get("confirmed"))
    row.first_divergent_step, row.culprit_step = result.get("first_divergent_step"), result.get("culprit_step")
    row.reruns = search.get("reruns", 0)
    row.budget = math.ceil(math.log2(max(search["ops"]["candidate"], 2))) + 3 if search else 0
    if culprit:
        row.culprit = (
            f"{culprit.get('leaf') or culprit['op']} at {culprit['candidate'].get('module')!r}, step "
            f"{culprit.get('step')}"
        )
    if row.control:
        row.right = row.verdict in ("match", "noise")
        row.problem = None if row.right else f"{row.verdict} on a control"
        return
    if row.verdict != "divergent":
        row.problem = f"{row.verdict} on a mutant"
    elif row.first_divergent_step != row.expected_first_step:
        row.problem = f"first divergent step {row.first_divergent_step}, not {row.expected_first_step}"
    elif not culprit:
        row.problem = "no culprit"
    elif not _at_port_site(row, culprit):
        row.problem = "culprit elsewhere"
    elif not row.confirmed:
        row.problem = "not confirmed"
    elif row.culprit_step != row.expected_culprit_step:
        row.problem = f"culprit step {row.culprit_step}, not {row.expected_culprit_step}"
    row.right = row.problem is None


def _under(module: str, prefix: str) -> bool:
    return prefix == "" or module == prefix or module.startswith(prefix + ".")


def _at_port_site(row: Row, culprit: dict) -> bool:
    """A port's mistake is found where the culprit's candidate source is the mutated line, its leaf one the mistake
    changes, or its module one the mutated line runs in (or under it, the root only as itself)."""
    candidate = culprit.get("candidate") or {}
    source, module, leaf = candidate.get("source"), candidate.get("module"), culprit.get("leaf")
    modules, leaves = row.expected_modules or [], row.expected_leaves or []
    in_module = module is not None and any(module == m or (m and module.startswith(m + ".")) for m in modules)
    at_line = source is not None and _source_line(source) == _source_line(row.expected_source)
    return at_line or (leaf is not None and leaf in leaves) or in_module


def _source_line(source: str) -> tuple[Path, str]:
    """`(file, line)` of a "<path>:<line>" source, the path resolved from this directory."""
    path, _, line = source.rpartition(":")
    return Path(path).resolve(), line


def _alarm(signum, frame):
    raise TimeoutError(f"over {CASE_TIMEOUT} s")


def evaluate(key: str) -> dict:
    """One case, end to end (runs in a worker process): check it, then `bisect` it unless excluded."""
    import bisectr

    case = Case.parse(key)
    row = Row(case.key, case.family, case.operator, case.form, case.is_control)
    started = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_TIMEOUT)
    try:
        check(case, row)
        if row.excluded is None and case.form == "decode_port":
            os.environ["BISECTR_MUTANT"] = case.key
            judge_generation(row, bisectr.generate(DECODE_PORT_MODEL_FILE, tokens=DECODE_STEPS).to_dict())
        elif row.excluded is None:
            os.environ["BISECTR_MUTANT"] = case.key
            with tempfile.TemporaryDirectory() as out:
                if case.form == "paddle":
                    run = _traced_against_paddle(case, Path(out))
                elif case.form == "port":
                    run = bisectr.trace(PORT_MODEL_FILE, out=Path(out) / "run")
                elif case.form in ("tp", "sp"):
                    run = bisectr.trace(MODEL_FILE, "reference", "candidate_tp", out=Path(out) / "run")
                else:
                    run = bisectr.trace(MODEL_FILE, out=Path(out) / "run")
                result = run.bisect().to_dict()
                judge(row, result)
                if row.site is not None and row.float64_error is None and row.expected_cause is None:
                    _checked_by_the_search(row, result)
    except Exception as exc:  # a crash or a refusal is a wrong answer, never an exclusion
        row.problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    finally:
        signal.alarm(0)
    row.seconds = time.perf_counter() - started
    return asdict(row)


def _traced_against_paddle(case: Case, scratch: Path):
    """The case traced against its PaddleFormers port, run by `BISECTR_PADDLE_PYTHON` from the checkpoint
    written here: the copy with the case's converter mistake in it."""
    import bisectr
    from mutant_pair import CONTROLS, PORT_CHECKPOINT, mutant
    from paddle_ports import write_checkpoint

    planted = "none" if case.operator in CONTROLS else case.operator
    model, inputs, _ = mutant(case.family, planted, case.seed, "copy")
    write_checkpoint(scratch / "checkpoint", model, inputs)
    os.environ[PORT_CHECKPOINT] = str(scratch / "checkpoint")
    return bisectr.trace(
        MODEL_FILE,
        "reference",
        "candidate_paddle",
        out=scratch / "run",
        isolate=True,
        candidate_python=os.environ[PADDLE_PYTHON],
    )


def _quiet() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def run_cases(cases: list[Case], workers: int, progress) -> list[dict]:
    """Each case's row, from `workers` processes; a compiled case in a process of its own (a wrong
    decomposition is registered for the whole process)."""
    if workers <= 1:
        _quiet()
        return [progress(evaluate(c.key)) for c in cases]
    context = multiprocessing.get_context("spawn")
    rows = []
    for compiled, per_process in ((False, 10), (True, 1)):
        keys = [c.key for c in cases if (c.form == "compiled") == compiled]
        if keys:
            with context.Pool(workers, initializer=_quiet, maxtasksperchild=per_process) as pool:
                rows += [progress(row) for row in pool.imap_unordered(evaluate, keys)]
    return rows


def _share(rows: list[dict]) -> str:
    right = sum(r["right"] for r in rows)
    return f"{right}/{len(rows)} ({right / len(rows):.1%})" if rows else "-"


def table(rows: list[dict]) -> tuple[str, bool]:
    """The printed summary and whether every target holds."""
    counted = [r for r in rows if r["excluded"] is None]
    mutants = [r for r in counted if not r["control"]]
    controls = [r for r in counted if r["control"]]
    lines = []
    for heading, field in (("family", "family"), ("operator", "operator"), ("form", "form")):
        groups = defaultdict(list)
        for r in mutants:
            groups[r[field]].append(r)
        lines.append(f"\nright by {heading}:")
        width = max((len(k) for k in groups), default=8)
        for name in sorted(groups):
            lines.append(f"  {name:<{width}}  {_share(groups[name])}")
    for form in PORT_FORMS:
        lines += _by_choice([r for r in mutants if r["form"] == form], form)
    lines += _steps_right([r for r in mutants if r["form"] == "decode_port"])
    noise_on_mutants = [r for r in mutants if r["verdict"] in ("noise", "match")]
    divergent_controls = [r for r in controls if r["verdict"] == "divergent"]
    over_budget = [r for r in mutants if r["reruns"] > r["budget"]]
    by_operator = defaultdict(list)
    for r in mutants:
        by_operator[r["operator"]].append(r)
    worst = (
        min((sum(r["right"] for r in g) / len(g), op) for op, g in by_operator.items()) if by_operator else (1.0, "-")
    )
    right = sum(r["right"] for r in mutants) / max(len(mutants), 1)
    excluded = [r for r in rows if r["excluded"] is not None]
    lines += [
        "",
        f"mutants: {len(mutants)} counted ({len(excluded)} excluded before the search: invisible or not deterministic)",
        f"controls: {_share(controls)} right",
        f"mutants right: {_share(mutants)}",
        f"worst operator: {worst[1]} {worst[0]:.0%}",
        f"noise/match on a mutant: {len(noise_on_mutants)}; divergent on a control: {len(divergent_controls)}",
        f"re-runs over ceil(log2 ops)+3: {len(over_budget)}",
    ]
    wrong = [r for r in counted if not r["right"]]
    if wrong:
        lines.append("\nwrong:")
        lines += [
            f"  {r['case']:<36} {r['problem']}: {r['verdict']}, culprit {r['culprit']}; planted {r['site']}"
            for r in sorted(wrong, key=lambda r: r["case"])
        ]
    holds = right >= 0.95 and worst[0] >= 0.9 and not noise_on_mutants and not divergent_controls and not over_budget
    return "\n".join(lines), holds


def _by_choice(rows: list[dict], form: str) -> list[str]:
    """A port form's share right by structural choice: one line per choice, each of its values' share."""
    if not rows:
        return []
    groups = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for name, value in {"framework": r["framework"], **(r["choices"] or {})}.items():
            groups[name][value].append(r)
    width = max(len(name) for name in groups)
    lines = [f"\nright by structural choice ({form}):"]
    for name in sorted(groups, key=lambda n: (n != "framework", n)):
        shares = ", ".join(f"{value} {_share(group)}" for value, group in sorted(groups[name].items()))
        lines.append(f"  {name:<{width}}  {shares}")
    return lines


def _steps_right(rows: list[dict]) -> list[str]:
    """The decode_port form's shares of mutants whose first divergent step, and whose culprit's step, are right."""
    if not rows:
        return []
    first = [dict(r, right=r["first_divergent_step"] == r["expected_first_step"]) for r in rows]
    culprit = [dict(r, right=r["culprit_step"] == r["expected_culprit_step"]) for r in rows]
    return [
        "",
        f"first divergent step right (decode_port): {_share(first)}",
        f"culprit step right (decode_port): {_share(culprit)}",
    ]


def main(argv: list[str] | None = None) -> int:
    from families import FAMILIES
    from mutant_pair import DEVICE, FORMS
    from mutations import OPERATORS
    from ports.references import PORT_FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=2, help="random sites per family and operator")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--families", help="default: every family of the forms asked for")
    parser.add_argument("--operators", default=",".join(OPERATORS))
    parser.add_argument(
        "--forms", default=DEFAULT_FORMS, help=f"how candidates are built: {', '.join(FORMS + PORT_FORMS)}"
    )
    parser.add_argument("--sample", type=int, default=0, help="a stratified sample of this many cases")
    parser.add_argument("--workers", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--only", help="one case, FAMILY:OPERATOR:SEED[:FORM]: print its row")
    parser.add_argument("--device", default="cpu", help="where the candidates run (cuda: on the GPU)")
    parser.add_argument(
        "--paddle-python",
        metavar="PATH",
        help="interpreter of an environment with PaddleFormers: adds the paddle form to the default forms",
    )
    args = parser.parse_args(argv)
    os.environ[DEVICE] = args.device  # read by each case's model file, in every worker
    # The workers (the reference's process) hash strings as the tp form's ranks do (docs/limitations.md).
    os.environ.setdefault("PYTHONHASHSEED", "0")
    forms = args.forms.split(",") + (["paddle"] if args.paddle_python and args.forms == DEFAULT_FORMS else [])
    if "paddle" in forms or (args.only or "").endswith(":paddle"):
        if not args.paddle_python:
            parser.error("the paddle form needs --paddle-python (an environment with PaddleFormers)")
        os.environ[PADDLE_PYTHON] = args.paddle_python
    _quiet()
    if args.only:
        row = evaluate(args.only)
        print(json.dumps(row, indent=1))
        return 0 if row["right"] else 1
    families = args.families.split(",") if args.families else list(dict.fromkeys([*FAMILIES, *PORT_FAMILIES]))
    cases = plant(families, args.operators.split(","), args.sites, args.seed, forms)
    if args.sample:
        cases = sample(cases, args.sample, args.seed)
    print(
        f"{len(cases)} cases ({sum(c.is_control for c in cases)} controls), {args.workers} workers, candidates on "
        f"{args.device}",
        flush=True,
    )
    started = time.perf_counter()

    def progress(row: dict) -> dict:
        mark = "excluded" if row["excluded"] else ("ok" if row["right"] else f"WRONG ({row['problem']})")
        print(f"  {row['case']:<36} {row['seconds']:6.1f} s  {mark}", flush=True)
        return row

    rows = run_cases(cases, args.workers, progress)
    summary, holds = table(rows)
    print(summary)
    print(f"\n{time.perf_counter() - started:.0f} s; targets {'hold' if holds else 'do not hold'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["right"] for r in rows if r["excluded"] is None) else 1


if __name__ == "__main__":
    sys.exit(main())
