"""The position-wise feed-forward network (000 "Elementwise nonlinearity"; 003; 004).

h_FF = W2 ReLU(W1 h + b1) + b2, applied to every position independently.
Shapes: (B, T, D) -> (B, T, D) with hidden width F (000 uses F = 5D, Vaswani F = 4D).

Without this nonlinearity stacked attention layers collapse to one attention-weighted linear map
(000; shown numerically in the tests and in ``attnlab experiment nonlinearity``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.dropout import Dropout
from attnlab.nn.hooks import HookPoint


def relu_squared(x: Tensor) -> Tensor:
    """ReLU(x)^2 (So et al. 2021, "Primer"): a cheap, strong modern alternative."""
    return torch.square(F.relu(x))


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU with the tanh approximation (Hendrycks & Gimpel 2016), GPT-2's "gelu_new":
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Needed for exact parity with GPT-2 weights."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": gelu_tanh, "relu2": relu_squared}


class FeedForward(nn.Module):
    """W2 a(W1 h + b1) + b2 with a in {ReLU (000), GELU (exact or tanh), ReLU^2}."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        activation: str = "relu",
        bias: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from {list(ACTIVATIONS)}")
        self.activation = activation
        self.up = nn.Linear(d_model, d_ff, bias=bias)  # W1, b1
        self.down = nn.Linear(d_ff, d_model, bias=bias)  # W2, b2
        self.dropout = Dropout(dropout)
        self.hook_hidden = HookPoint()  # a(W1 h + b1), (B, T, F)

    def forward(self, h: Tensor) -> Tensor:
        """h: (B, T, D) -> (B, T, D)."""
        return self.down(self.dropout(self.hook_hidden(ACTIVATIONS[self.activation](self.up(h)))))
