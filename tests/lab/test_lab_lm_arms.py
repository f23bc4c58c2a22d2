"""The shared char-LM arm harness (``lm_extrapolation``, ``table3``, ``qkv``, ``ffn_width``,
``layernorm``): nats/char on non-overlapping windows, the arms' model, and the checks that let the
seed spread decide."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from attnlab.lab.kit.lm_arms import (
    HELD,
    NOT_HELD,
    SIZE,
    UNRESOLVED,
    Arm,
    alike,
    build,
    judged,
    loss_per_char,
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


def test_loss_per_char_scores_every_position_of_non_overlapping_windows():
    ids = scored_text(torch.arange(200).remainder(7).view(20, 10), 32)  # 199 chars -> 6 x 32 + 1
    assert ids.numel() == 6 * 32 + 1
    for length in (8, 16, 32):  # every length scores the same 192 characters
        model = Uniform(7)
        assert loss_per_char(model, ids, length) == pytest.approx(math.log(7))  # nats
        assert set(model.lengths) == {length}
    with pytest.raises(ValueError, match="multiple of 10"):
        loss_per_char(Uniform(7), ids, 10)


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


def test_an_arm_changes_only_its_own_fields():
    size = SIZE[True]
    base = build(Arm("base"), 11, size, 4 * size.context)
    deep = build(Arm("deep", (("positional", "alibi"),), n_layers=3), 11, size, size.context)
    assert len(base.blocks) == size.n_layers and len(deep.blocks) == 3
    assert base.cfg.d_model == deep.cfg.d_model == size.d_model
    assert base.cfg.positional == "learned" and deep.cfg.positional == "alibi"
    assert base.cfg.embed_scale and base.cfg.dropout == 0.0
    emb = (
        base.embed.tok_emb.weight.detach()
    )  # N(0, 1/d_model): unit entries once scaled by sqrt(d_model)
    assert float(emb.std() * size.d_model**0.5) == pytest.approx(1.0, abs=0.15)
    assert Arm("long", multiples=(1, 2, 8)).lengths(16) == [16, 32, 128]
