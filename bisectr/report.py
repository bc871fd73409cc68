"""Readable text output (rich) for runs and results."""
from __future__ import annotations

import linecache
import math
import os
from typing import Any

from rich.console import Console
from rich.table import Table

from .align import Alignment
from .run import Run

_LEVELS = "▁▂▃▄▅▆▇█"
CHART_WIDTH = 64


def json_safe(value: Any) -> Any:
    """JSON has no Infinity or NaN: such numbers become None (`bisect --json`, result.json, the TUI)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def fmt(value: float | None) -> str:
    if value is None or value != value:
        return "n/a"
    return f"{value:.3g}"


def short_source(source: str) -> str:
    """`path:line` relative to the working directory when it lies below it."""
    path, _, line = source.rpartition(":")
    if not path:
        return source
    relative = os.path.relpath(path)
    return f"{path if relative.startswith('..') else relative}:{line}"


def source_text(source: str) -> str:
    path, _, line = source.rpartition(":")
    return linecache.getline(path, int(line)).strip() if path and line.isdigit() else ""


def print_trace_summary(console: Console, run: Run) -> None:
    sides = Table(title="Sides", title_justify="left")
    for column in ("side", "framework", "device", "dtype", "ops", "leaves", "stored tensors"):
        sides.add_column(column)
    for role, trace in run.traces.items():
        stored = sum(1 for t in trace.tensors.values() if t.stored)
        sides.add_row(role, trace.framework, trace.device, trace.dtype, str(len(trace.ops)), str(len(trace.leaves)), str(stored))
    console.print(sides)

    outputs = Table(title="Outputs", title_justify="left")
    for column in ("output", "shape", "max abs", "max rel", "cosine"):
        outputs.add_column(column)
    for pair in run.output_pairs():
        info = run.reference.tensors[pair.reference]
        metrics = pair.metrics
        outputs.add_row(pair.key, str(list(info.shape)), fmt(metrics["max_abs"]), fmt(metrics["max_rel"]), fmt(metrics["cosine"]))
    console.print(outputs)


def print_result(console: Console, run: Run, result: dict) -> None:
    """The search's conclusion: verdict, culprit on both sides, evidence and the error profile."""
    verdict = result["verdict"]
    style = {"match": "bold green", "noise": "bold yellow", "divergent": "bold red"}[verdict]
    ops = result["ops"]
    nonfinite = result.get("nonfinite")
    difference = ("NaN/Inf" if nonfinite else
                  f"{fmt(result['output_error']['max_abs'])} (relative {fmt(result['output_error']['max_rel'])})")
    unconfirmed = " (unconfirmed)" if is_unconfirmed(result) else ""
    console.print(f"[{style}]verdict: {verdict}[/]{unconfirmed}   outputs differ by {difference}")
    if nonfinite:
        console.print(nonfinite_text(nonfinite), highlight=False)
    if result.get("fp64_check"):
        console.print(float64_text(result["fp64_check"]), highlight=False)
    console.print(f"aligned: {ops['aligned']} of {ops['candidate']} candidate ops "
                  f"({ops['reference']} reference ops); candidate re-runs: {result['reruns']}", highlight=False)
    culprit = result["culprit"]
    if culprit is not None:
        what = "first semantic difference" if verdict == "divergent" else "most amplifying op"
        leaf = f" (its parameter {culprit['leaf']} differs)" if culprit["leaf"] else ""
        console.print(f"\nculprit ({what}): [bold]{culprit['op']}[/]{leaf}")
        for role in ("candidate", "reference"):
            site = culprit[role]
            module = site["module"] or "(top level)"
            console.print(f"  {role:9}  op {site['index']:<5} {site['op']:<28} {module}", highlight=False)
            if site["source"]:  # empty when no user code called the op (the model is one framework layer)
                console.print(f"             {short_source(site['source'])}:  {source_text(site['source'])}", highlight=False)
        if culprit.get("block"):
            console.print(f"  block      {block_text(run, culprit['block'])}", highlight=False)
        fp64 = culprit["fp64"] or {}
        console.print(f"  input error {fmt(culprit['input_error'])} -> output error {fmt(culprit['output_error'])} "
                      f"(x{fmt(culprit['amplification'])}); local error {fmt(culprit['local_error'])}", highlight=False)
        if fp64:
            console.print(f"  vs fp64: candidate {fmt(fp64['candidate_error'])}, reference {fmt(fp64['reference_error'])}"
                          f"  -> {culprit['verdict']}", highlight=False)
    for recurrence in result.get("recurrences", []):
        console.print(f"  recurs at op {recurrence['index']} {recurrence['module']} ({short_source(recurrence['source'])})", highlight=False)
    if result.get("confirmation"):
        console.print(f"  {confirmation_text(result['confirmation'])}", highlight=False)
    for item in result.get("not_blamed", []):
        console.print(f"  {not_blamed_text(item)}", highlight=False)
    if result.get("bracket"):
        console.print("")
        for line in bracket_lines(result["bracket"]):
            console.print(line, highlight=False)
    if result.get("profile"):
        console.print("\nerror by op (log scale, relative):")
        culprit_index = culprit["candidate"]["index"] if culprit else None
        for line in error_chart(result["profile"], culprit_index):
            console.print(line, highlight=False, markup=False)


