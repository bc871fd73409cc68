"""A side that does not repeat itself: `nondeterministic` (exit 1), the first op that differs between two of
its runs with its cause and fix, `--fix-nondeterminism`, and the numerics settings the sides ran with.

Model files: tests/models/nondeterministic_torch.py and nondeterministic_paddle.py (one source of difference
between runs per candidate, at a tagged line of block 1)."""

import json
import subprocess
import sys

import pytest

import bisectr
from bisectr.errors import TraceMismatchError
from bisectr.sides.runner import RecordAgain, Rerun
from conftest import MODELS, line_of

TORCH = MODELS / "nondeterministic_torch.py"
PADDLE = MODELS / "nondeterministic_paddle.py"


def case(model, candidate, op, tag, cause="random", fixable="seed", module="blocks.1", reference="reference"):
    """(model file, reference, candidate, the side that does not repeat itself, canonical op, module, tagged
    line, cause, what --fix-nondeterminism does)."""
    side = "reference" if reference != "reference" else "candidate"
    return model, reference, candidate, side, op, module, tag, cause, fixable


def dropout_case(model, reference="reference", candidate="candidate_dropout"):
    return case(model, candidate, "dropout", "return self.drop(h)", "random", "eval", "blocks.0.drop", reference)


CASES = {
    "torch dropout": dropout_case(TORCH),
    "torch reference dropout": dropout_case(TORCH, "reference_dropout", "candidate"),
    "torch noise": case(TORCH, "candidate_noise", "randn_like", "# @noise"),
    "torch uninitialised": case(TORCH, "candidate_uninitialised", "sum", "# @read", "uninitialized", None),
    "torch shuffle": case(TORCH, "candidate_shuffle", "randperm", "# @shuffle"),
    "paddle dropout": dropout_case(PADDLE),
    "paddle reference dropout": dropout_case(PADDLE, "reference_dropout", "candidate"),
    "paddle noise": case(PADDLE, "candidate_noise", "gaussian", "# @noise"),
    "paddle uninitialised": case(PADDLE, "candidate_uninitialised", "sum", "# @read", "uninitialized", None),
    "paddle shuffle": case(PADDLE, "candidate_shuffle", "randperm", "# @shuffle"),
}

FIXES = {
    ("torch", "eval"): "model.eval()",
    ("torch", "seed"): "torch.manual_seed(0)",
    ("torch", None): "torch.zeros",
    ("paddle", "eval"): "model.eval()",
    ("paddle", "seed"): "paddle.seed(0)",
    ("paddle", None): "paddle.zeros",
}


@pytest.mark.parametrize(
    "case", [pytest.param(name, marks=[pytest.mark.once] if CASES[name][0] == TORCH else []) for name in CASES]
)
def test_each_source_of_difference_between_runs_is_named_at_its_op_with_cause_and_fix(case):
    model, reference, candidate, side, op, module, tag, cause, fixable = CASES[case]
    result = bisectr.bisect(model, reference, candidate)
    assert result.verdict == "nondeterministic"
    [found] = result.nondeterminism
    assert (found.side, found.cause, found.fixable, found.op.module) == (side, cause, fixable, module)
    assert found.op.source == f"{model}:{line_of(model, tag)}"
    assert result.culprit.op == op and result.culprit.candidate == found.op
    framework = "torch" if model == TORCH else "paddle"
    assert FIXES[framework, fixable] in found.fix
    assert found.difference > 1e-3  # a dropout's sampled values move by a few per mille at least
    if cause == "uninitialized":
        assert found.reads.endswith("empty)") and found.op.index > 5
        assert found.difference > 1.0  # the poison is far from what the first run read
    assert result.reruns == 0 and result.profile == []


LIBRARY = MODELS / "nondeterministic_library.py"


@pytest.mark.parametrize(
    "name, op, module, fixable, needs",
    [
        ("bert", "dropout", "embeddings.dropout", "eval", "transformers"),
        ("mixtral", "uniform", "layers.0.mlp", "seed", "transformers"),
        ("lstm", "rnn", "", "eval", None),
        ("encoder", "dropout", "layers.0.self_attn", "eval", None),
    ],
)
def test_library_models_that_do_not_repeat_themselves(name, op, module, fixable, needs):
    if needs:
        pytest.importorskip(needs)
    candidate = {"bert": "bert_train", "mixtral": "mixtral_jitter", "lstm": "lstm_train", "encoder": "encoder_train"}
    result = bisectr.bisect(LIBRARY, f"reference_{name}", f"candidate_{candidate[name]}")
    assert result.verdict == "nondeterministic"
    [found] = result.nondeterminism
    assert (found.side, found.cause, found.fixable, found.op.module) == ("candidate", "random", fixable, module)
    assert result.culprit.op == op


