"""The port writer of the seeded-bug benchmark's `port` form (`benchmarks/models/ports/`): the correct ports of every
family, torch and paddle, match their Hugging Face references to float32 rounding whatever their structural choices
(four draws per framework that between them take every value of every choice, and two drawn at random), every
output of theirs; a mutation changes the text of one line and moves none; a case of the form drawn end to end is
valid and says where its mistake is. The `decode_port` form's decoding ports (their own cache) decode as their
references do, step by step and token by token, whatever their choices; its mistakes are at the lines that run at
decode steps, and a case drawn says the steps it shows at.
"""

import random
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="needs transformers")
pytest.importorskip("paddle", reason="needs paddle")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "models"))

pytestmark = pytest.mark.once  # the benchmarks' code: the first CI environment only (its transformers' names)

FRAMEWORKS = ("torch", "paddle")
DRAWS = 4  # per family and framework: the most values any choice has
RANDOM_DRAWS = 2  # per family and framework, beside those
TOLERANCE = 1e-5  # relative: max abs error over max abs of the reference's output


def cycled_choices(arch, framework: str, draw: int, choices=None) -> dict:
    """The `draw`-th value (cycling) of every choice open to the family (of `choices`, by default the port form's):
    `DRAWS` draws take every value."""
    from ports.choices import CHOICES

    drawn = {}
    for choice in choices or CHOICES:
        values = choice.open_values(arch, framework, drawn)
        if values:
            drawn[choice.name] = values[draw % len(values)]
    return drawn


def families():
    from ports.references import PORT_FAMILIES

    return PORT_FAMILIES


@pytest.mark.parametrize("family", families())
def test_every_correct_port_matches_its_reference_to_float32_rounding(family):
    from ports import references, running
    from ports.architectures import ARCHS
    from ports.choices import draw, draw_names
    from ports.writer import write

    reference, inputs = references.build(family)
    hf, expected = references.state_dict(reference), running.reference_outputs(reference, inputs)
    errors = {}
    for framework in FRAMEWORKS:
        rng = random.Random(f"{family}:{framework}")
        drawn = [cycled_choices(ARCHS[family], framework, i) for i in range(DRAWS)]
        drawn += [draw(ARCHS[family], framework, rng) for _ in range(RANDOM_DRAWS)]
        for choices in drawn:
            port = running.from_source(write(family, framework, choices, draw_names(rng)), f"{family}_port.py")
            model = running.built(port, port.convert(hf))
            got = running.outputs(model, running.framework_inputs(inputs, framework), framework)
            assert set(got) <= set(expected), (framework, choices, set(got))
            for name, values in got.items():
                errors[framework, name, tuple(choices.items())] = running.relative(values, expected[name])
    assert max(errors.values()) < TOLERANCE, {key: error for key, error in errors.items() if error >= TOLERANCE}


def test_a_mutation_changes_one_line_and_moves_none():
    from ports.choices import draw, draw_names
    from ports.architectures import ARCHS
    from ports.mutate import KINDS, mutated, sites
    from ports.writer import one_statement_per_line, write

    rng = random.Random(0)
    source = write("falcon", "paddle", draw(ARCHS["falcon"], "paddle", rng), draw_names(rng))
    lines = source.splitlines()
    for kind in KINDS:
        found = sites(source, kind)
        assert found, kind
        for site in random.Random(kind).sample(found, min(20, len(found))):
            changed = mutated(source, site).splitlines()
            assert len(changed) == len(lines)
            assert [i for i, (a, b) in enumerate(zip(lines, changed), start=1) if a != b] == [site.line], site
            assert not site.function.endswith(("__init__", "build", "load"))
    one_statement_per_line(source)


def test_a_drawn_case_is_a_valid_mutant_placed_at_its_line_or_leaves(tmp_path, monkeypatch):
    """Drawn twice (the second time from the cache), a case of each place a mistake can be: a forward line, named
    with the modules it runs in, and a converter line, named with the leaves it changes."""
    from ports import cases

    monkeypatch.setattr(cases, "CACHE", tmp_path)
    forward = cases.drawn("gpt2", "call_dropped", 1)
    assert forward == cases.drawn("gpt2", "call_dropped", 1)
    assert forward.excluded is None and forward.float64_error >= cases.VISIBLE * forward.rounding
    line = int(forward.source_line.rpartition(":")[2])
    assert Path(forward.port_file).read_text().splitlines()[line - 1].strip() == forward.site.rpartition("  ->  ")[2]
    assert forward.in_converter or forward.modules
    converter = next(
        case for seed in range(20) if (case := cases.drawn("llama", "slice_off_by_one", seed)).in_converter
    )
    assert converter.leaves and converter.modules == sorted({leaf.rpartition(".")[0] for leaf in converter.leaves})


