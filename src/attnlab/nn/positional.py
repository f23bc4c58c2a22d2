"""Position representations (000 "Position representations", 003, 004 eq. 14-16).

Attention is permutation equivariant (004 eq. 14), so order must be injected. Every module here
maps token embeddings x (B, T, D) and integer positions (T,) or (B, T) to (B, T, D):

  * :class:`LearnedPositions`     x~_i = x_i + P_i,  P in R^{N x D}  (000)
  * :class:`SinusoidalPositions`  x~_i = x_i + PE(i)  (Vaswani; 003; 004 eq. 16)
  * :class:`ConcatPositions`      x~_i = W [x_i; PE(i)] + b  (004's hypothesis, eq. 15)
  * :class:`NoPositions`          x~_i = x_i  (the permutation-equivariant baseline)
  * :class:`RotaryPositions`      x~_i = x_i; q, k rotated inside attention (Su et al. 2021)
  * ALiBi                         x~_i = x_i; a distance penalty on the logits (``nn.alibi``)

Positions count from 0 (Vaswani). 003 counts from 1 and its worked example is wrong; see
docs/math.md.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(
    positions: Tensor, d: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """PE(n, 2i) = sin(n / base^(2i/d)), PE(n, 2i+1) = cos(n / base^(2i/d))   (004 eq. 16).

    positions: (...) integer or float -> (..., d) in ``dtype`` (computed in float64). Odd d ends
    with a sine column.
    """
    i2 = torch.arange(0, d, 2, device=positions.device, dtype=torch.float64)  # 2i = 0, 2, 4, ...
    inv_freq = torch.exp(-math.log(base) * i2 / d)  # 1 / base^(2i/d), (ceil(d/2),)
    angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq  # (..., ceil(d/2))
    pe = torch.empty(*positions.shape, d, dtype=torch.float64, device=positions.device)
    pe[..., 0::2] = torch.sin(angles)
    pe[..., 1::2] = torch.cos(angles[..., : d // 2])
    return pe.to(dtype)


def default_positions(t: int, offset: int = 0, device: torch.device | None = None) -> Tensor:
    """0..T-1 shifted by ``offset`` (the cache length when decoding): (T,) int64."""
    return torch.arange(offset, offset + t, device=device)


class Positions(nn.Module):
    """A position representation: a signal P for the positions, combined with the embeddings.

    ``forward(x, positions)`` = ``combine(x, signal(positions, x))``; the two halves are public
    so that a model can expose P itself (``attnlab.models.layers.Embeddings.hook_P``).
    """

    def signal(self, positions: Tensor, x: Tensor) -> Tensor | None:
        """P for ``positions`` (T,) or (B, T), in x's dtype: (T|B,T, .) or None (no signal)."""
        return None

    def combine(self, x: Tensor, p: Tensor) -> Tensor:
        """x~ = x + P (the additive representations)."""
        return x + p  # (B, T, D)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        p = self.signal(positions, x)
        return x if p is None else self.combine(x, p)


class NoPositions(Positions):
    """No position information: the model sees a set of tokens (000; 001 "a set")."""