def block_text(run: Run, block: dict[str, list[int]]) -> str:
    """An N:M block judged as one op: its ops and source lines on both sides."""
    def side(role: str) -> str:
        ops = [run.traces[role].ops[i] for i in block[role]]
        lines = sorted({int(op.source.rpartition(":")[2]) for op in ops if op.source})
        path = short_source(next((op.source for op in ops if op.source), "")).rpartition(":")[0]
        span = f"{lines[0]}-{lines[-1]}" if len(lines) > 1 else "".join(map(str, lines))
        return f"{role} ops {ops[0].index}..{ops[-1].index}" + (f" at {path}:{span}" if lines else "")
    return f"{side('candidate')} against {side('reference')}, compared as one op"


def is_unconfirmed(result: dict) -> bool:
    """A divergent result whose culprit no patch confirmed (it comes with a bracket)."""
    return result["verdict"] == "divergent" and not (result.get("confirmation") or {}).get("confirmed")


def float64_text(check: dict) -> str:
    """The whole-model float64 check in one line."""
    if check["status"] == "skipped":
        return f"float64 check: skipped ({check['reason']})"
    rounding = (f"rounding predicts up to {fmt(check['predicted'])} (reference {fmt(check['reference_rounding'])}, "
                f"candidate {fmt(check['candidate_rounding'])} from their own float64 outputs)")
    conclusion = "rounding" if check["status"] == "agree" else "something computes differently"
    return (f"float64 check: outputs differ by {fmt(check['error'])} as run and by {fmt(check['float64_error'])} with both sides "
            f"in float64; {rounding} -> {conclusion}")


def confirmation_text(confirmation: dict) -> str:
    """What taking the culprit's own difference out did to the outputs' error."""
    first, *recurrences = confirmation["patched_ops"]
    what = f"op {first}'s own difference" + (f" and its {len(recurrences)} recurrences' (ops {', '.join(map(str, recurrences))}: "
                                             "the same op from the same line, each judged different)" if recurrences else "")
    change = f"from {fmt(confirmation['before'])} to {fmt(confirmation['output_error'])}"
    if confirmation["confirmed"]:
        return f"confirmed: taking out only {what} takes the outputs' error {change}"
    return f"unconfirmed: taking out only {what} takes the outputs' error only {change}"


def not_blamed_text(item: dict) -> str:
    if item.get("contradicted") is not None:
        return (f"not blamed: op {item['index']} {item['op']} differs, but taking its own difference out makes the "
                f"outputs' error worse ({fmt(item['contradicted'])}): the values contradict its pairing")
    return f"not blamed: op {item['index']} {item['op']} differs but moves the outputs by only {fmt(item['reaches'])}"


BRACKET_LISTED = 12  # ops listed per side


def bracket_lines(bracket: dict) -> list[str]:
    """Where an unconfirmed difference enters: the cuts around it and the ops between, both sides."""
    low = "the start" if bracket["low"] is None else f"candidate op {bracket['low']}"
    high = "the end" if bracket["high"] is None else f"op {bracket['high']}"
    lines = [f"the difference enters between {low} (most of the error still ahead) and {high} (most of it behind):"]
    for role in ("candidate", "reference"):
        sites = bracket[role]
        lines.append(f"  {role} ops there: {len(sites)}")
        for site in sites[:BRACKET_LISTED]:
            source = f"  {short_source(site['source'])}:  {source_text(site['source'])}" if site["source"] else ""
            lines.append(f"    op {site['index']:<5} {site['op']:<28} {site['module'] or '(top level)'}{source}")
        if len(sites) > BRACKET_LISTED:
            lines.append(f"    ... and {len(sites) - BRACKET_LISTED} more")
    return lines


def nonfinite_text(nonfinite: dict) -> str:
    """Where the candidate's NaN/Inf outputs come from, in one sentence."""
    text = f"the candidate's outputs hold {nonfinite['nan']} NaN and {nonfinite['inf']} Inf (the reference's are finite)"
    first = nonfinite["first"]
    if first is None:
        return text
    site = f"op {first['index']} {first['op']} {first['module'] or '(top level)'}"
    if first["source"]:
        site += f" ({short_source(first['source'])})"
    if first["leaf"]:
        return f"{text}; they start at {first['leaf']}, read by {site}"
    return f"{text}; they start at {site}"


