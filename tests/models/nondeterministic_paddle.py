"""Paddle sides that do not repeat themselves, each named at its op with its cause and fix.

`Net`: three `Block`s (Linear 16->16, relu, Dropout(0.1)) and a Linear head, `paddle.seed(0)`; inputs
`paddle.randn([4, 16])`. The reference is the net in eval mode; each candidate puts one source of difference
between runs into block 1 (`blocks.1`) at the line tagged with its name:

- `candidate()`: the same net (`match`).
- `candidate_dropout()`: the net in train mode: every block's dropout on; the first to run is `blocks.0.drop`.
- `reference_dropout()`: the reference in train mode (the candidate is deterministic).
- `candidate_noise()`: adds unseeded `paddle.randn` noise (`@noise`).
- `candidate_uninitialised()`: writes half of a `paddle.empty` buffer and reads all of it (`@empty`).
- `candidate_shuffle()`: shuffles the batch rows with `paddle.randperm` (`@shuffle`).
- `candidate_dropout_and_bug()`: train mode, and gelu in place of relu (`@gelu`): once
  `--fix-nondeterminism` has put it in eval mode, the usual search names the gelu.
"""

import paddle


class Block(paddle.nn.Layer):
    def __init__(self, kind: str = ""):
        super().__init__()
        self.fc = paddle.nn.Linear(16, 16)
        self.drop = paddle.nn.Dropout(0.1)
        self.kind = kind

    def forward(self, x):
        h = self.fc(x)
        h = paddle.nn.functional.gelu(h) if self.kind == "gelu" else paddle.nn.functional.relu(h)  # @gelu
        if self.kind == "noise":
            h = h + 0.1 * paddle.randn(h.shape)  # @noise
        if self.kind == "empty":
            buffer = paddle.empty([h.shape[0], 2 * h.shape[1]])  # @empty
            buffer[:, : h.shape[1]] = h
            h = buffer.reshape([h.shape[0], 2, h.shape[1]]).sum(1)  # @read
        if self.kind == "shuffle":
            h = paddle.index_select(h, paddle.randperm(h.shape[0]))  # @shuffle
        return self.drop(h)


class Net(paddle.nn.Layer):
    def __init__(self, kind: str = ""):
        super().__init__()
        paddle.seed(0)
        self.blocks = paddle.nn.Sequential(Block(), Block(kind), Block())
        self.head = paddle.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.blocks(x))


def _side(kind: str = "", train: bool = False):
    net = Net(kind)
    net.train() if train else net.eval()
    paddle.seed(1)
    return net, (paddle.randn([4, 16]),)


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


def candidate_uninitialised():
    return _side("empty")


def candidate_shuffle():
    return _side("shuffle")


def candidate_dropout_and_bug():
    return _side("gelu", train=True)
