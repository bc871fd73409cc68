"""Torch sides that do not repeat themselves, each named at its op with its cause and fix.

`Net`: three `Block`s (Linear 16->16, relu, Dropout(0.1)) and a Linear head, `torch.manual_seed(0)`; inputs
`torch.randn(4, 16)`. The reference is the net in eval mode; each candidate puts one source of difference
between runs into block 1 (`blocks.1`) at the line tagged with its name:

- `candidate()`: the same net (`match`).
- `candidate_dropout()`: the net in train mode: every block's dropout on; the first to run is `blocks.0.drop`.
- `reference_dropout()`: the reference in train mode (the candidate is deterministic).
- `candidate_noise()`: adds unseeded `torch.randn_like` noise (`@noise`).
- `candidate_seeded_noise()`: the same noise, drawn after `torch.manual_seed(7)` in the forward: it repeats
  itself when its code runs, not when its recorded calls are replayed (`@seeded`).
- `candidate_uninitialised()`: writes half of a `torch.empty` buffer and reads all of it (`@empty`, `@read`).
- `candidate_shuffle()`: shuffles the batch rows with `torch.randperm` (`@shuffle`).
- `candidate_dropout_and_bug()`: train mode, and gelu in place of relu (`@gelu`): once
  `--fix-nondeterminism` has put it in eval mode, the usual search names the gelu.
- `reference_optimizer` / `candidate_dropout_optimizer`: SGD, for `bisectr train` (the dropout pair's first step
  differs, and its search finds the candidate does not repeat itself).
- `reference_threads()` / `candidate_threads()`: the same net, whose forwards set TF32 off and two threads /
  TF32 on and one thread before they run (`@settings`).
"""

import copy

import torch


class Block(torch.nn.Module):
    def __init__(self, kind: str = ""):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(0.1)
        self.kind = kind

    def forward(self, x):
        h = self.fc(x)
        h = torch.nn.functional.gelu(h) if self.kind == "gelu" else torch.relu(h)  # @gelu
        if self.kind == "noise":
            h = h + 0.1 * torch.randn_like(h)  # @noise
        if self.kind == "seeded":
            torch.manual_seed(7)
            h = h + 0.1 * torch.randn_like(h)  # @seeded
        if self.kind == "empty":
            buffer = torch.empty(h.shape[0], 2 * h.shape[1])  # @empty
            buffer[:, : h.shape[1]] = h
            h = buffer.reshape(h.shape[0], 2, h.shape[1]).sum(1)  # @read
        if self.kind == "shuffle":
            h = h[torch.randperm(h.shape[0])]  # @shuffle
        return self.drop(h)


class Net(torch.nn.Module):
    def __init__(self, kind: str = "", threads: tuple[bool, int] | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.Sequential(Block(), Block(kind), Block())
        self.head = torch.nn.Linear(16, 4)
        self.threads = threads

    def forward(self, x):
        if self.threads is not None:
            torch.backends.cuda.matmul.allow_tf32, threads = self.threads  # @settings
            torch.set_num_threads(threads)
        return self.head(self.blocks(x))


def _inputs():
    torch.manual_seed(1)
    return (torch.randn(4, 16),)


def _side(kind: str = "", train: bool = False, threads: tuple[bool, int] | None = None):
    net = Net(kind, threads)
    return (net.train() if train else net.eval()), _inputs()


def reference():
    return _side()


def candidate():
    return _side()


def candidate_dropout():
    return _side(train=True)


def reference_dropout():
    return _side(train=True)


def candidate_noise():
    return _side("noise")


def candidate_seeded_noise():
    return _side("seeded")


def candidate_uninitialised():
    return _side("empty")


def candidate_shuffle():
    return _side("shuffle")


def candidate_dropout_and_bug():
    return _side("gelu", train=True)


def reference_threads():
    return _side(threads=(False, 2))


def candidate_threads():
    model, inputs = _side(threads=(True, 1))
    return copy.deepcopy(model), inputs


def reference_optimizer(model):  # `bisectr train`: the reference against `candidate_dropout()`
    return torch.optim.SGD(model.parameters(), lr=0.01)


candidate_dropout_optimizer = reference_optimizer
