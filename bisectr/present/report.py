"""Readable text output (rich) for runs and results."""

from __future__ import annotations

import linecache
import math
import os
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..measure.runrecord import RunRecord, unpaired_outputs
from ..measure.result import (
    BlockOps,
    Bracket,
    Confirmation,
    Culprit,
    Float64Check,
    InCompiled,
    NonFinite,
    Nondeterminism,
    NotBlamed,
    Placements,
    ProfileRow,
    Result,
    Rewired,
)
from ..leafref import LeafRef
from ..capture.trace import LOCAL_PART, RANKS_DIFFER

if TYPE_CHECKING:
    from ..generation import GenerationResult
    from ..training import TrainingResult

_LEVELS = "▁▂▃▄▅▆▇█"
CHART_WIDTH = 64


NARROW_OPS_SHOWN = 4  # ops still below float64, named in the float64 check's line


def fmt(value: float | None) -> str:
    if value is None or value != value:
        return "n/a"
    return f"{value:.3g}"


def fmt_amplification(amplification: float | None, output_error: float | None) -> str:
    """Amplification, with `inf` for an error that appears from exact inputs."""
    if amplification is None:
        return "inf" if output_error else "n/a"
    if math.isinf(amplification):
        return "inf"
    return "-" if amplification == 0 else f"x{amplification:.3g}"


def short_source(source: str) -> str:
    """`path:line` relative to the working directory when it lies below it."""
    path, _, line = source.rpartition(":")
    if not path:
        return source
    relative = os.path.relpath(path)
    return f"{path if relative.startswith('..') else relative}:{line}"


def source_text(source: str) -> str:
    """The text of the line at `path:line`; "" unless it is a line of a regular file (a saved run
    names any path it likes: a device or a pipe must not be read)."""
    path, _, line = source.rpartition(":")
    if not (path and line.isdigit() and os.path.isfile(path)):
        return ""
    return linecache.getline(path, int(line)).strip()


def print_trace_summary(console: Console, run: RunRecord) -> None:
    sides = Table(title="Sides", title_justify="left")
    for column in ("side", "framework", "device", "dtype", "ops", "leaves", "stored tensors"):
        sides.add_column(column)
    for role, trace in run.traces.items():
        stored = sum(1 for t in trace.tensors.values() if t.stored)
        ranks = getattr(run.traced, f"{role}_nproc")
        device = f"{trace.device} x {ranks} ranks" if ranks > 1 else trace.device
        sides.add_row(
            role, trace.framework, device, trace.dtype, str(len(trace.ops)), str(len(trace.leaves)), str(stored)
        )
    console.print(sides)

    outputs = Table(title="Outputs", title_justify="left")
    for column in ("output", "shape", "max abs", "max rel", "cosine"):
        outputs.add_column(column)
    for pair in run.output_pairs:
        info = run.reference.tensors[pair.reference]
        metrics = pair.metrics
        outputs.add_row(
            pair.key, str(list(info.shape)), fmt(metrics.max_abs), fmt(metrics.max_rel), fmt(metrics.cosine)
        )
    console.print(outputs)


# A line of output: (text, style) segments. Styles are named for what they mark, and mapped
# to rich styles here (`STYLES`) and to the TUI's theme (`bisectr.present.tui.widgets`).
Line = list[tuple[str, str]]
STYLES = {
    "": "",
    "bold": "bold",
    "muted": "dim",
    "accent": "cyan",
    "source": "underline",
    "code": "",
    "warning": "bold yellow",
    "match": "bold green",
    "noise": "bold yellow",
    "divergent": "bold red",
    "nondeterministic": "bold magenta",
    "exact": "green",
    "different": "bold red",
    "unknown": "dim",
}
HEADLINE = {
    "nondeterministic": "a side does not repeat itself: two of its runs differ",
    "divergent": "a semantic difference reaches the outputs",
    "noise": "the outputs differ only by rounding that some ops amplify",
    "match": "the outputs are equal within the tolerance",
}


def rich_line(line: Line) -> Text:
    return Text.assemble(*((text, STYLES.get(style, style)) for text, style in line))


def measured(result: Result) -> str:
    """What a pass's error is measured on: the model's outputs, or (backward) the gradients of its
    parameters and floating inputs."""
    return "gradients" if result.pass_ == "backward" else "outputs"


def settings_lines(result: Result) -> list[Line]:
    """The settings that change numerics which the sides ran with different values of, and what
    `--fix-nondeterminism` changed: said before any number."""
    lines: list[Line] = [
        [(f"settings differ: {d.name}: reference {d.reference}, candidate {d.candidate}", "warning")]
        for d in result.settings
    ]
    lines += [[(f"fixed before recording: {change} (--fix-nondeterminism)", "warning")] for change in result.fixed]
    return lines


