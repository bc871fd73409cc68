"""What the test models built from Hugging Face `transformers` share."""
import importlib.metadata
import importlib.util
import sys


def hide_broken_torchcodec() -> None:
    """paddleformers' dependency paddlecodec installs a module named `torchcodec` without that
    package's metadata, and transformers then fails to import any torch model: hide that module."""
    if importlib.util.find_spec("torchcodec") is not None:
        try:
            importlib.metadata.version("torchcodec")
        except importlib.metadata.PackageNotFoundError:
            sys.modules["torchcodec"] = None


def seeded_gpt2(model_class: str, config: dict):
    """`transformers.<model_class>` (GPT2Model, GPT2LMHeadModel) from `config`, `torch.manual_seed(0)`,
    its biases drawn from 0.1 * N(0, 1) and its norms' affines around 1, so that a misplaced one
    would show; eval."""
    hide_broken_torchcodec()
    import torch
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, model_class)(transformers.GPT2Config(**config))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif ".ln_" in name or name.startswith("ln_f"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model.eval()


TINY_LLAMA = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager")


def tiny_llama():
    """`(model, inputs)`: `transformers.LlamaForCausalLM` from `TINY_LLAMA` (2 layers, hidden 64, 4 query
    / 2 key-value heads, eager attention), `torch.manual_seed(0)`, eval; input_ids (2, 8) from
    `default_rng(0)`, `use_cache=False`."""
    hide_broken_torchcodec()
    import numpy as np
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA)).eval()
    input_ids = torch.from_numpy(np.random.default_rng(0).integers(0, TINY_LLAMA["vocab_size"], (2, 8)))
    return model, {"input_ids": input_ids, "use_cache": False}
