"""A tiny Hugging Face Llama against itself `torch.compile`d (inductor, on the CPU here).

Reference: `transformers.LlamaForCausalLM` from a random seeded config (2 layers, hidden 64, 4 query
/ 2 key-value heads, eager attention), input_ids (2, 8) from `default_rng(0)`, `use_cache=False`.
Candidate: the same weights, `torch.compile(model)` as users write it: correct, the compiled code
fuses and reorders reductions (`noise`). `COMPILE_BUG=mean_decomposition` plants a compiler bug
the way they arise: a wrong decomposition registered for one op (`aten.mean.dim` dividing by n - 1),
which every RMSNorm's `pow(2).mean(-1)` goes through once compiled; eager code never sees it.
`candidate_without_float64()`: compiled by a backend without float64 kernels (inductor for any other
dtype), as some accelerators' backends are: its float64 run stays float32.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import tiny_llama  # noqa: E402


def _plant_mean_decomposition():
    import torch
    import torch._inductor.config
    from torch._inductor.decomposition import decompositions

    def unbiased_mean(x, dim, keepdim=False, dtype=None):
        count = 1
        for d in dim:
            count *= x.shape[d]
        return torch.sum(x, dim, keepdim) / (count - 1)

    decompositions[torch.ops.aten.mean.dim] = unbiased_mean
    # inductor's cache keys do not include a decomposition registered at run time
    torch._inductor.config.force_disable_caches = True


def reference():
    return tiny_llama()


def candidate():
    import torch

    if os.environ.get("COMPILE_BUG") == "mean_decomposition":
        _plant_mean_decomposition()
    model, inputs = tiny_llama()
    return torch.compile(model), inputs


def candidate_without_float64():
    import torch
    from torch._inductor.compile_fx import compile_fx

    def float32_only(graph, example_inputs):
        if any(getattr(t, "dtype", None) == torch.float64 for t in example_inputs):
            raise NotImplementedError("this backend has no float64 kernels")
        return compile_fx(graph, example_inputs)

    model, inputs = tiny_llama()
    return torch.compile(model, backend=float32_only), inputs
