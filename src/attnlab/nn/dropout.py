"""Dropout (Srivastava et al. 2014; Vaswani 5.4): keep each element with probability 1 - p and
rescale it, dropout(x)_i = x_i * m_i / (1 - p), m_i ~ Bernoulli(1 - p), so E[dropout(x)] = x.

Off (eval mode or p = 0) it returns its input untouched, without a call into PyTorch: a decode
step of a small model would otherwise dispatch a dozen no-op dropout calls per token.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element of x with probability p and rescale the rest by 1/(1-p); x any shape."""
    if not training or p == 0.0:
        return x
    return F.dropout(x, p, training=True)


class Dropout(nn.Dropout):
    """Zero a fraction p of the elements and rescale by 1/(1-p) while training; else identity."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)
