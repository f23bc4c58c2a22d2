"""Logit processors against their definitions, and GenerationConfig validation."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.generate import (
    GenerationConfig,
    apply_temperature,
    greedy,
    make_generator,
    repetition_penalty,
    sample,
    top_k_filter,
    top_p_filter,
)
from attnlab.generate.config import special_ids
from attnlab.generate.sampling import seen_tokens


def kept(logits: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logits).nonzero().flatten().tolist())


def smallest_set_reaching(probs: list[float], p: float) -> set[int]:
    """Brute force: among all subsets whose mass reaches p, the smallest; ties -> the larger mass,
    then the lower ids (what a stable descending sort keeps)."""
    n = len(probs)
    for size in range(1, n + 1):
        best = None
        for subset in itertools.combinations(range(n), size):
            mass = sum(probs[i] for i in subset)
            if mass >= p - 1e-12:
                key = (-round(mass, 12), subset)
                best = key if best is None or key < best else best
        if best is not None:
            return set(best[1])
    return set(range(n))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-4, 4), min_size=2, max_size=7),
    st.sampled_from([0.05, 0.3, 0.5, 0.75, 0.9, 0.999]),
)
def test_top_p_keeps_exactly_the_smallest_set_reaching_p(raw, p):
    logits = torch.tensor(raw, dtype=torch.float32) / 2  # many exact ties
    probs = logits.double().softmax(-1).tolist()
    got = kept(top_p_filter(logits[None], p)[0])
    want = smallest_set_reaching(probs, p)
    assert len(got) == len(want)
    assert sum(probs[i] for i in got) >= p - 1e-9
    # Deterministic ties: among equal probabilities the lower ids are kept.
    assert got == want


def test_top_p_includes_the_token_that_crosses_p_and_keeps_the_argmax():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    assert kept(top_p_filter(logits, 0.5)[0]) == {0}  # 0.5 already reaches 0.5
    assert kept(top_p_filter(logits, 0.51)[0]) == {0, 1}  # 0.3 crosses 0.51
    assert kept(top_p_filter(logits, 0.8)[0]) == {0, 1}
    assert kept(top_p_filter(logits, 0.81)[0]) == {0, 1, 2}
    assert kept(top_p_filter(logits, 1e-9)[0]) == {0}
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_top_k_keeps_the_k_largest_with_deterministic_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0]])
    assert kept(top_k_filter(logits, 2)[0]) == {1, 2}
    assert kept(top_k_filter(logits, 4)[0]) == {0, 1, 2, 4}
    assert torch.equal(top_k_filter(logits, 0), logits)
    assert torch.equal(top_k_filter(logits, 9), logits)


def test_temperature_scales_and_refuses_zero():
    z = torch.tensor([[1.0, 2.0]])
    torch.testing.assert_close(apply_temperature(z, 0.5), z * 2)
    with pytest.raises(ValueError, match="greedy"):
        apply_temperature(z, 0.0)


def test_repetition_penalty_is_ctrl_style_and_skips_padding():
    z = torch.tensor([[2.0, -2.0, 2.0, -2.0]])
    seen = torch.tensor([[True, True, False, False]])
    torch.testing.assert_close(repetition_penalty(z, seen, 2.0), torch.tensor([[1.0, -4.0, 2, -2]]))
    ids = torch.tensor([[0, 0, 3, 1]])
    mask = torch.tensor([[False, False, True, True]])  # two left pads (id 0)
    assert seen_tokens(ids, mask, 5).tolist() == [[False, True, False, True, False]]


def test_greedy_takes_the_first_maximum():
    assert greedy(torch.tensor([[0.0, 2.0, 2.0], [5.0, 1.0, 5.0]])).tolist() == [1, 0]


def test_sampling_follows_the_distribution_and_is_seeded():
    probs = torch.tensor([0.1, 0.6, 0.3])
    logits = probs.log().expand(20000, 3)
    draws = sample(logits, make_generator(0))
    freq = torch.bincount(draws, minlength=3).float() / draws.numel()
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)
    assert torch.equal(sample(logits, make_generator(4)), sample(logits, make_generator(4)))
    masked = top_k_filter(logits[:50], 1)
    assert set(sample(masked, make_generator(1)).tolist()) == {1}  # -inf is never drawn


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), r"top_k must be an int >= 0"),
        (dict(top_k=2.5), "top_k"),
        (dict(temperature=-0.1), r"temperature must be >= 0"),
        (dict(temperature=float("nan")), "finite"),
        (dict(num_beams=0), r"num_beams must be an int >= 1"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(do_sample=True, temperature=0.0), "contradicts temperature=0"),
        (dict(num_beams=3, do_sample=True), "beam search .* does not sample"),
        (dict(num_beams=3, top_k=5), "top_k/top_p"),
        (dict(num_beams=3, stop_strings=("x",)), "stop strings"),
        (dict(stop_strings=("",)), "non-empty"),
        (dict(stop_token_ids=(-1,)), "stop_token_ids"),
        (dict(seed="1"), "seed"),
        (dict(bos_token_id=-2), "bos_token_id"),
        (dict(length_penalty=2.0), "length_penalty act only in beam search; set num_beams > 1"),
        (dict(early_stopping=True, length_penalty=0.5), "length_penalty and early_stopping"),
    ],
)
def test_generation_config_rejects_bad_values_with_a_named_fix(changes, match):
    with pytest.raises(ValueError, match=match):
        GenerationConfig(**changes)


def test_generation_config_strategy_and_special_ids():
    assert GenerationConfig().sampling
    assert not GenerationConfig(temperature=0).sampling
    assert not GenerationConfig(do_sample=False).sampling
    assert not GenerationConfig(num_beams=4).sampling
    cfg = GenerationConfig(stop_strings="\n\n", stop_token_ids=[5])
    assert cfg.stop_strings == ("\n\n",) and cfg.stop_token_ids == (5,)

    class Tok:
        bos_id, pad_id, eos_id = 1, 0, 2

    assert special_ids(GenerationConfig(), Tok()) == (1, 0, (2,))
    assert special_ids(GenerationConfig(), None) == (None, 0, ())
    assert special_ids(GenerationConfig(stop_token_ids=(), bos_token_id=7), Tok()) == (7, 0, ())
