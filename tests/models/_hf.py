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