def moved_text(found: Nondeterminism) -> str:
    """How the op's outputs moved between the side's two runs, and what it reads that made them."""
    if found.difference is None:
        moved = "the second run called another op there"
    else:
        moved = f"its outputs moved by at least {fmt(found.difference)} (relative)"
    return f"between the runs {moved}" + (f"; it reads {found.reads}" if found.reads else "")


def nondeterminism_lines(result: Result) -> list[Line]:
    """For `nondeterministic`: for each side that does not repeat itself, the op where its two runs part,
    why, and the fix."""
    lines: list[Line] = []
    for found in result.nondeterminism:
        lines.append(
            [
                (f"the {found.side} does not repeat itself: first op that differs between two of its runs: ", ""),
                (found.op.op, "bold"),
            ]
        )
        lines.append([(f"  {found.side:9}  op {found.op.index:<5} ", ""), (found.op.module or "(top level)", "accent")])
        if found.op.source:
            lines.append(source_line(found.op.source))
        lines.append([(f"  {moved_text(found)}", "")])
        lines.append([("  cause: ", ""), (found.cause, "bold")])
        lines.append([(f"  fix: {found.fix}", "")])
        if found.fixable:
            lines.append([("  (--fix-nondeterminism does this and searches as usual)", "muted")])
    return lines


def verdict_lines(result: Result) -> list[Line]:
    """The settings that differ, the verdict, the outputs' difference, where NaN/Inf start and the float64 check."""
    error = result.output_error
    difference = "NaN/Inf" if result.nonfinite else f"{fmt(error.max_abs)} (relative {fmt(error.max_rel)})"
    unconfirmed = " (unconfirmed)" if result.unconfirmed else ""
    label = "backward verdict" if result.pass_ == "backward" else "verdict"
    lines: list[Line] = [] if result.pass_ == "backward" else settings_lines(result)
    lines += [
        [
            (f"{label}: {result.verdict}", result.verdict),
            (unconfirmed, "warning"),
            (f"   {measured(result)} differ by {difference}", ""),
        ]
    ]
    if result.losses:
        lines.append(
            [
                (
                    f"losses: reference {fmt(result.losses.get('reference'))}, "
                    f"candidate {fmt(result.losses.get('candidate'))}",
                    "",
                )
            ]
        )
    for plainly in (result.missing_gradient, result.unreduced_gradient):
        if plainly:
            lines.append([(plainly, "warning")])
    if result.nonfinite:
        lines.append([(nonfinite_text(result.nonfinite), "")])
    if result.fp64_check:
        lines.append([(float64_text(result.fp64_check, measured(result)), "")])
    if result.leaves is not None and result.leaves.summary:
        lines.append([(f"parameters and buffers: {result.leaves.summary}", "")])
    return lines


def culprit_lines(run: RunRecord, result: Result, listed: int | None = None) -> list[Line]:
    """The culprit on both sides with its source lines, the evidence, the confirmation, what was not
    blamed and (unconfirmed) the bracket. `listed` caps the recurrences and not-blamed items shown."""
    if result.verdict == "nondeterministic":
        return nondeterminism_lines(result)
    culprit = result.culprit
    lines: list[Line] = []
    backward = result.pass_ == "backward"
    if culprit is not None:
        what = culprit_role(result)
        leaf = (
            f" (its parameter {culprit.leaf} {'gets a gradient on one side only' if backward else 'differs'})"
            if culprit.leaf
            else ""
        )
        if culprit.description:
            leaf = (
                f" (the leaf {culprit.leaf}: {culprit.description}; "
                f"the reference's {culprit.reference_leaf}, {culprit.layout})"
            )
        name = compiled_code_name(culprit) if culprit.compiled else culprit.op
        lines.append([(f"culprit ({what}): ", ""), (name, "bold"), (leaf, "")])
        for role in ("candidate", "reference"):
            site = getattr(culprit, role)
            lines.append(
                [(f"  {role:9}  op {site.index:<5} {site.op:<28} ", ""), (site.module or "(top level)", "accent")]
            )
            if (
                site.source
            ):  # empty where only bisectr called it (the side's model is a framework function) and in older runs
                lines.append(source_line(site.source))
        if culprit.compiled:
            lines += compiled_lines(run, culprit.compiled)
        elif culprit.block:
            lines.append([(f"  block      {block_text(run, culprit.block, culprit.reference.index)}", "")])
            lines += [
                source_line(source)
                for source in block_sources(run, culprit.block)
                if source != culprit.candidate.source
            ]
        if culprit.cause:
            lines.append([(f"  why: {culprit.cause}", "")])
        if culprit.rewired:
            lines += rewired_lines(culprit.rewired)
        if culprit.placements:
            lines.append([(f"  {placements_text(culprit.placements)}", "")])
        if culprit.kind == "leaf" and culprit.local_error is None and culprit.input_error is None:
            pass  # a leaf compared by its values: no op evidence
        elif backward:
            lines.append(
                [
                    (
                        f"  gradient error reaching it {fmt(culprit.output_error_rel)} (relative); "
                        f"local backward error {fmt(culprit.local_error)}",
                        "",
                    )
                ]
            )
        else:
            lines.append(
                [
                    (
                        f"  input error {fmt(culprit.input_error)} -> output error {fmt(culprit.output_error)} "
                        f"({fmt_amplification(culprit.amplification, culprit.output_error)}); "
                        f"local error {fmt(culprit.local_error)}",
                        "",
                    )
                ]
            )
        if culprit.fp64:
            lines.append(
                [
                    (
                        f"  vs fp64: candidate {fmt(culprit.fp64.candidate_error)}, reference "
                        f"{fmt(culprit.fp64.reference_error)}  -> ",
                        "",
                    ),
                    (culprit.verdict, culprit.verdict),
                ]
            )
        elif culprit.fp64_unavailable:
            lines.append([(f"  vs fp64: no oracle ({culprit.fp64_unavailable})", "muted")])
    lines += recurrence_lines(result, listed)
    if result.confirmation:
        block = culprit.block if culprit is not None else None
        lines.append(
            [
                (
                    f"  {confirmation_text(result.confirmation, measured(result), block)}",
                    "" if result.confirmation.confirmed else "warning",
                )
            ]
        )
    for item in result.not_blamed[:listed]:
        lines.append([(f"  {not_blamed_text(item)}", "muted")])
    if result.bracket:
        lines.append([])
        lines += [[(line, "")] for line in bracket_lines(result.bracket)]
    return lines


