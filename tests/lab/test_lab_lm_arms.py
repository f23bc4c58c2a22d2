"""The shared parts of the char-LM arm experiments (``lm_extrapolation``, ``table3``): bits/char
on non-overlapping windows, and the checks that let the seed spread decide."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from attnlab.lab.kit.lm_arms import (
    HELD,
    NOT_HELD,
    UNRESOLVED,
    alike,
    bits_per_char,
    judged,
    not_worse,
    scored_text,
    worse,
)


class Uniform(torch.nn.Module):
    """A 'model' whose logits are all zero: every character has probability 1 / V."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.lengths: list[int] = []

    def forward(self, ids):
        self.lengths.append(ids.size(1))
        return SimpleNamespace(logits=torch.zeros(*ids.shape, self.vocab))


def test_bits_per_char_scores_every_position_of_non_overlapping_windows():
    ids = scored_text(torch.arange(200).remainder(7).view(20, 10), 32)  # 199 chars -> 6 x 32 + 1
    assert ids.numel() == 6 * 32 + 1
    for length in (8, 16, 32):  # every length scores the same 192 characters
        model = Uniform(7)
        assert bits_per_char(model, ids, length) == pytest.approx(math.log2(7))
        assert set(model.lengths) == {length}
    with pytest.raises(ValueError, match="multiple of 10"):
        bits_per_char(Uniform(7), ids, 10)


def test_checks_let_the_seed_spread_decide():
    low, high, mid = [1.0, 1.1, 1.2], [1.5, 1.6, 1.7], [1.15, 1.3, 1.6]
    assert worse("w", high, low).state == HELD
    assert worse("w", low, high).state == NOT_HELD
    assert worse("w", mid, low).state == UNRESOLVED
    assert not_worse("n", mid, low).state == HELD and not_worse("n", high, low).state == NOT_HELD
    assert alike("a", mid, low).state == HELD and alike("a", high, low).state == NOT_HELD
    held, unresolved = worse("w", high, low), worse("w", mid, low)
    assert judged([held, held]) == "held"
    assert judged([unresolved, unresolved]) == "no effect resolved"
    assert judged([held, unresolved]) == "mixed"
    assert judged([worse("w", low, high), unresolved]) == "did not hold"
    # a predicted 'no difference' that held does not turn unresolved differences into 'mixed'
    assert judged([unresolved, alike("a", mid, low)]) == "no effect resolved"
    assert judged([unresolved, alike("a", high, low)]) == "did not hold"
