"""A standalone reproduction of one op, in both frameworks (`bisect --repro DIR`, the TUI's `e`).

The directory gets `inputs.npz` (the reference op's inputs, the same inputs in the
candidate's layout with the candidate's own parameters, both recorded outputs) and
`repro.py`, which needs only numpy and the two frameworks: it runs both ops on those
inputs, in their recorded precision and upcast to float64, and prints each op's error
against the float64 oracle (the reference op in float64).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..adapters import adapter_named, registered
from ..adapters.base import ReproSnippets
from ..capture.calls import Call, Slot
from .report import short_source, source_text
from ..measure.runrecord import RunRecord, output_seeds
from ..sides.runner import Backward, RecordedCall
from ..measure.live import LiveRun
from ..capture.trace import is_floating


def _snippets(framework: str) -> ReproSnippets:
    snippets = adapter_named(framework).repro
    if snippets is None:
        raise ValueError(f"the {framework} adapter writes no repro scripts")
    return snippets


def repro_upstream(live: LiveRun, cand_index: int, ref_index: int) -> dict[str, list[np.ndarray | None]]:
    """For a backward repro (`write_repro`): the reference's gradient of each output of reference op
    `ref_index`, and the same laid out for each output of candidate op `cand_index` (None where
    no gradient, or no partner)."""
    run = live.run
    reference = live.ask("reference", Backward(output_seeds(run)["reference"]))
    ref_op, cand_op = run.reference.ops[ref_index], run.candidate.ops[cand_index]
    candidate = []
    for tid in cand_op.outputs:
        pair = run.alignment.tensors.get(tid)
        values = None if pair is None else reference.tensors.get(pair.reference)
        candidate.append(
            None if values is None else pair.reference_in_candidate_layout(values, run.candidate.tensors[tid].shape)
        )
    return {"reference": [reference.tensors.get(t) for t in ref_op.outputs], "candidate": candidate}


def python_literal(value: Any) -> str | None:
    """Python source for a simple argument value (numbers, strings, slices, dtypes, nests), or None."""
    if value is None or value is Ellipsis or isinstance(value, (bool, int, str, slice)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, (tuple, list)):
        items = [python_literal(v) for v in value]
        if any(i is None for i in items):
            return None
        body = ", ".join(items) + ("," if isinstance(value, tuple) and len(items) == 1 else "")
        return f"({body})" if isinstance(value, tuple) else f"[{body}]"
    if isinstance(value, dict):
        items = [(python_literal(k), python_literal(v)) for k, v in value.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    text = repr(value)
    if text.startswith(tuple(f"{adapter.name}." for adapter in registered())) and re.fullmatch(
        r"[\w.]+", text
    ):  # torch.float32
        return text
    return None


def call_expression(framework: str, framework_op: str, inputs: list[int], call: Call | None, tensors: str = "x") -> str:
    """`torch.nn.functional.gelu(x[0], approximate='tanh')` from a recorded call; without the call
    (a run reopened from disk) only the tensor arguments are known."""
    if framework_op.endswith(".apply"):  # a custom autograd function: its class lives in the model file
        return f"not_standalone({framework_op!r})"
    function = f"{framework}.{framework_op}"
    if call is None:
        args = ", ".join(f"{tensors}[{i}]" for i in range(len(inputs)))
        return f"{function}({args})  # non-tensor arguments are not saved with a run"
    positions = {tid: i for i, tid in enumerate(inputs)}
    missing: list[str] = []

    def render(value: Any) -> str:
        if isinstance(value, Slot):
            return f"{tensors}[{positions[value.tid]}]" if value.tid in positions else "None"
        if isinstance(value, (tuple, list)) and any(isinstance(v, Slot) for v in value):
            body = ", ".join(render(v) for v in value) + ("," if isinstance(value, tuple) and len(value) == 1 else "")
            return f"({body})" if isinstance(value, tuple) else f"[{body}]"
        literal = python_literal(value)
        if literal is None:
            missing.append(type(value).__name__)
            return "None"
        return literal

    args = [render(a) for a in call.args] + [f"{k}={render(v)}" for k, v in call.kwargs.items()]
    note = f"  # replaced unrepresentable {', '.join(missing)} with None" if missing else ""
    return f"{function}({', '.join(args)}){note}"


class NoRepro(Exception):
    """The culprit has no one reference op to reproduce it against."""


def write_repro(
    run: RunRecord,
    cand_index: int,
    directory: str | Path,
    live: LiveRun | None = None,
    upstream: dict[str, list[np.ndarray | None]] | None = None,
) -> Path:
    """Write `repro.py` and `inputs.npz` for candidate op `cand_index` and its reference partner
    (with the non-tensor arguments of the recorded calls where the run is `live`). With `upstream`
    (per side, the gradient reaching each of the op's outputs, the reference's in both sides'
    layouts), the script reproduces the op's backward: the gradients of its inputs."""
    alignment = run.alignment
    ref_index = alignment.reference_of(cand_index)
    if ref_index is None:
        block = next((b for b in alignment.blocks if b.candidate == [cand_index] and len(b.reference) == 1), None)
        ref_index = block.reference[0] if block is not None else None
    if ref_index is None:
        block = next((b for b in alignment.blocks if cand_index in b.candidate), None)
        what = (
            f"it is compared as a block ({len(block.candidate)} candidate op(s) "
            f"against {len(block.reference)} reference ops)"
            if block is not None
            else "it has no reference partner"
        )
        raise NoRepro(
            f"a repro script replays one op against its reference partner; candidate op {cand_index} has none: {what}"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cand, ref = run.candidate, run.reference
    cand_op, ref_op = cand.ops[cand_index], ref.ops[ref_index]
    arrays = {f"reference_input_{i}": np.asarray(ref.value(t)) for i, t in enumerate(ref_op.inputs)}
    for i, tid in enumerate(cand_op.inputs):
        pair = alignment.tensors.get(tid)
        use_reference = cand.tensors[tid].producer is not None and pair is not None and ref.has_value(pair.reference)
        values = (
            pair.reference_in_candidate_layout(ref.value(pair.reference), cand.tensors[tid].shape)
            if use_reference
            else cand.value(tid)
        )
        arrays[f"candidate_input_{i}"] = np.asarray(values)
    arrays["reference_output"] = np.asarray(ref.value(ref_op.outputs[0]))
    arrays["candidate_output"] = np.asarray(cand.value(cand_op.outputs[0]))
    compared: list[tuple[int, int]] = []  # (candidate input, reference input) whose gradients are compared
    if upstream is not None:
        for role in ("reference", "candidate"):
            for i, values in enumerate(upstream[role]):
                if values is not None:
                    arrays[f"{role}_upstream_{i}"] = np.asarray(values)
        for i, tid in enumerate(cand_op.inputs):
            pair = alignment.tensors.get(tid)
            if (
                pair is not None
                and pair.transform is None
                and not pair.broadcast
                and pair.reference in ref_op.inputs
                and cand.tensors[tid].shape == ref.tensors[pair.reference].shape
                and is_floating(cand.tensors[tid].dtype)
            ):
                compared.append((i, ref_op.inputs.index(pair.reference)))
    np.savez(directory / "inputs.npz", **{k: np.ascontiguousarray(v) for k, v in arrays.items()})
    sides = {
        "reference": (
            ref.framework,
            [ref.tensors[t].dtype for t in ref_op.inputs],
            call_expression(
                ref.framework,
                ref_op.framework_op,
                ref_op.inputs,
                live and live.ask("reference", RecordedCall(ref_index)),
            ),
        ),
        "candidate": (
            cand.framework,
            [cand.tensors[t].dtype for t in cand_op.inputs],
            call_expression(
                cand.framework,
                cand_op.framework_op,
                cand_op.inputs,
                live and live.ask("candidate", RecordedCall(cand_index)),
            ),
        ),
    }
    header = "\n".join(
        [
            f'"""bisectr repro: {cand_op.op} — candidate op {cand_index} vs reference op {ref_index}.',
            "",
            f"candidate ({cand.framework}): {cand_op.module or '(top level)'}  {short_source(cand_op.source)}",
            f"    {source_text(cand_op.source)}",
            f"reference ({ref.framework}): {ref_op.module or '(top level)'}  {short_source(ref_op.source)}",
            f"    {source_text(ref_op.source)}",
            "",
            "Both ops run on the reference's inputs (the candidate keeps its own parameters), in their",
            "recorded precision and in float64; the float64 reference op is the oracle.",
            *(
                ["Backward: both ops' gradients of their inputs from the reference's gradient of their outputs."]
                if upstream is not None
                else []
            ),
            "Run: python repro.py",
            '"""',
        ]
    )
    (directory / "repro.py").write_text(_script(header, sides, compared if upstream is not None else None))
    return directory


def _script(
    header: str, sides: dict[str, tuple[str, list[str], str]], compared: list[tuple[int, int]] | None = None
) -> str:
    frameworks = sorted({framework for framework, _, _ in sides.values()})
    imports = "\n".join(_snippets(f).imports for f in frameworks)
    converters = "\n".join(f"    if framework == {f!r}:\n        return {_snippets(f).to_tensor}" for f in frameworks)
    to_numpy = "\n".join(f"    if framework == {f!r}:\n        return {_snippets(f).to_numpy}" for f in frameworks)
    functions = "\n\n\n".join(
        f"def run_{role}(x):\n    return {expression}" for role, (_, _, expression) in sides.items()
    )
    meta = {role: (framework, dtypes) for role, (framework, dtypes, _) in sides.items()}
    body = _forward_main() if compared is None else _backward_main(frameworks, compared)
    return f"""{header}
import os

import numpy as np
{imports}

HERE = os.path.dirname(os.path.abspath(__file__))
SIDES = {meta!r}
FLOATING = ("float16", "bfloat16", "float32", "float64")


def not_standalone(name):
    raise SystemExit(f"{{name}} is a custom autograd function of the model file (its source is named above): "
                     "copy its class into this script to run it here")


def to_tensor(framework, a, dtype):
{converters}


def to_numpy(framework, t):
    if isinstance(t, (tuple, list)):
        t = t[0]
{to_numpy}


{functions}


def inputs(role, data, float64):
    framework, dtypes = SIDES[role]
    names = [f"{{role}}_input_{{i}}" for i in range(len(dtypes))]
    return [to_tensor(framework, data[n].astype(np.float64) if float64 and d in FLOATING else data[n],
                      "float64" if float64 and d in FLOATING else d) for n, d in zip(names, dtypes)]


def relative_error(a, truth):
    scale = np.abs(truth).max()
    return float(np.abs(a.reshape(truth.shape) - truth).max() / scale) if scale else 0.0


{body}
    reference_error = relative_error(reference, oracle)
    candidate_error = relative_error(candidate, oracle)
    print(f"reference op vs float64 oracle: {{reference_error:.3g}}")
    print(f"candidate op vs float64 oracle: {{candidate_error:.3g}}")
    print(f"candidate vs reference:         {{relative_error(candidate, reference.astype(np.float64)):.3g}}")
    same = candidate_error <= 4 * reference_error + 16 * np.finfo(np.float32).eps * (reference.dtype != np.float64)
    print("=> rounding: both are as close to float64" if same else "=> different: the candidate computes \
something else")


if __name__ == "__main__":
    main()
"""


def _forward_main() -> str:
    return """def run(role, data, float64):
    framework = SIDES[role][0]
    return to_numpy(framework, (run_reference if role == "reference" else run_candidate)(inputs(role, data, float64)))


def main():
    data = np.load(os.path.join(HERE, "inputs.npz"))
    oracle = run("reference", data, float64=True)
    reference = run("reference", data, float64=False)
    candidate = run("candidate", data, float64=False)"""


def _backward_main(frameworks: list[str], compared: list[tuple[int, int]]) -> str:
    """`run(role, data, float64)` returning the op's input gradients (one array per compared input)."""
    requires = "\n".join(
        f"    if framework == {f!r}:\n        {_snippets(f).requiring_grad}\n        return t" for f in frameworks
    )
    grads = "\n".join(f"    if framework == {f!r}:\n        return {_snippets(f).gradients}" for f in frameworks)
    return f"""COMPARED = {compared!r}  # (candidate input, reference input) whose gradients are compared


def requiring_grad(framework, t):
{requires}


def gradients(framework, outputs, inputs, upstream):
{grads}


def run(role, data, float64):
    framework, dtypes = SIDES[role]
    x = [requiring_grad(framework, t) if d in FLOATING else t for t, d in zip(inputs(role, data, float64), dtypes)]
    out = (run_reference if role == "reference" else run_candidate)(x)
    out = list(out) if isinstance(out, (tuple, list)) else [out]
    seeded = [(o, f"{{role}}_upstream_{{i}}") for i, o in enumerate(out) if f"{{role}}_upstream_{{i}}" in data.files]
    upstream = [to_tensor(framework, data[name].astype(np.float64) if float64 else data[name], \
"float64" if float64 else o_dtype(o))
                for o, name in seeded]
    position = 1 if role == "reference" else 0
    wanted = [x[pair[position]] for pair in COMPARED]
    found = gradients(framework, [o for o, _ in seeded], wanted, upstream)
    return np.concatenate([to_numpy(framework, g).reshape(-1) for g in found])


def o_dtype(t):
    return str(t.dtype).split(".")[-1]


def main():
    data = np.load(os.path.join(HERE, "inputs.npz"))
    oracle = run("reference", data, float64=True)
    reference = run("reference", data, float64=False)
    candidate = run("candidate", data, float64=False)
    print("gradients of the op's inputs:")"""
