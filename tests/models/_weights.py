"""Weights the hand-built test models share."""


def draw_biases_and_norms(model):
    """`model` in eval mode with its biases drawn from 0.1 * N(0, 1) and its norms' weights (names holding
    "norm") around 1, so that a misplaced one would show; the caller seeds torch."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model.eval()


def loaded_from(port, reference):
    """`port` holding `reference`'s state dict, in eval mode."""
    port.load_state_dict(reference.state_dict())
    return port.eval()