def culprit_role(result: Result) -> str:
    """What the culprit is to its pass: "first semantic difference", "most amplifying op", ..."""
    if result.pass_ == "backward" and result.missing_gradient:
        return "a gradient one side lacks"
    if result.pass_ == "backward" and result.unreduced_gradient:
        return "a gradient its ranks never reduced"
    if result.pass_ == "backward":
        return (
            "first op whose backward differs" if result.verdict == "divergent" else "where most gradient error enters"
        )
    return "first semantic difference" if result.verdict == "divergent" else "most amplifying op"


def compiled_code_name(culprit: Culprit) -> str:
    """A compiled module's call named as the culprit."""
    return f"the compiled code of {culprit.candidate.module or 'the model'}"


def compiled_lines(run: RunRecord, found: InCompiled) -> list[Line]:
    """Where inside the compiled module its compiled code differs: module, op, compiler step, proof."""
    lines: list[Line] = [
        [
            (
                f"  compiled   by {found.backend}: on the recorded inputs its compiled code differs from its eager "
                f"code by {fmt(found.error)}",
                "",
            )
        ],
        [
            ("  module     ", ""),
            (found.module or "(the whole model)", "accent"),
            (f" ({found.module_class}): compiled alone, {fmt(found.module_error)}", ""),
        ],
    ]
    if found.op is not None:
        eager = (
            f"; the eager side's op {', '.join(map(str, found.eager_ops[:4]))} at this line" if found.eager_ops else ""
        )
        what = (
            "on a line the eager code never runs: the compiled code takes another path"
            if found.other_path
            else f"compiled, {fmt(found.op_error)} from float64{eager}"
        )
        lines.append([("  op         ", ""), (found.op, "bold"), (f": {what}", "")])
        if found.source:
            lines.append(source_line(found.source))
    else:
        lines.append(
            [
                (
                    "  op         none found: no op of its graph differs compiled alone, "
                    "and the graph runs no line its eager "
                    "code does not",
                    "muted",
                )
            ]
        )
    lines.append([(f"  step       {found.step}" + (f" ({found.step_detail})" if found.step_detail else ""), "")])
    if found.eager_modules:
        listed = ", ".join(found.eager_modules[:3]) + (
            f" and {len(found.eager_modules) - 3} more" if len(found.eager_modules) > 3 else ""
        )
        verdict = "confirmed" if found.confirmed else "not confirmed"
        lines.append(
            [
                (
                    f"  {verdict}: with every {found.module_class} eager ({listed}), "
                    "the compiled module's error goes from "
                    f"{fmt(found.error)} to {fmt(found.confirmed_error)} (its eager rounding {fmt(found.rounding)})",
                    "" if found.confirmed else "warning",
                )
            ]
        )
    lines.append([(f"  {found.compiles} compiles, {found.seconds:.0f} s", "muted")])
    return lines


def placements_text(placements: Placements) -> str:
    """How the candidate's ranks held what the culprit reads and hands on."""

    def listed(held: list[str]) -> str:
        return (
            ", ".join(
                f"{placement} x{held.count(placement)}" if held.count(placement) > 1 else placement
                for placement in dict.fromkeys(held)
            )
            or "nothing"
        )

    own = {LOCAL_PART, RANKS_DIFFER} & {*placements.reads, *placements.hands_on}
    return f"on {placements.ranks} ranks: reads {listed(placements.reads)}; hands on {listed(placements.hands_on)}" + (
        " (each rank's own values; rank 0's shown)" if own else ""
    )