def test_a_deterministic_pair_is_searched_as_before():
    for model in (TORCH, PADDLE):
        result = bisectr.bisect(model)
        assert (result.verdict, result.nondeterminism, result.fixed) == ("match", [], [])


@pytest.mark.once  # torch alone
def test_a_side_compared_with_itself_is_checked_on_both_sides():
    result = bisectr.bisect(TORCH, "reference_dropout", "reference_dropout")
    assert result.verdict == "nondeterministic"
    assert [found.side for found in result.nondeterminism] == ["reference", "candidate"]
    assert {found.op.module for found in result.nondeterminism} == {"blocks.0.drop"}


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bisectr", *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def test_the_cli_exits_1_with_the_side_the_op_the_cause_and_the_fix(tmp_path):
    done = _cli("bisect", str(PADDLE), "--candidate", "candidate_uninitialised", "--json")
    assert done.returncode == 1, done.stderr
    document = json.loads(done.stdout)
    assert document["verdict"] == "nondeterministic"
    [found] = document["nondeterminism"]
    assert (found["side"], found["cause"]) == ("candidate", "uninitialized")
    assert document["culprit"]["candidate"]["source"] == f"{PADDLE}:{line_of(PADDLE, '# @read')}"
    assert "paddle.zeros" in found["fix"] and f"{PADDLE.name}:{line_of(PADDLE, '# @empty')}" in found["fix"]
    text = _cli("bisect", str(TORCH), "--candidate", "candidate_dropout")
    assert text.returncode == 1
    assert "verdict: nondeterministic" in text.stdout
    assert "the candidate does not repeat itself" in text.stdout and "cause: random" in text.stdout
    assert "model.eval()" in text.stdout


@pytest.mark.parametrize("model", [TORCH, PADDLE], ids=["torch", "paddle"])
def test_fix_nondeterminism_puts_dropout_off_and_the_usual_search_names_the_bug(model):
    result = bisectr.bisect(model, candidate="candidate_dropout_and_bug", fix_nondeterminism=True)
    assert result.verdict == "divergent"
    assert result.fixed == ["candidate: model put in eval mode (dropout off)"]
    assert (
        result.culprit.candidate.op.endswith("gelu")
        and result.culprit.candidate.source == f"{model}:{line_of(model, '# @gelu')}"
    )
    assert result.confirmation.confirmed
    clean = bisectr.bisect(model, candidate="candidate_dropout", fix_nondeterminism=True)
    assert (clean.verdict, clean.fixed) == ("match", ["candidate: model put in eval mode (dropout off)"])


@pytest.mark.once  # torch alone
def test_fix_nondeterminism_seeds_an_unseeded_random_op_and_the_search_names_it():
    """Seeded, the noise repeats itself, and it is what the candidate computes that the reference does not."""
    result = bisectr.bisect(TORCH, candidate="candidate_noise", fix_nondeterminism=True)
    assert result.fixed == ["candidate: random generators seeded with 0 before each run"]
    assert result.verdict == "divergent" and result.confirmation.confirmed
    assert result.culprit.candidate.source == f"{TORCH}:{line_of(TORCH, '# @noise')}"


@pytest.mark.once  # torch alone
def test_a_forward_that_seeds_itself_is_re_run_by_its_code_and_searched():
    result = bisectr.bisect(TORCH, candidate="candidate_seeded_noise")
    assert result.verdict == "divergent" and result.confirmation.confirmed
    assert result.culprit.candidate.source == f"{TORCH}:{line_of(TORCH, '# @seeded')}"


@pytest.mark.once  # torch alone
def test_fix_nondeterminism_leaves_what_it_cannot_fix_to_the_user():
    result = bisectr.bisect(TORCH, candidate="candidate_uninitialised", fix_nondeterminism=True)
    assert (result.verdict, result.fixed) == ("nondeterministic", [])


@pytest.mark.once  # torch alone
def test_memory_left_uninitialised_is_poisoned_beyond_what_it_held_in_every_later_run(tmp_path):
    """Whatever the recording read there (an earlier run's poison among it), a re-run and a second recording fill
    it with a power of two beyond it: the read departs at once."""
    run = bisectr.trace(TORCH, candidate="candidate_uninitialised", out=tmp_path / "run")
    [empty] = [op for op in run.candidate.ops if op.op == "empty"]
    recorded = run.candidate.tensors[empty.outputs[0]].stats
    again = run.live.ask("candidate", RecordAgain()).tensors[empty.outputs[0]].stats
    assert again.min == again.max >= 4096 and again.max > recorded.absmax
    with pytest.raises(TraceMismatchError, match=r"departed from its recording at op (6|8) "):
        run.live.ask("candidate", Rerun({}))


