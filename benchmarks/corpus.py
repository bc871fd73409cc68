"""bisectr on model pairs nobody on the team wrote: library layers against hand ports, each
correct and with one planted bug (the model files in tests/models/).

    python benchmarks/corpus.py [--only NAME] [--json PATH]

For every pair: the verdict and culprit module against what the pair plants, whether the
culprit was confirmed, candidate re-runs against ceil(log2 ops) + 3, and the alignment's
coverage (candidate ops inside pairs or matched blocks). For the correct ports also the pairs
whose values contradict them: paired outputs further apart than rounding can put them
(relative error above 1e-4 where the whole model differs by ~1e-6).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MODELS = Path(__file__).resolve().parent.parent / "tests" / "models"
CONTRADICTION = 1e-4  # a correct port's paired tensors differ by rounding (~1e-6), never by this


@dataclass(frozen=True)
class Pair:
    model: str
    candidate: str
    planted: str | None  # the module prefix where the bug is planted; None for a correct port

    @property
    def name(self) -> str:
        return f"{Path(self.model).stem}:{self.candidate}"


CORPUS = [
    Pair("torch_mha.py", "candidate", None),
    Pair("torch_mha.py", "candidate_wrong_scale", "blocks.1.attn"),
    Pair("paddle_resnet.py", "candidate", None),
    Pair("paddle_resnet.py", "candidate_bn_eps", "layer4.1.bn1"),
    Pair("hf_llama_activation.py", "candidate", None),
    Pair("hf_llama_activation.py", "candidate_gelu_layer", "model.layers.2.mlp"),
    Pair("transformer_encoder.py", "candidate", None),
    Pair("transformer_encoder.py", "candidate_gelu_layer", "layers.1"),
    Pair("hf_gpt2.py", "candidate", None),
    Pair("hf_gpt2.py", "candidate_untransposed", "h.2.attn"),
    Pair("hf_gpt2.py", "candidate_exact_gelu", "h.0.mlp"),
    Pair("transpose_y_stack.py", "candidate", None),
    Pair("transpose_y_stack.py", "candidate_tanh_gelu", "layers.30"),
    Pair("paddle_conv_bias.py", "candidate", None),
    Pair("paddle_conv_bias.py", "candidate_wrong_bias", "conv2"),
]


def measure(pair: Pair) -> dict:
    import bisectr
    from bisectr.analysis import Analysis

    started = time.perf_counter()
    run = bisectr.trace(MODELS / pair.model, candidate=pair.candidate)
    result = run.bisect()
    seconds = time.perf_counter() - started
    culprit = result.culprit
    module = culprit.candidate.module if culprit else ""
    ops = result.ops["candidate"]
    contradicted = None
    if pair.planted is None:
        analysis = Analysis(run)
        errors = (analysis.tensor_error(run.candidate.ops[p.candidate].outputs[0]) for p in run.alignment.pairs)
        contradicted = sum(1 for e in errors if e is not None and e.max_rel > CONTRADICTION)
    expected = "noise/match" if pair.planted is None else f"divergent at {pair.planted}"
    right = (result.verdict in ("noise", "match") if pair.planted is None else
             result.verdict == "divergent" and (module == pair.planted or module.startswith(pair.planted + ".")))
    return {"pair": pair.name, "expected": expected, "verdict": result.verdict, "culprit": f"{culprit.op if culprit else None} at {module}",
            "right": right, "confirmed": bool(result.confirmation and result.confirmation.confirmed),
            "reruns": result.reruns, "budget": math.ceil(math.log2(ops)) + 3,
            "coverage": result.ops["aligned"] / ops, "contradicted": contradicted, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run only the pairs whose model file stem is NAME")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to PATH")
    args = parser.parse_args(argv)
    chosen = [p for p in CORPUS if args.only in (None, Path(p.model).stem)]
    if not chosen:
        parser.error(f"no pair in the corpus is named {args.only!r}")
    rows = []
    for pair in chosen:
        row = measure(pair)
        rows.append(row)
        print(f"{row['pair']:<46} {row['verdict']:<9} {'ok ' if row['right'] else 'BAD'} {row['culprit']:<44} "
              f"confirmed={row['confirmed']!s:<5} re-runs {row['reruns']}/{row['budget']}  coverage {row['coverage']:.0%}"
              + (f"  contradicted pairs {row['contradicted']}" if row["contradicted"] is not None else ""), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["right"] and r["reruns"] <= r["budget"] and not r["contradicted"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