def rewired_lines(rewired: Rewired) -> list[Line]:
    """Where the culprit's two sides read different tensors: the counterpart the candidate skips, and what it reads."""
    instead = f"op {rewired.reads.index} ({rewired.reads.op})" if rewired.reads else leaf_text(rewired.reads_leaf)
    lines: list[Line] = [
        [
            (
                f"  wired differently: the reference's reads op {rewired.reference_input.index} "
                f"({rewired.reference_input.op}), whose counterpart candidate op {rewired.counterpart.index} "
                f"({rewired.counterpart.op}) the candidate's does not read; it reads {instead} instead:",
                "warning",
            )
        ]
    ]
    lines += [source_line(s) for s in (rewired.counterpart.source, rewired.reads.source if rewired.reads else "") if s]
    return lines


def leaf_text(leaf: str | None) -> str:
    """`the model's input 0` for `input:0`, `parameter h.0.w` for `param:h.0.w`."""
    if not leaf:
        return "another tensor"
    ref = LeafRef.parse(leaf)
    return {
        "input": f"the model's input {ref.name}",
        "param": f"parameter {ref.name}",
        "buffer": f"buffer {ref.name}",
        "const": f"constant {ref.name}",
    }.get(ref.kind, leaf)


def recurrence_lines(result: Result, listed: int | None = None) -> list[Line]:
    """A difference made in several places: every occurrence (the first is the culprit) with the share
    of the error it makes alone."""
    if not result.recurrences:
        return []
    count = len(result.recurrences)
    measured = any(item.share is not None for item in result.recurrences)
    shares = "; share of the error each makes alone:" if measured else ":"
    lines: list[Line] = [[(f"  the same difference in {count} places (the first is the culprit){shares}", "")]]
    for item in result.recurrences[:listed]:
        share = ("not measured" if item.share is None else f"{item.share:.0%}") if measured else ""
        lines.append(
            [
                (
                    f"    op {item.index:<5} {item.module or '(top level)':<36} "
                    f"{share:>12}  ({short_source(item.source)})",
                    "",
                )
            ]
        )
    if listed is not None and count > listed:
        lines.append([(f"    ... and {count - listed} more", "muted")])
    return lines


def print_result(console: Console, run: RunRecord, result: Result) -> None:
    """The search's conclusion: verdict, culprit on both sides, evidence and the error profile."""
    for line in verdict_lines(result):
        console.print(rich_line(line), highlight=False)
    ops = result.ops
    console.print(
        f"aligned: {ops.aligned} of {ops.candidate} candidate ops "
        f"({ops.reference} reference ops); candidate re-runs: {result.reruns}",
        highlight=False,
    )
    for role, keys in unpaired_outputs(run).items():
        if keys:
            listed = ", ".join(repr(k) for k in keys)
            console.print(
                f"not compared: the {role}'s output {listed} (the other side has none of its key)", highlight=False
            )
    lines = culprit_lines(run, result)
    if result.culprit is not None:
        console.print()
    for line in lines:
        console.print(rich_line(line), highlight=False)
    if result.profile:
        console.print(
            f"\n{'gradient error' if result.pass_ == 'backward' else 'error'} by op (log scale, relative):",
            highlight=False,
        )
        culprit_index = result.culprit.candidate.index if result.culprit else None
        for line in error_chart(result.profile, culprit_index):
            console.print(line, highlight=False, markup=False)
    if result.backward is not None:
        console.print("\nbackward pass:", style="bold", highlight=False)
        if result.backward.activations == "reference":
            console.print(
                "the forward differs: the candidate's backward ran through its own ops at the reference's "
                "forward values, so that its gradients differ by what its backward does alone",
                highlight=False,
            )
        print_result(console, run, result.backward)


def ops_text(indices: list[int]) -> str:
    """`op 3`, or `ops 3..7` for the first and last of several."""
    return f"op {indices[0]}" if len(indices) == 1 else f"ops {indices[0]}..{indices[-1]}"


def source_line(source: str) -> Line:
    """`path:line:  text`, indented under an op."""
    return [("             ", ""), (short_source(source), "source"), (f":  {source_text(source)}", "code")]


def block_sources(run: RunRecord, block: BlockOps) -> list[str]:
    """The source lines of a block's candidate ops, each once, in op order."""
    return list(dict.fromkeys(run.candidate.ops[i].source for i in block.candidate if run.candidate.ops[i].source))


