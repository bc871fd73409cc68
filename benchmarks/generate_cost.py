"""What `bisectr generate` costs against plain generation, measured side by side in one run.

    python benchmarks/generate_cost.py [MODEL.py] [--candidate NAME] [--tokens 32] [--repeat 3]

Plain generation: both sides of the model file built and decoding `--tokens` greedy steps after the prefill, each with
its own cache, fed the reference's tokens, as a loop a user writes calls them (`bisectr.engines.decoding`'s
`Decoder` in float32: one model call per step, nothing intercepted). bisectr: `bisectr.generate` on the same
pair, which also runs each side in float64 in lockstep (and, where a step differs, searches it; a pair that
agrees measures the decoding alone). The ratio's target is 3. Peak memory is not measured: no step's cache is
kept (each step's logits and cache are read, compared and dropped).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "tests" / "models" / "generate_llama_port.py"
TARGET = 3.0


def plain_generation(model_file: Path, reference: str, candidate: str, tokens: int) -> float:
    """Seconds for both sides to be built from the model file and decode `tokens` steps, teacher-forced on the
    reference's tokens."""
    from bisectr.capture.modelfile import build_side, load_module
    from bisectr.engines.decoding import Decoder

    started = time.perf_counter()
    module = load_module(model_file)
    decoders = {
        role: Decoder(build_side(module, model_file, role, function), float64=False)
        for role, function in (("reference", reference), ("candidate", candidate))
    }
    token = None
    for number in range(tokens + 1):
        logits = {role: decoder.step(number, token, tokens).logits for role, decoder in decoders.items()}
        token = logits["reference"].argmax(-1)
    return time.perf_counter() - started


def under_bisectr(model_file: Path, reference: str, candidate: str, tokens: int) -> tuple[float, str]:
    import bisectr

    started = time.perf_counter()
    result = bisectr.generate(model_file, reference, candidate, tokens)
    return time.perf_counter() - started, result.verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_file", nargs="?", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--reference", default="reference")
    parser.add_argument("--candidate", default="candidate")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, the fastest kept")
    args = parser.parse_args(argv)
    plain, bisectr_seconds, verdict = [], [], ""
    for _ in range(args.repeat):  # interleaved, so that both see the same machine
        plain.append(plain_generation(args.model_file, args.reference, args.candidate, args.tokens))
        seconds, verdict = under_bisectr(args.model_file, args.reference, args.candidate, args.tokens)
        bisectr_seconds.append(seconds)
    ratio = min(bisectr_seconds) / min(plain)
    print(f"{args.model_file.name} ({args.reference} / {args.candidate}), {args.tokens} tokens, best of {args.repeat}")
    print(f"plain generation, both sides   {min(plain):8.3f} s")
    print(f"bisectr generate ({verdict:<9})  {min(bisectr_seconds):8.3f} s   x{ratio:.2f}   target x{TARGET:g}")
    print(f"(all runs: plain {np.round(plain, 3).tolist()}, bisectr {np.round(bisectr_seconds, 3).tolist()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
