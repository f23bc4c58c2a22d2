"""ALiBi: attention with linear biases instead of position embeddings (Press et al. 2022).

No position vector is added to the tokens. Instead every head h adds a fixed penalty, linear in
the distance between query and key, to its attention logits:

    s_ij = q_i^T k_j / sqrt(d_k) - m_h |p_i - p_j|,      m_h = 2^(-8 h / H),  h = 1 .. H

(Press et al. eq. in §3; for causal attention j <= i, so |p_i - p_j| = p_i - p_j and this is the
paper's bias). The slopes m_h form a geometric sequence: head 1 looks mostly at nearby tokens,
head H almost uniformly far back. Because the bias depends only on distances, a model trained on
short sequences extrapolates to longer ones (the paper's point; ``attnlab experiment
extrapolation``).

The position scheme ``attnlab.nn.positional.ALiBiPositions`` (``positional="alibi"``) holds the
slopes and adds this bias through its logit-bias side; the functions here are its equations.

Shapes: B batch, H heads, T queries, S keys. Positions p are integers, (T,)/(S,) or (B, T)/(B, S):
with left padding the positions of each row start at its first real token, so the biases of a
padded batch equal those of each sequence alone.

Deviations from the paper: the absolute distance makes the bias defined for bidirectional
(encoder) attention too; causal attention, the paper's setting, is unchanged by it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def alibi_slopes(n_heads: int) -> Tensor:
    """m_h = 2^(-8h/H) for h = 1..H when H is a power of two (Press et al. §3).

    Otherwise, as in the paper's code: the slopes of the largest power of two H' < H, followed by
    every other slope of 2H' (the odd-numbered ones) for the remaining H - H' heads. (H,) float32.
    """
    if not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads={n_heads!r} must be a positive int")

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    lower = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = geometric(lower)
    if lower < n_heads:
        slopes += geometric(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """The additive logit bias -m_h |p_i - p_j|: (H,), (T,)|(B, T), (S,)|(B, S) -> (B|1, H, T, S).

    Returned in the slopes' dtype; add it to Q K^T / sqrt(d_k) before the mask and the softmax.
    """
    if q_positions.dim() == 1:
        q_positions = q_positions.unsqueeze(0)  # (1, T)
    if k_positions.dim() == 1:
        k_positions = k_positions.unsqueeze(0)  # (1, S)
    distance = (q_positions[:, :, None] - k_positions[:, None, :]).abs()  # (B|1, T, S)
    return -slopes[None, :, None, None] * distance[:, None].to(slopes.dtype)  # (B|1, H, T, S)