def block_text(run: RunRecord, block: BlockOps, reference_op: int) -> str:
    """An N:M block judged as one op: its ops and source lines on both sides (for ops the reference has
    no partner for, the reference op `reference_op` whose output they are compared with)."""

    def side(role: str) -> str:
        ops = [run.traces[role].ops[i] for i in getattr(block, role)]
        if not ops:
            return f"no {role} ops"
        by_path: dict[str, set[int]] = {}  # a block's ops may come from several files (library layers)
        for op in ops:
            path, _, line = short_source(op.source).rpartition(":")
            if path and line.isdigit():
                by_path.setdefault(path, set()).add(int(line))
        spans = [
            f"{path}:{min(lines)}-{max(lines)}" if len(lines) > 1 else f"{path}:{min(lines)}"
            for path, lines in by_path.items()
        ]
        return f"{role} {ops_text([op.index for op in ops])}" + (f" at {', '.join(spans)}" if spans else "")

    if not block.reference:
        return (
            f"{side('candidate')}, where no reference op corresponds: compared as one op with reference op "
            f"{reference_op}'s output, which the reference passes on unchanged"
        )
    return f"{side('candidate')} against {side('reference')}, compared as one op"


def float64_text(check: Float64Check, compared: str = "outputs") -> str:
    """The whole-model float64 check of the `compared` tensors in one line."""
    if check.status == "skipped":
        return f"float64 check: skipped ({check.reason})" + _narrow_text(check)
    rounding = (
        f"rounding predicts up to {fmt(check.predicted)} (reference {fmt(check.reference_rounding)}, "
        f"candidate {fmt(check.candidate_rounding)} from their own float64 {compared})"
    )
    conclusion = "rounding" if check.status == "agree" else "something computes differently"
    text = (
        f"float64 check: {compared} differ by {fmt(check.error)} as run "
        f"and by {fmt(check.float64_error)} with both sides "
        f"in float64; {rounding} -> {conclusion}"
    )
    if check.rounded_leaves:
        text += f"; {check.rounded_leaves}"
    return text + _narrow_text(check)


def _narrow_text(check: Float64Check) -> str:
    text = ""
    for role, ops in check.narrow_ops.items():
        shown = ", ".join(ops[:NARROW_OPS_SHOWN]) + (
            f" and {len(ops) - NARROW_OPS_SHOWN} more" if len(ops) > NARROW_OPS_SHOWN else ""
        )
        text += f"; still below float64 on the {role}: {shown}"
    return text


def confirmation_text(confirmation: Confirmation, errors_of: str = "outputs", block: BlockOps | None = None) -> str:
    """What taking the culprit's own difference out did to the outputs' (`errors_of`) error (the culprit
    a `block`: its ops')."""
    first, *recurrences = confirmation.patched_ops or ["?"]
    several = block is not None and len(block.candidate) > 1 and first in block.candidate
    own = f"the block's ({ops_text(block.candidate)})" if several else f"op {first}'s"
    what = f"{own} own difference" + (f" and its {len(recurrences)} recurrences' together" if recurrences else "")
    if confirmation.leaves:
        readers = f"op {first}" if not recurrences else f"ops {', '.join(map(str, confirmation.patched_ops))}"
        what = (
            f"the reference's values for {confirmation.leaves} leaf (read by {readers})"
            if confirmation.leaves == 1
            else f"the reference's values for these {confirmation.leaves} leaves (read by {readers})"
        )
    if confirmation.cut:
        what = f"the reference's gradient where op {first} cuts the candidate's"
    change = f"from {fmt(confirmation.before)} to {fmt(confirmation.output_error)}"
    action = (
        "giving the candidate only" if confirmation.leaves else "handing on" if confirmation.cut else "taking out only"
    )
    if confirmation.confirmed:
        return f"confirmed: {action} {what} takes the {errors_of}' error {change}"
    return f"unconfirmed: {action} {what} takes the {errors_of}' error only {change}"


def not_blamed_text(item: NotBlamed) -> str:
    if item.contradicted is not None:
        return (
            f"not blamed: op {item.index} {item.op} differs, but taking its own difference out makes the "
            f"outputs' error worse ({fmt(item.contradicted)}): the values contradict its pairing"
        )
    return f"not blamed: op {item.index} {item.op} differs but moves the outputs by only {fmt(item.reaches)}"


BRACKET_LISTED = 12  # ops listed per side


def bracket_lines(bracket: Bracket) -> list[str]:
    """Where an unconfirmed difference enters: the cuts around it and the ops between, both sides."""
    low = "the start" if bracket.low is None else f"candidate op {bracket.low}"
    high = "the end" if bracket.high is None else f"op {bracket.high}"
    lines = [f"{bracket.why}."] if bracket.why else []
    lines.append(f"the difference enters between {low} (most of the error still ahead) and {high} (most of it behind):")
    for role in ("candidate", "reference"):
        sites = getattr(bracket, role)
        lines.append(f"  {role} ops there: {len(sites)}")
        for site in sites[:BRACKET_LISTED]:
            source = f"  {short_source(site.source)}:  {source_text(site.source)}" if site.source else ""
            lines.append(f"    op {site.index:<5} {site.op:<28} {site.module or '(top level)'}{source}")
        if len(sites) > BRACKET_LISTED:
            lines.append(f"    ... and {len(sites) - BRACKET_LISTED} more")
    return lines


