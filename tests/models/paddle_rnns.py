"""torch recurrent layers against their paddle ports, weights copied with `bisectr.weights.torch_to_paddle`.

Reference (torch, batch first, seeded, eval): a two-layer `nn.GRU(6, 8)`, a two-layer `nn.LSTM(6, 8)`
and an `nn.RNN(6, 8, nonlinearity="relu")`, each returning its output sequence and last state; input
(2, 5, 6). Candidates (paddle): `nn.GRU`, `nn.LSTM`, `nn.SimpleRNN` of the same sizes. torch and
paddle store each layer's weights under the same names, in the same (gates x hidden, input) layout and
the same gate order (GRU: reset, update, new; LSTM: input, forget, cell, output), so the copy
transposes nothing.

Planted bugs, one each:
- `candidate_gru_gate_order`: the converter swaps the reset and update gates' rows of every GRU weight
  and bias (a porter who read paddle's GRU as update-first); first leaf read: `weight_ih_l0`.
- `candidate_lstm_forget_bias`: the converter drops the forget gate's `bias_hh` rows of layer 1 (zeros).
- `candidate_rnn_default_activation`: the port leaves paddle `SimpleRNN` at its default `tanh` where the
  reference asked for `relu`: a framework default, an op no weight shows.

bisectr should conclude `noise` (or `match`) for every `candidate_*` port without a bug, and
`divergent` at the planted place for each of the others.
"""
import numpy as np

HIDDEN = 8


def _inputs() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((2, 5, 6)).astype(np.float32)


def _torch_rnn(kind: str):
    import torch

    torch.manual_seed(0)
    layers = {"GRU": lambda: torch.nn.GRU(6, HIDDEN, num_layers=2, batch_first=True),
              "LSTM": lambda: torch.nn.LSTM(6, HIDDEN, num_layers=2, batch_first=True),
              "RNN": lambda: torch.nn.RNN(6, HIDDEN, nonlinearity="relu", batch_first=True)}
    return layers[kind]().eval()


def _torch_side(kind: str):
    import torch

    return _torch_rnn(kind), (torch.from_numpy(_inputs()),)


def _paddle_side(kind: str, convert=lambda name, values: values, **options):
    import paddle

    from bisectr.weights import torch_to_paddle

    source = _torch_rnn(kind)
    state = {name: convert(name, tensor.detach().numpy().copy()) for name, tensor in source.state_dict().items()}
    paddle.seed(0)
    layers = {"GRU": lambda: paddle.nn.GRU(6, HIDDEN, num_layers=2),
              "LSTM": lambda: paddle.nn.LSTM(6, HIDDEN, num_layers=2),
              "RNN": lambda: paddle.nn.SimpleRNN(6, HIDDEN, **options)}
    layer = layers[kind]()
    report = torch_to_paddle({name: _torch_tensor(values) for name, values in state.items()}, layer)
    assert not (report.unmatched or report.extra or report.mis_shaped or report.transposed), report
    layer.eval()
    return layer, (paddle.to_tensor(_inputs()),)


def _torch_tensor(values: np.ndarray):
    import torch

    return torch.from_numpy(values)


def _swap_reset_and_update(name: str, values: np.ndarray) -> np.ndarray:
    reset, update, new = np.split(values, 3, axis=0)
    return np.concatenate([update, reset, new], axis=0)


def _forget_bias_dropped(name: str, values: np.ndarray) -> np.ndarray:
    if name == "bias_hh_l1":
        values[HIDDEN:2 * HIDDEN] = 0
    return values


def reference():
    return _torch_side("GRU")


def candidate():
    return _paddle_side("GRU")


def candidate_gru_gate_order():
    return _paddle_side("GRU", _swap_reset_and_update)


def reference_lstm():
    return _torch_side("LSTM")


def candidate_lstm():
    return _paddle_side("LSTM")


def candidate_lstm_forget_bias():
    return _paddle_side("LSTM", _forget_bias_dropped)


def reference_rnn():
    return _torch_side("RNN")


def candidate_rnn():
    return _paddle_side("RNN", activation="relu")


def candidate_rnn_default_activation():
    return _paddle_side("RNN")
