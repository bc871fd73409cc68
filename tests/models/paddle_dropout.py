"""A paddle model left in training mode: dropout changes every run, so re-runs cannot follow the recording.

Both sides are the same seeded `paddle.nn.Sequential(Linear, Dropout(0.5), Linear)` in train mode:
`nondeterministic` on both sides, at the dropout (exit 1).
"""


def _model():
    import paddle

    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(16, 16), paddle.nn.Dropout(0.5), paddle.nn.Linear(16, 4))
    model.train()
    return model, (paddle.randn([4, 16]),)


def reference():
    return _model()


def candidate():
    return _model()