def nonfinite_text(nonfinite: NonFinite) -> str:
    """Where the candidate's NaN/Inf outputs come from, in one sentence."""
    text = f"the candidate's outputs hold {nonfinite.nan} NaN and {nonfinite.inf} Inf (the reference's are finite)"
    first = nonfinite.first
    if first is None:
        return text
    site = f"op {first.index} {first.op} {first.module or '(top level)'}"
    if first.source:
        site += f" ({short_source(first.source)})"
    if first.leaf:
        return f"{text}; they start at {first.leaf}, read by {site}"
    return f"{text}; they start at {site}"


def error_chart(profile: list[ProfileRow], marked: int | None, width: int = CHART_WIDTH) -> list[str]:
    """Two sparklines (propagated and local error per op, bucketed) and a marker line."""
    if not profile:
        return []
    buckets = max(1, math.ceil(len(profile) / width))
    columns = [profile[i : i + buckets] for i in range(0, len(profile), buckets)]

    def line(key: str) -> str:
        values = [max((getattr(r, key) or 0.0) for r in column) for column in columns]
        logs = [math.log10(v) for v in values if v and v > 0 and math.isfinite(v)]
        low, high = (min(logs), max(logs)) if logs else (0.0, 0.0)
        chars = []
        for value in values:
            if not value or value <= 0 or not math.isfinite(value):
                chars.append(" ")
            else:
                level = 0 if high == low else int((math.log10(value) - low) / (high - low) * (len(_LEVELS) - 1))
                chars.append(_LEVELS[level])
        return "".join(chars) + f"  {fmt(10**low if logs else 0)}..{fmt(10**high if logs else 0)}"

    marker = "".join(
        "^" if marked is not None and any(r.index == marked for r in column) else " " for column in columns
    )
    first, last = profile[0].index, profile[-1].index
    return [
        f"propagated {line('output_error')}",
        f"local      {line('local_error')}",
        f"           {marker}",
        f"           op {first} .. op {last}, {buckets} op(s) per column",
    ]


def print_substitution(console: Console, substitution: dict) -> None:
    units = len(substitution["replaced"])
    console.print(
        f"\nwith the reference's {', '.join(substitution['ops'])} ({units} aligned unit(s) replaced): "
        f"outputs' error {fmt(substitution['output_error'])} (replayed as it is: {fmt(substitution['before'])})",
        highlight=False,
    )


OP_COLUMNS = ("op", "name", "module", "source", "mean dif", "max dif", "max rel", "local", "verdict")
ALIGNMENT_COLUMNS = ("cand op", "ref op", "op", "candidate module", "reference module", "confidence", "why")
LEAF_COLUMNS = ("candidate leaf", "reference leaf", "layout", "status", "how it differs")
PAIRED_BECAUSE = {
    "anchor": "same op, output shape and layer numbers, in order",
    "gap": "the best match in order between two anchors",
    "pin": "ALIGN_MODULES pins these modules together",
    "flow:value": "their outputs hold the same values",
    "flow:output": "they make the paired model outputs",
    "flow:table": "they make the same table from no parameter",
    "flow:weight": "they read the same weights first",
    "flow:flow": "what they compute from paired inputs holds the same values",
    "flow:sum": "their outputs add up to the same values",
    "flow:frontier": "their outputs hold the same values where the first difference enters",
}


def op_rows(run: RunRecord, result: Result) -> list[list]:
    """One row per paired candidate op (`OP_COLUMNS`): where it is and how far it is from its partner."""
    rows = []
    for row in result.profile:
        op = run.candidate.ops[row.index]
        rows.append(
            [
                row.index,
                row.op,
                op.module,
                short_source(op.source),
                row.mean_abs,
                row.max_abs,
                row.output_error,
                row.local_error,
                row.verdict,
            ]
        )
    return rows


def alignment_rows(run: RunRecord) -> list[list]:
    """One row per aligned op pair (`ALIGNMENT_COLUMNS`)."""
    rows = []
    for pair in run.alignment.pairs:
        cand, ref = run.candidate.ops[pair.candidate], run.reference.ops[pair.reference]
        why = (
            f"{PAIRED_BECAUSE.get(pair.evidence.how, pair.evidence.how)}; "
            f"outputs {pair.evidence.value_distance:.2g} apart"
        )
        rows.append([cand.index, ref.index, cand.op, cand.module, ref.module, pair.confidence, why])
    return rows


def print_ops(console: Console, run: RunRecord, result: Result, tsv: bool = False) -> None:
    """The numbered list of paired ops with their differences (what seeds 001/002 wrote by hand)."""
    rows = op_rows(run, result)
    if tsv:
        print_tsv(console, OP_COLUMNS, rows)
    else:
        console.print(
            _table(
                "Ops (candidate numbering; differences vs the paired reference op)",
                OP_COLUMNS,
                rows,
                no_wrap=("op", "name"),
            )
        )


