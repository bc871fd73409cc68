"""bisectr model file for one case of the `port` form of the seeded-bug benchmark (`benchmarks/mutants.py`), named in
the environment: `BISECTR_MUTANT=FAMILY:KIND:SEED:port`, e.g. `llama:call_dropped:3:port`.

- `reference()`: the family's Hugging Face model (`references.build`).
- `candidate()`: a hand-style port of it in torch or paddle, its structure drawn by SEED, with the mistake of KIND
  planted at a site drawn by SEED (`cases.drawn`), imported from the port's file in the cache folder and loaded
  through its own converter from the reference's state dict. The controls plant nothing: `none` (the port as
  written), `bfloat16` (the converter's weights rounded to bfloat16, as a checkpoint saved in bfloat16 and loaded
  by a float32 port). The candidate's inputs are the reference's, in the port's framework.

    BISECTR_MUTANT=llama:call_dropped:3:port bisectr bisect benchmarks/models/ports/pair.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ports import cases, references, running  # noqa: E402


def spec() -> tuple[str, str, int]:
    """`(family, kind, seed)` of the case `BISECTR_MUTANT` names."""
    family, kind, seed, *_ = os.environ["BISECTR_MUTANT"].split(":")
    return family, kind, int(seed)


def reference():
    """The family's Hugging Face model and its inputs."""
    family, _, _ = spec()
    return references.build(family)


def candidate():
    """The case's port (the mutant's source, or the correct port's for a control), loaded through its converter."""
    family, kind, seed = spec()
    case = cases.drawn(family, kind, seed)
    model, inputs = references.build(family)
    port = running.imported(Path(case.port_file))
    weights = port.convert(references.state_dict(model))
    if kind == "bfloat16":
        weights = {name: rounded_to_bfloat16(values) for name, values in weights.items()}
    return running.built(port, weights), running.framework_inputs(inputs, case.framework)


def rounded_to_bfloat16(values):
    """`values` as a bfloat16 checkpoint holds them, read back as float32."""
    import torch

    if values.dtype.kind != "f":
        return values
    return torch.from_numpy(values.astype("float32")).bfloat16().float().numpy()