@pytest.mark.parametrize("family", ["llama", "qwen2", "mixtral", "gemma2", "gpt_neox", "gpt2", "bloom", "falcon"])
def test_every_correct_decoding_port_decodes_as_its_reference_token_by_token(family):
    """Each decoding port (cycled draws taking every value of every choice, Gemma-2's and Mixtral's sliding windows
    evicting from the prompt on), torch and paddle: the same greedy tokens as the reference decoding freely, and the
    last position's logits at every step (the prefill and `STEPS` decode steps, fed the reference's tokens) within
    float32 rounding of the reference's."""
    from ports import greedy, references, running
    from ports.architectures import DECODING_ARCHS
    from ports.choices import DECODING_CHOICES, draw_decoding_names
    from ports.decode_cases import STEPS
    from ports.writer import write

    reference, prompt = references.build_for_decoding(family)
    prompt = {name: values.numpy() for name, values in prompt.items()}
    expected = greedy.decoded(reference, "torch", prompt, STEPS)
    hf, errors = references.state_dict(reference), {}
    for framework in FRAMEWORKS:
        rng = random.Random(f"{family}:{framework}:decoding")
        for i in range(DRAWS):
            choices = cycled_choices(DECODING_ARCHS[family], framework, i, DECODING_CHOICES)
            port = running.from_source(write(family, framework, choices, draw_decoding_names(rng)), f"{family}_port.py")
            model = running.built(port, port.convert(hf))
            free = greedy.decoded(model, framework, prompt, STEPS)
            assert [t.tolist() for t in free.tokens()] == [t.tolist() for t in expected.tokens()], (framework, choices)
            forced = greedy.decoded(model, framework, prompt, STEPS, expected.tokens()[:STEPS])
            for step, (got, want) in enumerate(zip(forced.logits, expected.logits)):
                errors[framework, step, tuple(choices.items())] = running.relative(got, want)
    assert max(errors.values()) < TOLERANCE, {key: error for key, error in errors.items() if error >= TOLERANCE}


def test_a_decoding_mistake_rewrites_decode_lines_only_and_a_drawn_case_says_its_steps(tmp_path, monkeypatch):
    """A decoding port's mistakes (every decoding kind has some; the syntax-tree kinds those at decode lines) rewrite
    only lines that run at decode steps and move none; a case drawn (k cached before the rotary) is valid, its logits
    first showing it at the first decode step though its code has its effect at the prefill (the cache it writes),
    at a line of the attention layers'."""
    from ports import cases, decode_cases, decoding
    from ports.architectures import DECODING_ARCHS
    from ports.choices import DECODING_CHOICES, draw, draw_decoding_names
    from ports.writer import written

    rng = random.Random(0)
    port = written(
        "gemma2", "torch", draw(DECODING_ARCHS["gemma2"], "torch", rng, DECODING_CHOICES), draw_decoding_names(rng)
    )
    lines = port.source.splitlines()
    assert all(decode_cases.sites(port, kind) for kind in decoding.KINDS)
    for kind in decode_cases.KINDS:
        for site in decode_cases.sites(port, kind):
            changed = site.applied(port.source).splitlines()
            assert len(changed) == len(lines)
            rewritten = {i for i, (a, b) in enumerate(zip(lines, changed), start=1) if a != b}
            assert rewritten and rewritten <= port.decode_lines, (kind, site)

    monkeypatch.setattr(cases, "CACHE", tmp_path)
    monkeypatch.setattr(decode_cases, "CACHE", tmp_path)
    case = decode_cases.drawn("llama", "cached_before_rotary", 0)
    assert case == decode_cases.drawn("llama", "cached_before_rotary", 0)
    assert case.excluded is None and case.float64_error >= cases.VISIBLE * case.rounding
    assert (case.first_step, case.culprit_step) == (1, 0)
    assert case.modules and all(module.endswith(case.names["attention"]) for module in case.modules), case.modules
