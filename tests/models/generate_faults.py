"""Model files `bisectr generate` must refuse, each with exit status 2 and a message naming the problem.

Reference: `TinyLM`, a causal LM of one layer in plain torch (vocab 32, width 8, `torch.manual_seed(0)`): each
step appends its tokens' embeddings to the cache (a tuple of one tensor, [batch, seq, width]) and reads the
logits off the running mean of the cache. Prompt: input_ids (2, 4) from `default_rng(0)`. Its candidates:

- `candidate()`: the same model (`match`).
- `candidate_no_cache()`: a forward that takes no cache (`forward(input_ids)`).
- `candidate_returns_no_cache()`: a forward that takes a cache and returns only the logits.
- `candidate_other_vocab()`: 48 logits per position instead of 32.
- `candidate_other_prompt()`: other token ids (another tokenizer).
- `candidate_short_positions()`: a model whose config holds 6 positions (the prompt's 4 and 4 generated need 8).
- `candidate_dropout()`: the same model with `Dropout(0.2)` on the states before the logits, in train mode
  (`nondeterministic`, exit 1: the step searched finds the candidate does not repeat itself).
- `candidate_raises()`: raises ValueError at its third call, decoding step 2 (the float64 copy bisectr decodes
  beside it counts its own calls).
"""

import numpy as np
import torch

VOCAB, WIDTH = 32, 8


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = VOCAB):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.head = torch.nn.Linear(WIDTH, vocab)
        self.calls = 0

    def forward(self, input_ids, cache=None):
        self.calls += 1
        states = self.embed(input_ids)
        states = states if cache is None else torch.cat([cache[0], states], dim=1)
        return self.logits(states), (states,)

    def logits(self, states):
        return self.head(states.cumsum(1) / torch.arange(1, states.shape[1] + 1)[None, :, None])


class NoCache(TinyLM):
    def forward(self, input_ids):
        return self.logits(self.embed(input_ids))


class ReturnsNoCache(TinyLM):
    def forward(self, input_ids, cache=None):
        return super().forward(input_ids, cache)[0]


class Raises(TinyLM):
    def forward(self, input_ids, cache=None):
        if self.calls == 3:
            raise ValueError("the third step fails")
        return super().forward(input_ids, cache)


class Config:
    max_position_embeddings = 6


def _prompt(seed: int = 0) -> dict:
    return {"input_ids": torch.from_numpy(np.random.default_rng(seed).integers(0, VOCAB, (2, 4)))}


def reference():
    return TinyLM().eval(), _prompt()


def candidate():
    return TinyLM().eval(), _prompt()


def candidate_no_cache():
    return NoCache().eval(), _prompt()


def candidate_returns_no_cache():
    return ReturnsNoCache().eval(), _prompt()


def candidate_other_vocab():
    return TinyLM(vocab=48).eval(), _prompt()


def candidate_other_prompt():
    return TinyLM().eval(), _prompt(seed=1)


def candidate_short_positions():
    model = TinyLM().eval()
    model.config = Config()
    return model, _prompt()


def candidate_raises():
    return Raises().eval(), _prompt()


class DropoutLM(TinyLM):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.2)

    def logits(self, states):
        return super().logits(self.drop(states))


def candidate_dropout():
    return DropoutLM().train(), reference()[1]
