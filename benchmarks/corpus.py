"""bisectr on the regression corpus (`tests/corpus.py`): every example and every model pair nobody on
the team wrote (library layers and Hugging Face models against hand ports, each correct and with one
planted bug; the model files in tests/models/), against what each must conclude.

    python benchmarks/corpus.py [--only NAME] [--json PATH] [--reference-python PATH]
                                [--decisions PATH] [--against PATH]

For every pair: the verdict and culprit against what the pair plants, whether the culprit was
confirmed, candidate re-runs against ceil(log2 ops) + 3, and the alignment's coverage (candidate ops
inside pairs or matched blocks; a correct port's must reach 90%). For the correct ports also the pairs
whose values contradict them (those computing in float32 or float64): paired outputs further apart than
rounding can put them (relative error above 1e-4 where the whole model differs by ~1e-6; masked scores near
float32's largest magnitude do not count). Pairs that need PaddleFormers run with their Hugging Face
reference in the interpreter `--reference-python` names (one without PaddleFormers' `torchcodec`), else are
skipped. Run it before and after a change: the rows must stay the same. Exit status 1 if any pair departs.

`--decisions PATH` writes what each pair's search decided (the JSON `bisect --json` prints, less its
measured numbers beyond three digits: verdict, entry point, culprit with its sites and lines, recurrences,
confirmation, what was not blamed, re-run counts, for the forward and the backward pass); `--against PATH`
compares them with a file written before (a refactoring must change none) and lists each difference.
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


def measure(pair: Pair, reference_python: str | None = None) -> tuple[dict, dict | None]:
    """Run `pair` as `bisectr bisect [--backward]` does and judge it: (its row, whose `problems` lists
    what departs; the result as `bisect --json` prints it)."""
    import bisectr
    from bisectr.measure.analysis import Analysis

    isolation = {"isolate": True, "reference_python": reference_python} if "paddleformers" in pair.needs else {}
    if pair.tokens is not None:
        return measure_generation(pair, isolation)
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
        errors = (
            analysis.tensor_error(tid) for tid in outputs if run.candidate.tensors[tid].stats.absmax < MASK_MAGNITUDE
        )
        contradicted = sum(1 for e in errors if e is not None and e.max_rel > CONTRADICTION)
        if contradicted:
            found.append(f"{contradicted} pairs the values contradict")
    backward = result.get("backward") or {}
    return {
        "pair": pair.name,
        "expected": pair.verdict + (f" / backward {pair.backward}" if pair.backward else ""),
        "verdict": result["verdict"] + (f" / backward {backward['verdict']}" if backward else ""),
        "culprit": f"{culprit['op']} at {culprit['candidate']['module']}" if culprit else None,
        "confirmed": bool((result["confirmation"] or {}).get("confirmed")),
        "reruns": result["reruns"],
        "budget": budget,
        "coverage": coverage,
        "contradicted": contradicted,
        "seconds": seconds,
        "problems": found,
    }, result


def measure_generation(pair: Pair, isolation: dict) -> tuple[dict, dict]:
    """Run a generation pair as `bisectr generate --tokens N` does and judge it: (its row, the search of the step
    searched as `bisect --json` prints it; None where no step was searched)."""
    import bisectr

    started = time.perf_counter()
    result = bisectr.generate(pair.path, pair.reference, pair.candidate, pair.tokens, **isolation).to_dict()
    seconds = time.perf_counter() - started
    searched = result["step_search"] or {}
    culprit = result["culprit"]
    return {
        "pair": pair.name,
        "expected": pair.verdict + (f" at step {pair.step}" if pair.step is not None else ""),
        "verdict": result["verdict"]
        + (f" at step {result['culprit_step']}" if result["culprit_step"] is not None else ""),
        "culprit": f"{culprit['op']} at {culprit['candidate']['module']}" if culprit else None,
        "confirmed": bool((result["confirmation"] or {}).get("confirmed")),
        "reruns": searched.get("reruns", 0),
        "budget": math.ceil(math.log2(max(searched["ops"]["candidate"], 2))) + 3 if searched else 0,
        "coverage": searched["ops"]["aligned"] / max(searched["ops"]["candidate"], 1) if searched else 1.0,
        "contradicted": None,
        "seconds": seconds,
        "problems": problems(pair, result),
    }, searched or None


def decisions(result: dict) -> dict:
    """What a search decided, as `bisect --json` says it, with numbers to three digits and source
    paths without the directories that differ between checkouts."""

    def number(value):
        return float(f"{value:.3g}") if isinstance(value, float) else value

    def site(where: dict | None) -> dict | None:
        if where is None:
            return None
        path, _, line = where["source"].rpartition(":")
        return {
            "index": where["index"],
            "op": where["op"],
            "module": where["module"],
            "source": f"{'/'.join(Path(path).parts[-2:])}:{line}" if path else where["source"],
        }

    culprit, confirmation = result["culprit"], result["confirmation"]
    backward = result.get("backward")
    return {
        "verdict": result["verdict"],
        "entry": result["entry"],
        "reruns": result["reruns"],
        "reference_reruns": result["reference_reruns"],
        "culprit": None
        if culprit is None
        else {
            **{key: culprit.get(key) for key in ("kind", "op", "leaf", "description", "block", "verdict")},
            "candidate": site(culprit.get("candidate")),
            "reference": site(culprit.get("reference")),
            "local_error": number(culprit.get("local_error")),
        },
        "recurrences": [item["index"] for item in result["recurrences"]],
        "confirmation": None if confirmation is None else {key: number(value) for key, value in confirmation.items()},
        "not_blamed": [item["index"] for item in result["not_blamed"]],
        "bracket": None if result["bracket"] is None else [result["bracket"]["low"], result["bracket"]["high"]],
        "backward": decisions(backward) if backward else None,
    }


def compare_decisions(before: dict, after: dict) -> list[str]:
    """Each pair whose decisions differ, with the fields that do."""
    lines = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old != new:
            fields = sorted(
                k for k in (old or {}).keys() | (new or {}).keys() if (old or {}).get(k) != (new or {}).get(k)
            )
            lines.append(f"{name}: " + "; ".join(f"{k}: {(old or {}).get(k)} -> {(new or {}).get(k)}" for k in fields))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run only the pairs whose model file stem is NAME")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to PATH")
    parser.add_argument(
        "--reference-python",
        metavar="PATH",
        help="interpreter for the Hugging Face reference of the pairs that need PaddleFormers",
    )
    parser.add_argument("--decisions", type=Path, help="write what each pair's search decided to PATH")
    parser.add_argument("--against", type=Path, help="compare what each search decided with PATH (from --decisions)")
    args = parser.parse_args(argv)
    chosen = [p for p in CORPUS if args.only in (None, Path(p.model).stem)]
    if not chosen:
        parser.error(f"no pair in the corpus is named {args.only!r}")
    rows, decided = [], {}
    for pair in chosen:
        missing = pair.missing() + (
            ["--reference-python"] if "paddleformers" in pair.needs and not args.reference_python else []
        )
        if missing:
            print(f"{pair.name:<58} skipped: needs {', '.join(missing)}", flush=True)
            continue
        row, result = measure(pair, args.reference_python)
        rows.append(row)
        decided[pair.name] = decisions(result) if result is not None else {"verdict": row["verdict"]}
        print(
            f"{row['pair']:<58} {row['verdict']:<28} {'ok ' if not row['problems'] else 'BAD'} "
            f"{row['culprit'] or '':<44} "
            f"confirmed={row['confirmed']!s:<5} re-runs {row['reruns']}/{row['budget']}  coverage {row['coverage']:.0%}"
            + (f"  contradicted pairs {row['contradicted']}" if row["contradicted"] is not None else "")
            + "".join(f"\n    {problem}" for problem in row["problems"]),
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.decisions:
        args.decisions.write_text(json.dumps(decided, indent=1, sort_keys=True))
    changed = []
    if args.against:
        before = json.loads(args.against.read_text())
        changed = compare_decisions({name: before[name] for name in before if name in decided}, decided)
        print(
            f"decisions against {args.against}: "
            + ("the same for every pair" if not changed else f"{len(changed)} pairs differ")
        )
        for line in changed:
            print(f"  {line}")
    return 0 if all(not row["problems"] for row in rows) and not changed else 1


if __name__ == "__main__":
    sys.exit(main())
