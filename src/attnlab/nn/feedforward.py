"""The position-wise feed-forward network (000 "Elementwise nonlinearity"; 003; 004).

h_FF = W2 ReLU(W1 h + b1) + b2, applied to every position independently.
Shapes: (B, T, D) -> (B, T, D) with hidden width F (000 uses F = 5D, Vaswani F = 4D).

:class:`GatedFeedForward` is the gated variant of today's open models (Shazeer 2020, "GLU Variants
Improve Transformer"): h_FF = W2 (a(W_g h) * W1 h), with a = SiLU (SwiGLU: Llama, Mistral, Qwen)
or GELU (GeGLU: Gemma, T5 v1.1). It has three matrices instead of two, so models using it shrink
F to about 8D/3 to keep the parameter count of a 4D ReLU network.

Without this nonlinearity stacked attention layers collapse to one attention-weighted linear map
(000; shown numerically in the tests and in ``attnlab experiment nonlinearity``).
"""

from __future__ import annotations

from collections.abc import Callable

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


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": gelu_tanh,
    "relu2": relu_squared,
    "silu": F.silu,  # x sigmoid(x) (Elfwing et al. 2018; "Swish" with beta = 1)
}
GATED = {"swiglu": ("silu",), "geglu": ("gelu", "gelu_tanh")}  # each variant's gate activations


class FeedForward(nn.Module):
    """W2 a(W1 h + b1) + b2 with a in {ReLU (000), GELU (exact or tanh), ReLU^2, SiLU}."""

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


class GatedFeedForward(nn.Module):
    """W2 (a(W_g h + b_g) * (W1 h + b1)) + b2 (Shazeer 2020, eq. 5-6): a gated linear unit.

    a = SiLU gives SwiGLU, a = GELU (exact or tanh) GeGLU; ``*`` is the elementwise product: the
    gate a(W_g h) decides, per hidden unit, how much of the linear feature W1 h passes.
    Names follow Hugging Face Llama: ``gate`` = W_g (gate_proj), ``up`` = W1 (up_proj),
    ``down`` = W2 (down_proj).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        activation: str = "silu",
        bias: bool = False,
        dropout: float = 0.0,
    ):
        super().__init__()
        if activation not in ("silu", "gelu", "gelu_tanh"):
            raise ValueError(
                f"a gated feed-forward gates with 'silu' (SwiGLU) or 'gelu'/'gelu_tanh' (GeGLU), "
                f"got {activation!r}"
            )
        self.activation = activation
        self.gate = nn.Linear(d_model, d_ff, bias=bias)  # W_g, b_g
        self.up = nn.Linear(d_model, d_ff, bias=bias)  # W1, b1
        self.down = nn.Linear(d_ff, d_model, bias=bias)  # W2, b2
        self.dropout = Dropout(dropout)
        self.hook_hidden = HookPoint()  # a(W_g h + b_g) * (W1 h + b1), (B, T, F)

    def forward(self, h: Tensor) -> Tensor:
        """h: (B, T, D) -> (B, T, D)."""
        hidden = ACTIVATIONS[self.activation](self.gate(h)) * self.up(h)  # (B, T, F)
        return self.down(self.dropout(self.hook_hidden(hidden)))


class NoFeedForward(nn.Module):
    """No feed-forward network (``ffn="none"``, an ablation): h -> 0, so the sublayer's residual
    add leaves the stream as it is. No parameters."""

    def forward(self, h: Tensor) -> Tensor:
        """h: (B, T, D) -> zeros (B, T, D)."""
        return torch.zeros_like(h)


def make_feedforward(
    kind: str, d_model: int, d_ff: int, *, activation: str, bias: bool, dropout: float
) -> nn.Module:
    """The feed-forward network named by a config: "mlp" (000), "swiglu" or "geglu" (gated),
    or "none" (:class:`NoFeedForward`)."""
    if kind == "none":
        return NoFeedForward()
    if kind == "mlp":
        return FeedForward(d_model, d_ff, activation=activation, bias=bias, dropout=dropout)
    if kind in GATED:
        if activation not in GATED[kind]:
            raise ValueError(f"{kind} gates with {GATED[kind]}, got activation={activation!r}")
        return GatedFeedForward(d_model, d_ff, activation=activation, bias=bias, dropout=dropout)
    raise ValueError(
        f"unknown feed-forward kind {kind!r}; choose 'mlp', 'swiglu', 'geglu' or 'none'"
    )