class LearnedPositions(Positions):
    """x~_i = P_i + x_i with a learned table P in R^{N x D} (000). N = max_len bounds the length."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)  # P

    def signal(self, positions: Tensor, x: Tensor) -> Tensor:
        try:  # the lookup itself bounds-checks, so a decode step pays no extra reduction
            return self.table(positions)  # (T|B,T, D)
        except IndexError:
            lo, hi = (int(v) for v in torch.aminmax(positions))
            if lo < 0:
                raise ValueError(f"positions must be >= 0, got {lo}") from None
            raise ValueError(
                f"position {hi} is beyond the learned position table (max_len={self.max_len}); "
                "shorten the sequence or use sinusoidal/rotary positions"
            ) from None


class SinusoidalPositions(Positions):
    """x~_i = x_i + PE(i), the fixed Vaswani sinusoids; defined for any position (no table)."""

    def __init__(self, d_model: int, base: float = 10000.0):
        super().__init__()
        self.d_model, self.base = d_model, base

    def signal(self, positions: Tensor, x: Tensor) -> Tensor:
        return sinusoidal_table(positions, self.d_model, self.base, x.dtype)  # (T|B,T, D)


class ConcatPositions(Positions):
    """x~_i = W [x_i; PE(i)] + b: concatenate sinusoids, then project back to D (004 eq. 15).

    004 hypothesises that concatenation followed by a learned linear map lets the network build any
    position function from the Fourier basis of sinusoids. ``d_pos`` is the width of PE.
    """

    def __init__(self, d_model: int, d_pos: int | None = None, base: float = 10000.0):
        super().__init__()
        self.d_pos, self.base = d_pos or d_model, base
        self.proj = nn.Linear(d_model + self.d_pos, d_model)

    def signal(self, positions: Tensor, x: Tensor) -> Tensor:
        return sinusoidal_table(positions, self.d_pos, self.base, x.dtype)  # (T|B,T, d_pos)

    def combine(self, x: Tensor, p: Tensor) -> Tensor:
        p = p.expand(*x.shape[:-1], self.d_pos)  # (B, T, d_pos)
        return self.proj(torch.cat([x, p], dim=-1))  # (B, T, D)


def rotary_frequencies(
    d_head: int,
    base: float = 10000.0,
    scaling: str = "none",
    factor: float = 1.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_len: int | None = None,
) -> Tensor:
    """theta_i = base^(-2i/Dh), i = 0 .. Dh/2 - 1, optionally rescaled for a longer context.

    scaling "linear" (position interpolation, Chen et al. 2023): theta_i / s, i.e. position p is
    read as p / s. "llama3" (Llama 3.1): with wavelength lambda_i = 2 pi / theta_i and the
    pre-training context L, frequencies with lambda_i < L / high_freq_factor are kept, those with
    lambda_i > L / low_freq_factor are divided by s, and the band between interpolates linearly in
    L / lambda_i. Returns (Dh/2,) float64.
    """
    i2 = torch.arange(0, d_head, 2, dtype=torch.float64)
    theta = base ** (-i2 / d_head)  # (Dh/2,)
    if scaling == "none":
        return theta
    if scaling == "linear":
        return theta / factor
    if scaling != "llama3":
        raise ValueError(f"unknown rotary scaling {scaling!r}; choose 'none', 'linear' or 'llama3'")
    if original_max_len is None:
        raise ValueError("llama3 rotary scaling needs original_max_len (the pre-training context)")
    wavelength = 2 * math.pi / theta
    ratio = original_max_len / wavelength  # L / lambda_i: high for high frequencies
    smooth = ((ratio - low_freq_factor) / (high_freq_factor - low_freq_factor)).clamp(0.0, 1.0)
    return (1 - smooth) * theta / factor + smooth * theta  # smooth 0: scaled, 1: kept


class RotaryPositions(Positions):
    """Rotary position embedding (RoPE): rotate each (i, i + Dh/2) pair of q and k by pos * theta_i.

    theta_i = base^(-2i/Dh) (see :func:`rotary_frequencies` for the context-extension scalings).
    Then q_m^T k_n depends on positions only through m - n. The embeddings pass through unchanged;
    attention calls :meth:`rotate` on queries and keys ("rotate-half" layout, as GPT-NeoX and
    Llama).
    """

    def __init__(self, d_head: int, base: float = 10000.0, *, frequencies: Tensor | None = None):
        super().__init__()
        if d_head % 2:
            raise ValueError(f"rotary positions need an even head width, got d_head={d_head}")
        self.d_head, self.base = d_head, base
        if frequencies is None:
            frequencies = rotary_frequencies(d_head, base)
        if frequencies.shape != (d_head // 2,):
            raise ValueError(f"rotary frequencies must have shape ({d_head // 2},)")
        self.frequencies = frequencies.to(torch.float64)  # theta_i; a constant, not a parameter
        # One module serves every layer, and a forward pass hands all of them the same positions
        # tensor: (positions, its version, dtype, cos, sin) of the last call spares the other
        # 2 x layers - 1 rotations recomputing the table (8 of 9 such computations at 4 layers).
        self._last: tuple | None = None

    def _apply(self, fn, recurse: bool = True):
        """``model.to(device)`` moves theta_i too (it is no buffer: a dtype cast must not round
        it). Left on the CPU, every rotation of a CUDA model would copy it over and wait."""
        super()._apply(fn, recurse)
        self.frequencies = self.frequencies.to(fn(self.frequencies[:0]).device)
        return self

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos(pos * theta_i), sin(pos * theta_i): (T, Dh/2) or (B, 1, T, Dh/2) in ``dtype``."""
        # Inference tensors carry no version counter, so in-place edits would go unseen: no cache.
        cacheable = not (torch.compiler.is_compiling() or positions.is_inference())
        last = self._last
        if (
            cacheable
            and last is not None
            and last[0] is positions
            and last[1] == positions._version
            and last[2] == dtype
        ):
            return last[3], last[4]
        inv_freq = self.frequencies.to(positions.device)  # theta_i, (Dh/2,), float64 for exactness
        angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq  # (.., T, Dh/2)
        if angles.dim() == 3:
            angles = angles.unsqueeze(1)  # (B, 1, T, Dh/2): broadcast over heads
        cos, sin = torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)
        self._last = (positions, positions._version, dtype, cos, sin) if cacheable else None
        return cos, sin

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (B, H, T, Dh); positions (T,) or (B, T) -> (B, H, T, Dh)."""
        cos, sin = self.cos_sin(positions, x.dtype)
        x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, Dh/2) each
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, H, T, Dh)


def make_positions(
    kind: str,
    d_model: int,
    d_head: int,
    max_len: int,
    base: float,
    *,
    frequencies: Tensor | None = None,
) -> Positions:
    """Build the position module named by a config. ``frequencies``: rotary theta_i (default
    base^(-2i/Dh)). ALiBi adds nothing to the embeddings (its biases act in attention)."""
    if kind == "learned":
        return LearnedPositions(max_len, d_model)
    if kind == "sinusoidal":
        return SinusoidalPositions(d_model)
    if kind == "concat":
        return ConcatPositions(d_model)
    if kind == "rotary":
        return RotaryPositions(d_head, base, frequencies=frequencies)
    if kind in ("none", "alibi"):
        return NoPositions()
    raise ValueError(f"unknown positional {kind!r}")
