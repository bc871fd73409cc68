"""The README's commands run, and the output it quotes is what they print."""

import re
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))


def shell_commands() -> list[str]:
    """The README's commands (the set-up commands first), then those of every page of docs/."""
    pages = [README] + [page.read_text() for page in DOCS]
    return [command for text in pages for command in re.findall(r"```bash\n(.*?)\n```", text, re.S)]


def quoted_output(after: str) -> list[str]:
    """Lines of the first plain code block following `after`."""
    block = re.search(r"```\n(.*?)\n```", README[README.index(after) :], re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


NUMBER = re.compile(r"(?<![A-Za-wyz\d_.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")  # "x47" is a number, "h.0" is not
CHART = re.compile("[▁▂▃▄▅▆▇█^]")
BAND = 3.0  # quoted real numbers hold within this factor on any x86 CPU (BLAS kernels differ)


def shape(line: str) -> str:
    """A line with its numbers masked, and the two span heads' names merged: which of the two
    span matmuls amplifies rounding more depends on the CPU's kernels."""
    return re.sub(r"\b(start|end)_", "span_", NUMBER.sub("#", line.rstrip()))


ROUNDING = 1e-6  # errors this small are rounding on any CPU: one may print 0 where another prints 1.69e-07


def is_real(number: str) -> bool:
    return "." in number or "e" in number


def numbers_agree(want: str, got: str) -> bool:
    """Integers (op indices, line numbers, counts) are the line's shape and not compared: which of
    two tied ops is named varies. A real number on either side holds within `BAND` or is rounding on both."""
    if not (is_real(want) or is_real(got)):
        return True
    a, b = float(want), float(got)
    return a / BAND <= b <= a * BAND or a == b or max(abs(a), abs(b)) <= ROUNDING


def assert_quoted_output_printed(quoted: list[str], printed: list[str]) -> None:
    """Every quoted line but the chart's is printed, its words as quoted and its numbers agreeing (`numbers_agree`)."""
    by_shape = {shape(line): line for line in printed}
    for line in quoted:
        if CHART.search(line) or line.lstrip().startswith("op "):
            continue
        assert shape(line) in by_shape, line
        for want, got in zip(NUMBER.findall(line), NUMBER.findall(by_shape[shape(line)]), strict=True):
            assert numbers_agree(want, got), (line, by_shape[shape(line)])


def run_bisectr(*args) -> subprocess.CompletedProcess:
    """`bisectr ARGS` from the repository's root; a `trace` saves its run outside the work tree."""
    with tempfile.TemporaryDirectory() as out:
        if args[0] == "trace" and "-o" not in args:
            args = (*args, "-o", f"{out}/run")
        return subprocess.run([sys.executable, "-m", "bisectr", *args], capture_output=True, text=True, cwd=ROOT)


SETUP_COMMANDS = 4  # set up and trace; set up and test; the same in the PaddleFormers environment; lint


def test_readme_starts_with_the_two_commands_and_ci_runs_both_test_environments():
    setup_and_trace, setup_and_test, paddleformers_setup_and_test, lint = shell_commands()[:SETUP_COMMANDS]
    assert README.index(setup_and_trace) < 400
    assert setup_and_trace.endswith("bisectr trace examples/span_head.py")
    ci = (ROOT / ".ci" / "run").read_text()
    assert setup_and_test in ci and paddleformers_setup_and_test in ci and lint in ci
    assert lint.endswith("ruff check && .venv/bin/ruff format --check")
    assert "'.[torch,paddle,paddleformers,test]'" in paddleformers_setup_and_test


def test_span_head_walkthrough_output_is_real():
    done = run_bisectr("trace", "examples/span_head.py", "--no-tui")
    assert done.returncode == 0, done.stderr
    assert_quoted_output_printed(quoted_output(SPAN_HEAD_QUOTE), done.stdout.splitlines())


def test_divergent_walkthrough_output_is_real():
    done = run_bisectr("bisect", "examples/tanh_gelu.py")
    assert done.returncode == 1, done.stderr
    assert_quoted_output_printed(quoted_output(DIVERGENT_QUOTE), done.stdout.splitlines())


SPAN_HEAD_QUOTE = "`bisectr trace examples/span_head.py --no-tui` prints"
DIVERGENT_QUOTE = "A real bug looks like this"
# What the two walkthroughs print on an AMD EPYC machine where they differ from the README (quoted
# from this Intel machine): other last digits, and the span head's other matmul named.
AMD_EPYC = {
    SPAN_HEAD_QUOTE: {
        "verdict: noise": "verdict: noise   outputs differ by 0.00275 (relative 1.9e-06)",
        "candidate  op 70": "  candidate  op 72    _C_ops.matmul                span_head",
        "_paddle_blocks.py:156": (
            "             examples/_paddle_blocks.py:159:  end_logits = paddle.matmul(temp, end_reps)"
        ),
        "reference  op 69": "  reference  op 71    matmul                       span_head",
        "_torch_blocks.py:162": (
            "             examples/_torch_blocks.py:164:  end_logits = torch.matmul(temp, end_reps.transpose(1, 2))"
        ),
        "input error": "  input error 5.91e-05 -> output error 0.0025 (x42.3); local error 1.69e-07",
    },
    DIVERGENT_QUOTE: {"input error": "  input error 6.81e-06 -> output error 0.000485 (x71.2); local error 8.33e-05"},
}


def on_amd(quote: str) -> list[str]:
    """The README's quoted output with the AMD EPYC machine's lines in place of those it changes."""
    lines = quoted_output(quote)
    for marker, printed in AMD_EPYC[quote].items():
        at = next(i for i, line in enumerate(lines) if marker in line)
        lines[at] = printed
    return lines


@pytest.mark.parametrize("quote", [SPAN_HEAD_QUOTE, DIVERGENT_QUOTE])
def test_the_walkthrough_check_takes_another_cpus_output(quote):
    assert_quoted_output_printed(quoted_output(quote), on_amd(quote))


@pytest.mark.parametrize(
    "quote, marker, wrong",
    [
        (SPAN_HEAD_QUOTE, "verdict: noise", "verdict: divergent   outputs differ by 0.00275 (relative 1.9e-06)"),
        (SPAN_HEAD_QUOTE, "input error", "  input error 5.91e-05 -> output error 0.0025 (x42.3); local error 0.00169"),
        (
            DIVERGENT_QUOTE,
            "confirmed:",
            "  confirmed: taking out only op 222's own difference takes the outputs' error from 0.000227 to 0.000151",
        ),
    ],
)
def test_the_walkthrough_check_fails_on_other_output(quote, marker, wrong):
    printed = [wrong if marker in line else line for line in on_amd(quote)]
    with pytest.raises(AssertionError):
        assert_quoted_output_printed(quoted_output(quote), printed)


def test_every_other_readme_and_docs_command_runs(tmp_path):
    for command in shell_commands()[SETUP_COMMANDS:]:
        program, *args = command.split()
        assert program == "bisectr", command
        if "--report" in args:  # written into this test's directory, not the work tree
            args[args.index("--report") + 1] = str(tmp_path / "report")
        done = run_bisectr(*args)
        assert done.returncode in (0, 1), (command, done.stderr)
        if "--substitute rounding" in command:
            replayed = re.search(r"outputs' error 0 \(replayed as it is: (\S+)\)", done.stdout)
            assert replayed and 2.17e-07 / BAND <= float(replayed.group(1)) <= 2.17e-07 * BAND
        if "tensor_parallel.py" in command:
            assert "DTensor.to_local             blocks.0" in done.stdout, done.stdout
            assert "on 2 ranks: reads Partial(sum); hands on differs by rank" in done.stdout
            assert "the same difference in 4 places" in done.stdout and "confirmed: taking out" in done.stdout
        if command.startswith("bisectr train"):
            assert "training verdict: noise over 20 steps" in done.stdout, done.stdout
        if "--backward" in command:
            assert "verdict: noise" in done.stdout and "backward verdict: divergent" in done.stdout, done.stdout
            assert "culprit (first op whose backward differs): WrongGeluGrad" in done.stdout
            confirmed = re.search(r"confirmed: .* error from (\S+) to (\S+)", done.stdout)
            assert confirmed and 3e-4 / BAND <= float(confirmed.group(1)) <= 3e-4 * BAND
            assert float(confirmed.group(2)) <= 3e-7 * BAND


def test_every_relative_link_of_the_readme_and_docs_leads_to_a_file():
    for page in [ROOT / "README.md", *DOCS]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), (page.name, target)


def test_the_readme_is_the_front_door_and_every_docs_page_is_linked_from_it():
    assert len(README.splitlines()) <= 150
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", README))
    assert linked == {page.name for page in DOCS}
