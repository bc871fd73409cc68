"""The Hugging Face references the ports are written against: one model per family, from a tiny random config.

`build(family)` returns `(model, inputs)`, seeded, at trained scale (`families.draw_weights`), eval, nothing
downloaded. The families `families.py` has are built by it with the same configs (Mixtral's experts run as an
eager loop, which has a float64 kernel); Bloom, Falcon, T5 and ResNet are added here with the same sizes.
`build_for_decoding(family)` is a decoder as the decoding ports are written against it (Gemma-2 and Mixtral with
`architectures.WINDOW` as their sliding window) and its prompt, as `bisectr generate` reads one.
"""

from __future__ import annotations

import dataclasses

from families import COMMON, FAMILIES, HEADS, HIDDEN, LAYERS, Family, built
from ports.architectures import WINDOW

PORT_FAMILIES = ("llama", "qwen2", "mixtral", "gemma2", "gpt_neox", "gpt2", "bloom", "falcon", "bert", "vit", "t5",
                 "resnet")
DECODER_LENGTH = 8  # T5's decoder_input_ids: shorter than the encoder's, so that the two lengths never mix unseen
IMAGE_SIZE = 32  # ResNet's images: the stem and two stages halve it three times
DECODING_SETTINGS = {"gemma2": {"sliding_window": WINDOW}, "mixtral": {"sliding_window": WINDOW}}  # beyond `spec`'s

ADDED = {family.name: family for family in [
    Family("bloom", "BloomConfig", "BloomForCausalLM", "ids"),
    Family("falcon", "FalconConfig", "FalconForCausalLM", "ids"),
    Family("t5", "T5Config", "T5ForConditionalGeneration", "ids",
           dict(d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=2 * HIDDEN, num_layers=LAYERS, num_heads=HEADS,
                decoder_start_token_id=0)),
    Family("resnet", "ResNetConfig", "ResNetModel", "pixels",
           dict(embedding_size=16, hidden_sizes=[32, 64], depths=[1, 2], layer_type="bottleneck")),
]}


def spec(family: str) -> Family:
    """The family as its reference is built (Mixtral's experts an eager loop)."""
    if family == "mixtral":
        mixtral = FAMILIES["mixtral"]
        return dataclasses.replace(mixtral, settings={**mixtral.settings, "experts_implementation": "eager"})
    return FAMILIES[family] if family in FAMILIES else ADDED[family]


def build(family: str):
    """`(model, inputs)`: family's reference, eval, its inputs as the reference takes them."""
    import numpy as np
    import torch

    model, inputs = built(spec(family))
    rng = np.random.default_rng(1)
    if family == "t5":
        decoder_ids = rng.integers(3, COMMON["vocab_size"], size=(inputs["input_ids"].shape[0], DECODER_LENGTH))
        inputs["decoder_input_ids"] = torch.from_numpy(decoder_ids)
    if family == "resnet":
        _draw_running_statistics(model)
        images = rng.standard_normal((2, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
        inputs = {"pixel_values": torch.from_numpy(images)}
    return model, inputs


def build_for_decoding(family: str):
    """`(model, prompt)`: decoder `family`'s reference (`DECODING_ARCHS`' sizes), eval, and its prompt: the ids of
    `build`'s inputs and an attention_mask of ones."""
    import torch

    base = spec(family)
    model, inputs = built(dataclasses.replace(base, settings={**base.settings, **DECODING_SETTINGS.get(family, {})}))
    ids = inputs["input_ids"]
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _draw_running_statistics(model) -> None:
    """BatchNorm running means 0.1 N(0, 1) and variances in [0.5, 1.5]: a statistic left at 0 or 1 shows."""
    import torch

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.copy_(0.1 * torch.randn(module.running_mean.shape, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=generator))


def state_dict(model) -> dict:
    """The reference's weights as a converter reads them: numpy, by the reference's names."""
    return {name: values.detach().cpu().numpy() for name, values in model.state_dict().items()}
