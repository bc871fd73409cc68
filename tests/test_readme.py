"""The README's commands run, and the output it quotes is what they print."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def shell_commands() -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", README, re.S)


def quoted_output(after: str) -> list[str]:
    """Lines of the first plain code block following `after`."""
    block = re.search(r"```\n(.*?)\n```", README[README.index(after):], re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
CHART = re.compile("[▁▂▃▄▅▆▇█^]")
BAND = 3.0  # quoted real numbers hold within this factor on any x86 CPU (BLAS kernels differ)


def shape(line: str) -> str:
    """A line with its numbers masked, and the two span heads' names merged: which of the two
    span matmuls amplifies rounding more depends on the CPU's kernels."""
    return re.sub(r"\b(start|end)_", "span_", NUMBER.sub("#", line.rstrip()))


def reals(line: str) -> list[float]:
    return [float(n) for n in NUMBER.findall(line) if "." in n or "e" in n]


def assert_quoted_output_printed(quoted: list[str], printed: list[str]) -> None:
    """Every quoted line but the chart's is printed, its words as quoted and its real numbers within `BAND`."""
    by_shape = {shape(line): line for line in printed}
    for line in quoted:
        if CHART.search(line) or line.lstrip().startswith("op "):
            continue
        assert shape(line) in by_shape, line
        for want, got in zip(reals(line), reals(by_shape[shape(line)])):
            assert want / BAND <= got <= want * BAND or want == got, (line, by_shape[shape(line)])


def run_bisectr(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bisectr", *args], capture_output=True, text=True, cwd=ROOT)


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second():
    setup_and_trace, setup_and_test = shell_commands()[:2]
    assert README.index(setup_and_trace) < 400
    assert setup_and_trace.endswith("bisectr trace examples/span_head.py")
    assert setup_and_test in (ROOT / ".ci" / "run").read_text()


def test_span_head_walkthrough_output_is_real():
    done = run_bisectr("trace", "examples/span_head.py", "--no-tui")
    assert done.returncode == 0, done.stderr
    assert_quoted_output_printed(quoted_output("`bisectr trace examples/span_head.py --no-tui` prints"), done.stdout.splitlines())


def test_divergent_walkthrough_output_is_real():
    done = run_bisectr("bisect", "examples/tanh_gelu.py")
    assert done.returncode == 1, done.stderr
    assert_quoted_output_printed(quoted_output("A real bug looks like this"), done.stdout.splitlines())


def test_every_other_readme_command_runs():
    for command in shell_commands()[2:]:
        program, *args = command.split()
        assert program == "bisectr", command
        done = run_bisectr(*args)
        assert done.returncode in (0, 1), (command, done.stderr)
        if "--substitute rounding" in command:
            replayed = re.search(r"outputs' error 0 \(replayed as it is: (\S+)\)", done.stdout)
            assert replayed and 2.17e-07 / BAND <= float(replayed.group(1)) <= 2.17e-07 * BAND
        if command.startswith("bisectr train"):
            assert "training verdict: noise over 20 steps" in done.stdout, done.stdout
        if "--backward" in command:
            assert "verdict: noise" in done.stdout and "backward verdict: divergent" in done.stdout, done.stdout
            assert "culprit (first op whose backward differs): WrongGeluGrad" in done.stdout
            confirmed = re.search(r"confirmed: .* error from (\S+) to (\S+)", done.stdout)
            assert confirmed and 3e-4 / BAND <= float(confirmed.group(1)) <= 3e-4 * BAND
            assert float(confirmed.group(2)) <= 3e-7 * BAND
