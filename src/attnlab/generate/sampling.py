"""Logit processors and token choosers: small pure functions on a (R, V) batch of logits.

Order of application (as Hugging Face): repetition penalty, temperature, top-k, top-p, then
greedy argmax or a weighted random draw. Filters set excluded logits to -inf, so the softmax gives
them probability exactly 0.

    temperature      p_i = softmax(z / tau)_i               (003 "random-weighted sampling")
    top-k            keep z_i if i is among the k largest logits
    top-p (nucleus)  sort p descending; keep the smallest prefix whose mass reaches p, i.e. keep
                     token r (in sorted order) iff sum_{r' < r} p_r' < p -- the token that crosses
                     p is kept (Holtzman et al. 2020)
    repetition       z_i <- z_i / theta if z_i > 0 else z_i * theta, for every token already seen
                     (CTRL, Keskar et al. 2019; the convention of Hugging Face)
    greedy           w = argmax_i z_i                                 (003 "greedy sampling")

Ties are broken deterministically towards the lower token id (stable sorts; argmax returns the
first maximum). Shapes: R rows (prompts x beams), V vocabulary.
"""

from __future__ import annotations

import secrets

import torch
from torch import Tensor

from attnlab.generate.config import GenerationConfig


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """z / tau. tau = 0 is greedy and must not reach here (it would divide by zero)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to scale logits, got {temperature}; 0 = greedy")
    return logits if temperature == 1.0 else logits / temperature


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row (ties at the k-th value kept towards lower ids)."""
    if k <= 0 or k >= logits.size(-1):
        return logits
    _, index = torch.sort(logits, dim=-1, descending=True, stable=True)  # (R, V)
    drop = index[:, k:]  # (R, V - k) ids outside the top k
    return logits.scatter(-1, drop, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep exactly the smallest set of most likely tokens whose probability reaches p.

    Sorted descending (stable: equal probabilities keep ascending id order), token r is kept iff
    the mass strictly before it is < p; the most likely token is always kept. The cumulative sum
    runs in float64 so the boundary does not wobble with float32 rounding.
    """
    if p >= 1.0:
        return logits
    sorted_logits, index = torch.sort(logits, dim=-1, descending=True, stable=True)  # (R, V)
    probs = sorted_logits.double().softmax(dim=-1)  # (R, V)
    mass_before = probs.cumsum(dim=-1) - probs  # (R, V) exclusive prefix sums
    drop_sorted = mass_before >= p  # (R, V), never true at rank 0
    drop = torch.zeros_like(drop_sorted).scatter(-1, index, drop_sorted)  # back to id order
    return logits.masked_fill(drop, float("-inf"))


def repetition_penalty(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """CTRL penalty on every token already seen: positive logits / theta, negative ones * theta.

    seen: (R, V) bool, True where the token occurred (prompt and generated; never padding).
    """
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def check_finite_logits(logits: Tensor) -> Tensor:
    """The model's first logits, checked: NaN or inf there means weights that are damaged,
    diverged or never loaded (argmax would pick token 0 and sampling would fail)."""
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(
            "the model's logits hold NaN or inf values, so there is nothing to decode: its "
            "weights are damaged, diverged or were never loaded; check them with "
            "torch.isfinite(p).all() for p in model.parameters(), or load another checkpoint"
        )
    return logits


def greedy(logits: Tensor) -> Tensor:
    """argmax_i z_i per row (the first maximum on ties): (R, V) -> (R,) int64."""
    return logits.argmax(dim=-1)


def sample(logits: Tensor, generator: torch.Generator) -> Tensor:
    """Draw w ~ softmax(z) per row with ``generator`` (never the global RNG): (R, V) -> (R,)."""
    probs = logits.float().softmax(dim=-1)  # (R, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def process_logits(logits: Tensor, config: GenerationConfig, seen: Tensor | None) -> Tensor:
    """Apply the configured processors (not the final choice): (R, V) -> (R, V)."""
    if seen is not None:
        logits = repetition_penalty(logits, seen, config.repetition_penalty)
    if config.sampling:
        logits = apply_temperature(logits, config.temperature)
        logits = top_k_filter(logits, config.top_k)
        logits = top_p_filter(logits, config.top_p)
    return logits


def choose_next(
    logits: Tensor, config: GenerationConfig, seen: Tensor | None, generator: torch.Generator | None
) -> Tensor:
    """The next token of every row: processors, then argmax (greedy) or a draw (sampling)."""
    logits = process_logits(logits, config, seen)
    if config.sampling:
        if generator is None:
            raise ValueError("sampling needs a torch.Generator; use make_generator(seed)")
        return sample(logits, generator)
    return greedy(logits)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A private generator seeded with ``seed``: reproducible draws, global RNG untouched."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def seen_tokens(ids: Tensor, mask: Tensor | None, vocab_size: int) -> Tensor:
    """(R, T) ids and (R, T) real-token mask -> (R, V) bool: which tokens occur in each row.

    Padding (mask False) contributes nothing, unlike Hugging Face, which penalises the pad token.
    """
    hits = torch.zeros(ids.size(0), vocab_size, dtype=torch.int32, device=ids.device)  # (R, V)
    src = torch.ones_like(ids, dtype=torch.int32) if mask is None else mask.to(torch.int32)
    return hits.scatter_add_(1, ids, src) > 0


def fresh_seed() -> int:
    """A new random seed from the OS (the global torch RNG is neither read nor advanced)."""
    return secrets.randbits(63)