def print_alignment(console: Console, run: RunRecord, tsv: bool = False) -> None:
    """The aligned op pairs, then the N:M blocks and the leaf pairs (those only in the table form)."""
    rows = alignment_rows(run)
    if tsv:
        print_tsv(console, ALIGNMENT_COLUMNS, rows)
        return
    console.print(_table("Alignment (candidate -> reference)", ALIGNMENT_COLUMNS, rows))
    for block in run.alignment.blocks:
        state = "matched block" if block.matched else "unmatched"
        cand_ops = " ".join(f"{i}:{run.candidate.ops[i].op}" for i in block.candidate) or "-"
        ref_ops = " ".join(f"{i}:{run.reference.ops[i].op}" for i in block.reference) or "-"
        console.print(f"{state}: candidate [{cand_ops}]  reference [{ref_ops}]", highlight=False)
    leaves = run.alignment.leaves
    if leaves.pairs:
        leaf_rows = [[p.candidate, p.reference, p.layout, p.status, p.description] for p in leaves.pairs]
        console.print(_table("Leaves (candidate -> reference)", LEAF_COLUMNS, leaf_rows))
    for leaf in leaves.unpaired:
        console.print(f"unpaired {leaf.side} leaf {leaf.name}: {leaf.reason}", highlight=False)


def _table(title: str, columns: tuple[str, ...], rows: list[list], no_wrap: tuple[str, ...] = ()) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, no_wrap=column in no_wrap)
    for row in rows:
        table.add_row(*(fmt(value) if value is None or isinstance(value, float) else str(value) for value in row))
    return table


def print_tsv(console: Console, columns: tuple[str, ...], rows: list[list]) -> None:
    """Tab-separated values: a header line, then one line per row, numbers at full precision,
    `n/a` where a number is missing. Written past rich, which would expand the tabs."""
    lines = ["\t".join(columns)] + ["\t".join(_tsv_cell(value) for value in row) for row in rows]
    console.file.write("\n".join(lines) + "\n")


def _tsv_cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "n/a"
    return repr(value) if isinstance(value, float) else str(value)


def training_lines(result: TrainingResult) -> list[Line]:
    """`bisectr train`'s conclusion: the verdict over steps, and the stage's culprit or what was not searched."""
    steps = len(result.steps)
    if result.verdict == "divergent":
        head = f"training verdict: divergent at step {result.first_step} of {steps} (stage: {result.stage})"
    elif result.verdict == "nondeterministic":
        head = (
            f"training verdict: nondeterministic: the sides part at step {result.first_step} of {steps}, and a side's "
            "forward at the initial weights does not repeat itself"
        )
    elif result.verdict == "noise":
        head = (
            f"training verdict: noise over {steps} steps: in float64 both sides agree at every step; "
            "the difference is rounding"
        )
    else:
        head = f"training verdict: match over {steps} steps"
    lines: list[Line] = [[(head, result.verdict)]]
    culprit = result.culprit
    if culprit is not None and culprit.kind == "reduction":
        lines.append([(f"culprit: the {culprit.side}'s reduction across its ranks: ", ""), (culprit.what, "bold")])
        names = culprit.parameters
        listed = ", ".join(names) if len(names) <= 6 else f"{', '.join(names[:4])} and {len(names) - 4} more"
        lines.append([(f"  parameters ({len(names)}): ", ""), (listed, "accent")])
    elif culprit is not None and not isinstance(culprit, Culprit):
        lines.append(
            [
                ("culprit: the optimizer's ", ""),
                (culprit.field, "bold"),
                (f" (reference {culprit.reference}, candidate {culprit.candidate}); parameter ", ""),
                (culprit.parameter, "accent"),
                (
                    f"'s update differs by {fmt(culprit.update_error)} "
                    "(relative, both sides in float64, from the same gradients)",
                    "",
                ),
            ]
        )
    elif culprit is not None:
        what = "first op whose backward differs" if result.stage == "backward" else "first semantic difference"
        if result.verdict == "nondeterministic":
            what = "first op that differs between two runs of the side"
        lines.append([(f"culprit ({what}): ", ""), (culprit.op, "bold")])
        sides = ("candidate", "reference")
        if result.verdict == "nondeterministic":  # both sites are the op of the side named in the note
            sides = ("candidate",)
        for role in sides:
            site = getattr(culprit, role)
            role = "" if result.verdict == "nondeterministic" else role
            lines.append(
                [(f"  {role:9}  op {site.index:<5} {site.op:<28} ", ""), (site.module or "(top level)", "accent")]
            )
            if site.source:
                lines.append(source_line(site.source))
    if result.note:
        lines.append([(result.note, "warning")])
    return lines


TRAINING_COLUMNS = (
    "step",
    "loss ref",
    "loss cand",
    "loss err",
    "grad err",
    "update err",
    "moments err",
    "rounding predicts",
    "float64 differ",
    "lr ref",
    "lr cand",
    "",
)


