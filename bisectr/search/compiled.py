"""Inside a compiled culprit: where its compiled code differs from its eager code, asked of the side
whose model it is (`Interception.search_compiled`: the module, the op, the compiler step, the proof)."""
from __future__ import annotations

from dataclasses import replace

from ..adapters import COMPILED_OP, InCompiled
from ..capture.sides import SearchCompiled
from ..measure.live import LiveRun
from ..leafref import leaf_kind
from ..measure.runrecord import RunRecord


def in_compiled(live: LiveRun, candidate_ops: list[int]) -> InCompiled | None:
    """The search inside the first compiled module's call among `candidate_ops` (None: there is none)."""
    run = live.run
    candidate = run.candidate
    compiled = next((index for index in candidate_ops if candidate.ops[index].framework_op == COMPILED_OP), None)
    if compiled is None:
        return None
    op = candidate.ops[compiled]
    live.say(f"searching inside the compiled module {op.module or '(the model)'}: each step compiles afresh")
    values = {tid: candidate.value(tid) for tid in op.inputs
              if candidate.tensors[tid].leaf is None or leaf_kind(candidate.tensors[tid].leaf) not in ("param", "buffer")}
    found = live.ask("candidate", SearchCompiled(compiled, values))
    if found is None:
        return None
    inside = (lambda path: f"{op.module}.{path}" if op.module and path else op.module or path)
    return replace(found, module=inside(found.module), eager_modules=[inside(path) for path in found.eager_modules],
                   eager_ops=_at_line(run, found.source, found.op, inside(found.module)))


def _at_line(run: RunRecord, source: str, op: str | None, module: str) -> list[int]:
    """The reference's ops of `source`'s line (those named `op` in `module` where there are); for a
    reference in other code (a port), its ops in `module` whose canonical name ends `op`'s name."""
    at_line = [r for r in run.reference.ops if source and r.source == source]
    alike = [r for r in at_line if r.framework_op == op and r.module == module]
    if at_line:
        return [r.index for r in alike or at_line]
    name = (op or "").rpartition(".")[2]
    return [r.index for r in run.reference.ops if r.module == module and r.op == name]