def error_chart(profile: list[dict], marked: int | None, width: int = CHART_WIDTH) -> list[str]:
    """Two sparklines (propagated and local error per op, bucketed) and a marker line."""
    if not profile:
        return []
    buckets = max(1, math.ceil(len(profile) / width))
    columns = [profile[i : i + buckets] for i in range(0, len(profile), buckets)]

    def line(key: str) -> str:
        values = [max((r[key] or 0.0) for r in column) for column in columns]
        logs = [math.log10(v) for v in values if v and v > 0 and math.isfinite(v)]
        low, high = (min(logs), max(logs)) if logs else (0.0, 0.0)
        chars = []
        for value in values:
            if not value or value <= 0 or not math.isfinite(value):
                chars.append(" ")
            else:
                level = 0 if high == low else int((math.log10(value) - low) / (high - low) * (len(_LEVELS) - 1))
                chars.append(_LEVELS[level])
        return "".join(chars) + f"  {fmt(10 ** low if logs else 0)}..{fmt(10 ** high if logs else 0)}"

    marker = "".join("^" if marked is not None and any(r["index"] == marked for r in column) else " " for column in columns)
    first, last = profile[0]["index"], profile[-1]["index"]
    return [f"propagated {line('output_error')}", f"local      {line('local_error')}",
            f"           {marker}", f"           op {first} .. op {last}, {buckets} op(s) per column"]


def print_substitution(console: Console, substitution: dict) -> None:
    units = len(substitution["replaced"])
    console.print(f"\nwith the reference's {', '.join(substitution['ops'])} ({units} aligned unit(s) replaced): "
                  f"outputs' error {fmt(substitution['output_error'])} (replayed as it is: {fmt(substitution['before'])})",
                  highlight=False)


OP_COLUMNS = ("op", "name", "module", "source", "mean dif", "max dif", "max rel", "local", "verdict")
ALIGNMENT_COLUMNS = ("cand op", "ref op", "op", "candidate module", "reference module", "confidence", "why")
PAIRED_BECAUSE = {
    "anchor": "same op, output shape and layer numbers, in order",
    "gap": "the best match in order between two anchors",
    "pin": "ALIGN_MODULES pins these modules together",
}


def op_rows(run: Run, result: dict) -> list[list]:
    """One row per paired candidate op (`OP_COLUMNS`): where it is and how far it is from its partner."""
    rows = []
    for row in result.get("profile", []):
        op = run.candidate.ops[row["index"]]
        rows.append([row["index"], row["op"], op.module, short_source(op.source), row.get("mean_abs"), row.get("max_abs"),
                     row["output_error"], row["local_error"], row["verdict"]])
    return rows


def alignment_rows(run: Run, alignment: Alignment) -> list[list]:
    """One row per aligned op pair (`ALIGNMENT_COLUMNS`)."""
    rows = []
    for pair in alignment.pairs:
        cand, ref = run.candidate.ops[pair.candidate], run.reference.ops[pair.reference]
        why = f"{PAIRED_BECAUSE[pair.evidence['how']]}; outputs {pair.evidence['value_distance']:.2g} apart"
        rows.append([cand.index, ref.index, cand.op, cand.module, ref.module, pair.confidence, why])
    return rows


def print_ops(console: Console, run: Run, result: dict, tsv: bool = False) -> None:
    """The numbered list of paired ops with their differences (what seeds 001/002 wrote by hand)."""
    rows = op_rows(run, result)
    if tsv:
        print_tsv(console, OP_COLUMNS, rows)
    else:
        console.print(_table("Ops (candidate numbering; differences vs the paired reference op)", OP_COLUMNS, rows,
                             no_wrap=("op", "name")))


def print_alignment(console: Console, run: Run, alignment: Alignment, tsv: bool = False) -> None:
    """The aligned op pairs, then the N:M blocks (the blocks only in the table form)."""
    rows = alignment_rows(run, alignment)
    if tsv:
        print_tsv(console, ALIGNMENT_COLUMNS, rows)
        return
    console.print(_table("Alignment (candidate -> reference)", ALIGNMENT_COLUMNS, rows))
    for block in alignment.blocks:
        state = "matched block" if block.matched else "unmatched"
        cand_ops = " ".join(f"{i}:{run.candidate.ops[i].op}" for i in block.candidate) or "-"
        ref_ops = " ".join(f"{i}:{run.reference.ops[i].op}" for i in block.reference) or "-"
        console.print(f"{state}: candidate [{cand_ops}]  reference [{ref_ops}]", highlight=False)


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
