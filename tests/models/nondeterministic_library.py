"""Library models that do not repeat themselves, each candidate against the same model in eval mode (or
without its random op): what a porter meets outside hand-written code.

- `candidate_bert_train()` / `reference_bert()`: Hugging Face `BertModel` (2 layers, width 32, seeded),
  left in train mode: its dropout is on; the first to run is `embeddings.dropout`.
- `candidate_mixtral_jitter()` / `reference_mixtral()`: Hugging Face `MixtralModel` (2 layers, 4 experts,
  seeded) in train mode with `router_jitter_noise=0.1`: the router draws `Tensor.uniform_` noise in
  `layers.0.mlp` (a random op the model draws itself; all dropouts are 0).
- `candidate_lstm_train()` / `reference_lstm()`: `paddle.nn.LSTM(16, 16, num_layers=2, dropout=0.2)` in
  train mode: its dropout runs inside the fused `rnn` op, which no vocabulary calls random: replayed twice
  from one seed it repeats, so it draws at random, and in training mode.
- `candidate_encoder_train()` / `reference_encoder()`: `paddle.nn.TransformerEncoder` (2 layers, width 32)
  in train mode: the first dropout is in `layers.0.self_attn`.
"""

import numpy as np


def _token_ids():
    import torch

    return {"input_ids": torch.from_numpy(np.random.default_rng(0).integers(0, 64, (2, 8)))}


def _bert(train: bool):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32,
    )  # fmt: skip
    model = transformers.BertModel(config)
    return (model.train() if train else model.eval()), _token_ids()


def _mixtral(jitter: float):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=jitter,
        max_position_embeddings=32,
    )  # fmt: skip
    return transformers.MixtralModel(config).train(), _token_ids()


def _paddle_side(model, train: bool, shape: list[int]):
    import paddle

    model.train() if train else model.eval()
    paddle.seed(1)
    return model, (paddle.randn(shape),)


def _lstm(train: bool):
    import paddle

    paddle.seed(0)
    return _paddle_side(paddle.nn.LSTM(16, 16, num_layers=2, dropout=0.2), train, [2, 5, 16])


def _encoder(train: bool):
    import paddle

    paddle.seed(0)
    encoder = paddle.nn.TransformerEncoder(paddle.nn.TransformerEncoderLayer(32, 4, 64), 2)
    return _paddle_side(encoder, train, [2, 8, 32])


def reference_bert():
    return _bert(train=False)


def candidate_bert_train():
    return _bert(train=True)


def reference_mixtral():
    return _mixtral(0.0)


def candidate_mixtral_jitter():
    return _mixtral(0.1)


def reference_lstm():
    return _lstm(train=False)


def candidate_lstm_train():
    return _lstm(train=True)


def reference_encoder():
    return _encoder(train=False)


def candidate_encoder_train():
    return _encoder(train=True)
