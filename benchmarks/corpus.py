"""bisectr on the regression corpus (`tests/corpus.py`): every example and every model pair nobody on
the team wrote (library layers and Hugging Face models against hand ports, each correct and with one
planted bug; the model files in tests/models/), against what each must conclude.

    python benchmarks/corpus.py [--only NAME] [--json PATH] [--reference-python PATH]

For every pair: the verdict and culprit against what the pair plants, whether the culprit was
confirmed, candidate re-runs against ceil(log2 ops) + 3, and the alignment's coverage (candidate ops
inside pairs or matched blocks; a correct port's must reach 90%). For the correct ports also the pairs whose values contradict
them (those computing in float32 or float64): paired outputs further apart than rounding can put them
(relative error above 1e-4 where the whole model differs by ~1e-6; masked scores near float32's
largest magnitude do not count). Pairs that need PaddleFormers run with their Hugging Face reference in the
interpreter `--reference-python` names (one without PaddleFormers' `torchcodec`), else are skipped.
Run it before and after a change: the rows must stay the same. Exit status 1 if any pair departs.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from corpus import CORPUS, Pair, problems  # noqa: E402

CONTRADICTION = 1e-4  # a correct port's paired tensors differ by rounding (~1e-6), never by this
MIN_COVERAGE = 0.9  # of a correct port's candidate ops inside pairs or matched blocks
# Masked attention scores hold the dtype's most negative value on one side and -inf or another large
# value on the other: their relative error says nothing (the softmax makes both 0).
MASK_MAGNITUDE = 1e38


def measure(pair: Pair, reference_python: str | None = None) -> tuple[dict, dict]:
    """Run `pair` as `bisectr bisect [--backward]` does and judge it: (its row, whose `problems` lists
    what departs; the result as `bisect --json` prints it)."""
    import bisectr
    from bisectr.analysis import Analysis

    isolation = {"isolate": True, "reference_python": reference_python} if "paddleformers" in pair.needs else {}
    started = time.perf_counter()
    run = bisectr.trace(pair.path, pair.reference, pair.candidate, **isolation)
    result = run.bisect(backward=pair.backward is not None).to_dict()
    seconds = time.perf_counter() - started
    culprit = result["culprit"]
    found = problems(pair, result)
    budget = math.ceil(math.log2(max(result["ops"]["candidate"], 2))) + 3
    coverage = result["ops"]["aligned"] / max(result["ops"]["candidate"], 1)
    if result["reruns"] > budget:
        found.append(f"{result['reruns']} re-runs, over {budget}")
    contradicted = None
    if pair.verdict == "noise" and coverage < MIN_COVERAGE:
        found.append(f"coverage {coverage:.0%}")
    narrow = any(info.dtype in ("bfloat16", "float16") for info in run.candidate.tensors.values())
    # bfloat16's rounding passes the threshold; a match's outputs agree bit for bit (what an op such as
    # `empty_like` leaves uninitialised may still differ inside).
    if result["verdict"] == "noise" and not narrow:
        analysis = Analysis(run)
        outputs = (run.candidate.ops[p.candidate].outputs[0] for p in run.alignment.pairs)
        errors = (analysis.tensor_error(tid) for tid in outputs if run.candidate.tensors[tid].stats["absmax"] < MASK_MAGNITUDE)
        contradicted = sum(1 for e in errors if e is not None and e.max_rel > CONTRADICTION)
        if contradicted:
            found.append(f"{contradicted} pairs the values contradict")
    backward = result.get("backward") or {}
    return {"pair": pair.name, "expected": pair.verdict + (f" / backward {pair.backward}" if pair.backward else ""),
            "verdict": result["verdict"] + (f" / backward {backward['verdict']}" if backward else ""),
            "culprit": f"{culprit['op']} at {culprit['candidate']['module']}" if culprit else None,
            "confirmed": bool((result["confirmation"] or {}).get("confirmed")), "reruns": result["reruns"], "budget": budget,
            "coverage": coverage, "contradicted": contradicted, "seconds": seconds, "problems": found}, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run only the pairs whose model file stem is NAME")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to PATH")
    parser.add_argument("--reference-python", metavar="PATH",
                        help="interpreter for the Hugging Face reference of the pairs that need PaddleFormers")
    args = parser.parse_args(argv)
    chosen = [p for p in CORPUS if args.only in (None, Path(p.model).stem)]
    if not chosen:
        parser.error(f"no pair in the corpus is named {args.only!r}")
    rows = []
    for pair in chosen:
        missing = pair.missing() + (["--reference-python"] if "paddleformers" in pair.needs and not args.reference_python else [])
        if missing:
            print(f"{pair.name:<58} skipped: needs {', '.join(missing)}", flush=True)
            continue
        row, _ = measure(pair, args.reference_python)
        rows.append(row)
        print(f"{row['pair']:<58} {row['verdict']:<28} {'ok ' if not row['problems'] else 'BAD'} {row['culprit'] or '':<44} "
              f"confirmed={row['confirmed']!s:<5} re-runs {row['reruns']}/{row['budget']}  coverage {row['coverage']:.0%}"
              + (f"  contradicted pairs {row['contradicted']}" if row["contradicted"] is not None else "")
              + "".join(f"\n    {problem}" for problem in row["problems"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(not row["problems"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
