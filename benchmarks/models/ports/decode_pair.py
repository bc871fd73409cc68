"""bisectr model file for one case of the `decode_port` form of the seeded-bug benchmark (`benchmarks/mutants.py`),
named in the environment: `BISECTR_MUTANT=FAMILY:KIND:SEED:decode_port`, e.g.
`llama:cached_before_rotary:3:decode_port`; `bisectr generate` decodes it step by step.

- `reference()`: the family's Hugging Face causal LM (`references.build_for_decoding`), which `bisectr generate` decodes
  with its own `DynamicCache`; its prompt: the ids and an attention_mask of ones.
- `candidate()`: a decoding port of it in torch or paddle with its own cache class, its structure drawn by SEED, with
  the mistake of KIND planted at a decode line drawn by SEED (`decode_cases.drawn`), imported from the port's file in
  the cache folder and loaded through its own converter from the reference's state dict. The controls plant nothing:
  `none` (the port as written), `bfloat16` (the converter's weights rounded to bfloat16). Its prompt is the
  reference's, in the port's framework.

    BISECTR_MUTANT=llama:cached_before_rotary:3:decode_port bisectr generate benchmarks/models/ports/decode_pair.py \
        --tokens 6
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ports import decode_cases, references, running  # noqa: E402
from ports.pair import rounded_to_bfloat16, spec  # noqa: E402


def reference():
    """The family's Hugging Face causal LM and its prompt."""
    family, _, _ = spec()
    return references.build_for_decoding(family)


def candidate():
    """The case's decoding port (the mutant's source, or the correct port's for a control), loaded through its
    converter, and the reference's prompt in its framework."""
    family, kind, seed = spec()
    case = decode_cases.drawn(family, kind, seed)
    model, prompt = references.build_for_decoding(family)
    port = running.imported(Path(case.port_file))
    weights = port.convert(references.state_dict(model))
    if kind == "bfloat16":
        weights = {name: rounded_to_bfloat16(values) for name, values in weights.items()}
    return running.built(port, weights), running.framework_inputs(prompt, case.framework)