def test_settings_that_differ_come_first_in_text_markdown_and_html(tmp_path):
    done = _cli(
        "bisect",
        str(TORCH),
        "--reference",
        "reference_threads",
        "--candidate",
        "candidate_threads",
        "--report",
        str(tmp_path / "report"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    differ = [line for line in lines if line.startswith("settings differ: ")]
    assert lines[: len(differ)] == differ and lines[len(differ)].startswith("verdict: match")
    assert "settings differ: tf32 matmul: reference off, candidate on" in differ
    [threads] = [line for line in differ if line.startswith("settings differ: torch threads: ")]
    assert (
        threads.startswith("settings differ: torch threads: reference 2 (interop ")
        and ", candidate 1 (interop " in threads
    )
    markdown = (tmp_path / "report.md").read_text()
    assert markdown.index("### Settings that differ") < markdown.index("### Sides") < markdown.index("### Verdict")
    assert "| tf32 matmul | `off` | `on` |" in markdown
    assert "| torch threads | `2 (interop " in markdown and "` | `1 (interop " in markdown
    html = (tmp_path / "report.html").read_text()
    assert html.index("Settings that differ") < html.index("Verdict")


@pytest.fixture
def torch_settings_restored():
    """The threads-setting sides change this process's settings as they run: put them back."""
    import torch

    threads, tf32 = torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32
    yield
    torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = tf32


@pytest.mark.once  # torch alone
def test_each_sides_settings_are_in_the_saved_run(tmp_path, torch_settings_restored):
    run = bisectr.trace(TORCH, "reference_threads", "candidate_threads", out=tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    settings = manifest["traced"]["settings"]
    assert (settings["reference"]["torch threads"][0], settings["candidate"]["torch threads"][0]) == ("2", "1")
    assert bisectr.load(tmp_path / "run").candidate.settings == run.candidate.settings
    assert {"default dtype", "autocast", "tf32 matmul", "torch threads", "torch matmul precision"} <= set(
        settings["reference"]
    )


@pytest.mark.once  # torch alone
def test_train_answers_nondeterministic_where_its_first_step_search_finds_a_side_that_does_not_repeat():
    result = bisectr.train(TORCH, candidate="candidate_dropout", steps=2)
    assert (result.verdict, result.first_step, result.stage) == ("nondeterministic", 1, "forward")
    assert result.culprit.candidate.module == "blocks.0.drop" and "model.eval()" in result.note


@pytest.mark.once  # torch alone
def test_generate_answers_nondeterministic_where_the_step_search_finds_a_side_that_does_not_repeat(tmp_path):
    done = _cli(
        "generate", str(MODELS / "generate_faults.py"), "--candidate", "candidate_dropout", "--tokens", "2", "--json"
    )
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert (result["verdict"], result["culprit_step"]) == ("nondeterministic", 0)
    [found] = result["step_search"]["nondeterminism"]
    assert (found["side"], found["cause"], found["op"]["module"]) == ("candidate", "random", "drop")


def test_a_side_in_a_worker_process_is_recorded_again_and_fixed_there():
    found = bisectr.bisect(PADDLE, candidate="candidate_uninitialised", isolate=True).nondeterminism
    assert [(f.side, f.cause, f.op.source) for f in found] == [
        ("candidate", "uninitialized", f"{PADDLE}:{line_of(PADDLE, '# @read')}")
    ]
    fixed = bisectr.bisect(PADDLE, candidate="candidate_dropout_and_bug", isolate=True, fix_nondeterminism=True)
    assert (fixed.verdict, fixed.fixed) == ("divergent", ["candidate: model put in eval mode (dropout off)"])


@pytest.mark.once  # torch alone
def test_trace_saves_the_run_it_traced_again_with_what_it_fixed(tmp_path):
    done = _cli(
        "trace", str(TORCH), "--candidate", "candidate_dropout", "--no-tui", "-o", str(tmp_path / "run"),
        "--fix-nondeterminism",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fixed before recording: candidate: model put in eval mode (dropout off)")
    run = bisectr.load(tmp_path / "run")
    assert run.traced.fixes["candidate"].eval_mode and run.result.fixed and run.result.verdict == "match"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]