def training_rows(result: TrainingResult) -> list[list[str]]:
    """One row per step (`TRAINING_COLUMNS`); rounding predicts and float64 differ: the update of the
    parameter whose float64 difference rounding explains least (see `StepRow`)."""
    return [
        [
            str(row.step),
            fmt(row.loss.reference),
            fmt(row.loss.candidate),
            fmt(row.error.loss),
            fmt(row.error.gradient),
            fmt(row.error.update),
            fmt(row.error.moments),
            fmt(row.predicted.update),
            fmt(row.float64_error.update),
            fmt(row.learning_rate.reference),
            fmt(row.learning_rate.candidate),
            "semantic" if row.semantic else "",
        ]
        for row in result.steps
    ]


def print_training(console: Console, result: TrainingResult) -> None:
    """`bisectr train`: the conclusion, the loss curves and the per-step table."""
    for line in training_lines(result):
        console.print(rich_line(line), highlight=False)
    for role in ("reference", "candidate"):
        losses = [getattr(row.loss, role) for row in result.steps]
        console.print(
            f"loss, {role:9}  {sparkline(losses)}  {fmt(losses[0])} -> {fmt(losses[-1])}", highlight=False, markup=False
        )
    console.print(
        _table(
            "Steps (errors relative; rounding predicts and float64 differ: the update of the parameter "
            "rounding explains least)",
            TRAINING_COLUMNS,
            training_rows(result),
        )
    )


def sparkline(values: list[float]) -> str:
    """One character per value, scaled between the smallest and the largest."""
    finite = [v for v in values if math.isfinite(v)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 0.0)
    return "".join(
        " "
        if not math.isfinite(v)
        else _LEVELS[0 if high == low else int((v - low) / (high - low) * (len(_LEVELS) - 1))]
        for v in values
    )


def generation_lines(result: GenerationResult) -> list[Line]:
    """`bisectr generate`'s conclusion: the verdict over steps, the first flip and the step searched."""
    steps = len(result.steps)
    if result.verdict == "divergent":
        entered = f"at step {result.culprit_step}"
        if result.first_divergent_step != result.culprit_step:
            later = (
                f"the logits first differ at step {result.first_divergent_step}"
                if result.first_divergent_step is not None
                else "the logits never differ beyond rounding"
            )
            entered += f" (the cache it writes differs; {later})"
        head = f"generation verdict: divergent {entered}, over {steps} steps (0: the prefill)"
    elif result.verdict == "nondeterministic":
        head = (
            f"generation verdict: nondeterministic: step {result.culprit_step} differs, and inside it a side does not "
            "repeat itself"
        )
    elif result.verdict == "noise":
        head = (
            f"generation verdict: noise over {steps} steps (0: the prefill): in float64 both sides agree at every "
            "step; the difference is rounding"
        )
    else:
        head = f"generation verdict: match over {steps} steps (0: the prefill)"
    lines: list[Line] = [[(head, result.verdict)]]
    flip = result.first_flip
    if flip is None:
        lines.append([("top-1 tokens: the same at every step", "")])
    else:
        kind = "a rounding flip (a near-tie)" if flip.rounding else "a real difference"
        lines.append(
            [
                (
                    f"first flip: step {flip.step}, row {flip.row}: reference token {flip.reference_token}, candidate "
                    f"{flip.candidate_token}, {fmt(flip.margin)} below the reference's top-1 there: {kind}",
                    "warning" if flip.rounding else "",
                )
            ]
        )
    if result.note:
        lines.append([(result.note, "warning")])
    return lines


GENERATION_COLUMNS = (
    "step",
    "tokens ref",
    "tokens cand",
    "logits err",
    "rounding predicts",
    "float64 differ",
    "margin",
    "cache err",
    "cache float64",
    "",
)


def generation_rows(result: GenerationResult) -> list[list[str]]:
    """One row per step (`GENERATION_COLUMNS`); cache: the entry rounding explains least."""
    return [
        [
            str(row.step),
            " ".join(map(str, row.reference_tokens)),
            " ".join(map(str, row.candidate_tokens)),
            fmt(row.logits.error),
            fmt(row.logits.rounding),
            fmt(row.logits.float64_error),
            fmt(row.margin),
            fmt(row.cache.error) if row.cache else "n/a",
            fmt(row.cache.float64_error) if row.cache else "n/a",
            row.verdict if row.verdict == "divergent" else "",
        ]
        for row in result.steps
    ]


def print_generation(console: Console, result: GenerationResult) -> None:
    """`bisectr generate`: the conclusion, the per-step table, then the search inside the step it names."""
    for line in generation_lines(result):
        console.print(rich_line(line), highlight=False)
    console.print(
        _table(
            "Steps (logits of the last position; errors relative; cache: the entry rounding explains least)",
            GENERATION_COLUMNS,
            generation_rows(result),
        )
    )
    if result.search is not None and result.run is not None:
        console.print(f"\ninside step {result.culprit_step}:", highlight=False)
        print_result(console, result.run, result.search)
