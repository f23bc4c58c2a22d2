"""Position schemes (000 "Position representations", 003, 004 eq. 14-16; RoPE; ALiBi).

Attention is permutation equivariant (004 eq. 14), so order must be injected. A *position scheme*
owns all of its maths, on up to three sides, and describes itself:

  * the embedding side, ``signal(positions, x)`` and ``combine(x, P)``: x~ = combine(x, P);
  * the rotation side, ``rotate(q_or_k, positions)`` inside attention (``rotates``);
  * the logit-bias side, ``logit_bias(q_index, k_index, dtype)`` added to Q K^T / sqrt(d_k)
    inside attention (``biases``);
  * ``describe(positions)``: a :class:`PositionDescription`, the equation, a one-line summary and
    the tables drawn for these positions, computed by the same methods the forward calls. The
    explorer, ``attnlab.inspect`` and ``attnlab.viz`` show this and derive nothing themselves.

The schemes, each registered under its config name (``ModelConfig.positional``):

  * :class:`LearnedPositions`     x~_i = x_i + P_i,  P in R^{N x D}  (000)
  * :class:`SinusoidalPositions`  x~_i = x_i + PE(i)  (Vaswani; 003; 004 eq. 16)
  * :class:`ConcatPositions`      x~_i = W [x_i; PE(i)] + b  (004's hypothesis, eq. 15)
  * :class:`NoPositions`          x~_i = x_i  (the permutation-equivariant baseline)
  * :class:`RotaryPositions`      x~_i = x_i; q, k rotated inside attention (Su et al. 2021)
  * :class:`ALiBiPositions`       x~_i = x_i; -m_h |i - j| on the logits (Press et al. 2022)

A new scheme is one subclass here with a ``kind`` (it registers itself for
:func:`make_positions`), its config choice in ``attnlab.config``, its oracle in
``attnlab.reference`` and its tests.

Positions count from 0 (Vaswani). 003 counts from 1 and its worked example is wrong; see
docs/math.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnlab.nn.alibi import alibi_bias, alibi_slopes


class PositionDescription(NamedTuple):
    """What a scheme shows about itself for some positions (the explorer's position view)."""

    kind: str  # the config name
    acts_on: str  # "embeddings", "queries and keys", "logits" or "nothing"
    equation: str
    summary: str  # one line, true of this scheme as configured
    values: Tensor | None  # the table drawn against the positions, (T, C); None: nothing to draw
    cols: list[str]  # the labels of values' C columns
    tables: dict[str, Tensor]  # the scheme's own tables (frequencies, slopes, biases)


class RopeScaling(NamedTuple):
    """Rotary context-extension settings (see :func:`rotary_frequencies`)."""

    scaling: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int | None = None


class PositionSizes(NamedTuple):
    """The model sizes a scheme may be built from (:meth:`Positions.build`)."""

    d_model: int
    d_head: int
    n_heads: int
    max_len: int
    base: float = 10000.0  # the rotary base (the sinusoids keep Vaswani's 10000)
    rope: RopeScaling = RopeScaling()


NO_SCALING = RopeScaling()
SCHEMES: dict[str, type[Positions]] = {}


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
    """A position scheme (see the module docstring): the base acts on no side.

    ``forward(x, positions)`` = ``combine(x, signal(positions, x))``; the two halves are public
    so that a model can expose P itself (``attnlab.models.layers.Embeddings.hook_P``).
    """

    kind = ""  # the config name; a subclass that sets it is registered in SCHEMES
    rotates = False  # the rotation side acts (rotate)
    biases = False  # the logit-bias side acts (logit_bias)
    table_name = "P"  # the name of the embedding side's table in describe()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            SCHEMES[cls.kind] = cls

    @classmethod
    def build(cls, sizes: PositionSizes) -> Positions:
        """The scheme for a model of these sizes."""
        return cls()

    @property
    def embeds(self) -> bool:
        """True when the embedding side adds a signal P (``signal`` is defined)."""
        return type(self).signal is not Positions.signal

    def signal(self, positions: Tensor, x: Tensor) -> Tensor | None:
        """P for ``positions`` (T,) or (B, T), in x's dtype: (T|B,T, .) or None (no signal)."""
        return None

    def combine(self, x: Tensor, p: Tensor) -> Tensor:
        """x~ = x + P (the additive representations)."""
        return x + p  # (B, T, D)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        p = self.signal(positions, x)
        return x if p is None else self.combine(x, p)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """The rotation side: q or k (B, H, T, Dh) at ``positions`` -> (B, H, T, Dh)."""
        return x

    def logit_bias(self, q_index: Tensor, k_index: Tensor, dtype: torch.dtype) -> Tensor | None:
        """The logit-bias side: (T,), (S,) token indices -> (1, H, T, S) in ``dtype``, or None."""
        return None

    def equation(self) -> str:
        """The scheme's equation, as the explorer prints it."""
        return "x~_i = x_i + P_i"

    def summary(self) -> str:
        """One line, true of this scheme as configured."""
        return f"{type(self).__name__}: a position signal P added to the embeddings."

    def describe(
        self, positions: Tensor, dtype: torch.dtype = torch.float64
    ) -> PositionDescription:
        """What the scheme shows for ``positions`` (T,): here the embedding side's signal P
        (T, C), computed by :meth:`signal` itself (the schemes acting inside attention override
        this with their angles or biases)."""
        p = self.signal(positions, torch.empty(0, dtype=dtype))  # (T, C) or None
        kind, equation, summary = self.kind or type(self).__name__, self.equation(), self.summary()
        if p is None:
            return PositionDescription(kind, "nothing", equation, summary, None, [], {})
        p = p.detach()
        cols = _cols("d", p.size(-1))
        return PositionDescription(
            kind, "embeddings", equation, summary, p, cols, {self.table_name: p}
        )


def _cols(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


class NoPositions(Positions):
    """No position information: the model sees a set of tokens (000; 001 "a set")."""

    kind = "none"

    def equation(self) -> str:
        return "x~_i = x_i"

    def summary(self) -> str:
        return (
            "No position signal: attention alone is permutation equivariant (004 eq. 14; 001 "
            "'a set, not a sequence'); in a causal model only the future mask orders the tokens."
        )


class LearnedPositions(Positions):
    """x~_i = P_i + x_i with a learned table P in R^{N x D} (000). N = max_len bounds the length."""

    kind = "learned"

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)  # P

    @classmethod
    def build(cls, sizes: PositionSizes) -> LearnedPositions:
        return cls(sizes.max_len, sizes.d_model)

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

    def equation(self) -> str:
        return f"x~_i = x_i + P_i,  P ∈ R^{{N×d}} learned, N = {self.max_len}"

    def summary(self) -> str:
        return (
            "000 'Position representations': a learned table P, one row per position, added to "
            f"the token embeddings; N = {self.max_len} bounds the length."
        )


class SinusoidalPositions(Positions):
    """x~_i = x_i + PE(i), the fixed Vaswani sinusoids; defined for any position (no table)."""

    kind = "sinusoidal"

    def __init__(self, d_model: int, base: float = 10000.0):
        super().__init__()
        self.d_model, self.base = d_model, base

    @classmethod
    def build(cls, sizes: PositionSizes) -> SinusoidalPositions:
        return cls(sizes.d_model)

    def signal(self, positions: Tensor, x: Tensor) -> Tensor:
        return sinusoidal_table(positions, self.d_model, self.base, x.dtype)  # (T|B,T, D)

    table_name = "PE"

    def equation(self) -> str:
        return (
            f"PE(n, 2i) = sin(n / {self.base:g}^{{2i/d}}), "
            f"PE(n, 2i+1) = cos(n / {self.base:g}^{{2i/d}})"
        )

    def summary(self) -> str:
        return "004 eq. 16 (and 003): fixed sinusoids added to the embeddings, x~_n = x_n + PE(n)."


class ConcatPositions(Positions):
    """x~_i = W [x_i; PE(i)] + b: concatenate sinusoids, then project back to D (004 eq. 15).

    004 hypothesises that concatenation followed by a learned linear map lets the network build any
    position function from the Fourier basis of sinusoids. ``d_pos`` is the width of PE.
    """

    kind = "concat"

    def __init__(self, d_model: int, d_pos: int | None = None, base: float = 10000.0):
        super().__init__()
        self.d_pos, self.base = d_pos or d_model, base
        self.proj = nn.Linear(d_model + self.d_pos, d_model)

    @classmethod
    def build(cls, sizes: PositionSizes) -> ConcatPositions:
        return cls(sizes.d_model)

    def signal(self, positions: Tensor, x: Tensor) -> Tensor:
        return sinusoidal_table(positions, self.d_pos, self.base, x.dtype)  # (T|B,T, d_pos)

    def combine(self, x: Tensor, p: Tensor) -> Tensor:
        p = p.expand(*x.shape[:-1], self.d_pos)  # (B, T, d_pos)
        return self.proj(torch.cat([x, p], dim=-1))  # (B, T, D)

    table_name = "PE"

    def equation(self) -> str:
        return "x~_n = W [x_n; PE(n)] + b"

    def summary(self) -> str:
        return (
            "004 eq. 15: the sinusoids PE(n) are concatenated to the embeddings, then a learned "
            "linear map W projects back to d."
        )


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

    theta_i = base^(-2i/Dh), optionally rescaled by ``scaling`` (:func:`rotary_frequencies`), or
    the given ``frequencies``. Then q_m^T k_n depends on positions only through m - n. The
    embeddings pass through unchanged; attention calls :meth:`rotate` on queries and keys
    ("rotate-half" layout, as GPT-NeoX and Llama).
    """

    kind = "rotary"
    rotates = True
    TABLE_ENTRIES = 2**20  # the compiled path's cos table: at most 8 MB of float64 (sin as much)

    def __init__(
        self,
        d_head: int,
        base: float = 10000.0,
        *,
        frequencies: Tensor | None = None,
        scaling: RopeScaling = NO_SCALING,
        max_len: int | None = None,
    ):
        super().__init__()
        if d_head % 2:
            raise ValueError(f"rotary positions need an even head width, got d_head={d_head}")
        self.d_head, self.base, self.scaling = d_head, base, scaling
        self.given = frequencies is not None
        if frequencies is None:
            frequencies = rotary_frequencies(d_head, base, *scaling)
        if frequencies.shape != (d_head // 2,):
            raise ValueError(f"rotary frequencies must have shape ({d_head // 2},)")
        self.frequencies = frequencies.to(torch.float64)  # theta_i; a constant, not a parameter
        # One module serves every layer, and a forward pass hands all of them the same positions
        # tensor: (positions, its version, dtype, cos, sin) of the last call spares the other
        # 2 x layers - 1 rotations recomputing the table (7 of 8 such computations at 4 layers).
        self._last: tuple | None = None
        # Compiled, the float64 cos and sin of cos_sin would be inlined by inductor into the
        # kernel that rotates q and k, and recomputed for each of their elements (a 6 x 384
        # model's step on an H200: 29.5 ms, against 10.6 ms reading a table; issue 37,
        # benchmarks/cuda/NANOGPT.md). A model of known max_len keeps cos and sin of positions
        # 0..max_len-1 (the same float64 values), which compiled code gathers, unless the
        # table would exceed TABLE_ENTRIES per function. (The models keep their positions below
        # max_len; explicit positions beyond it, fine eagerly, are out of the table's range.)
        self._table: tuple[Tensor, Tensor] | None = None
        if max_len is not None and max_len * d_head // 2 <= self.TABLE_ENTRIES:
            angles = self.angles(torch.arange(max_len))  # (max_len, Dh/2)
            self._table = (torch.cos(angles), torch.sin(angles))

    @classmethod
    def build(cls, sizes: PositionSizes) -> RotaryPositions:
        return cls(sizes.d_head, sizes.base, scaling=sizes.rope, max_len=sizes.max_len)

    def angles(self, positions: Tensor) -> Tensor:
        """m * theta_i for positions m (T,) or (B, T): (.., T, Dh/2) float64."""
        inv_freq = self.frequencies.to(positions.device)  # theta_i, (Dh/2,), float64 for exactness
        return positions.to(torch.float64).unsqueeze(-1) * inv_freq  # (.., T, Dh/2)

    def _apply(self, fn, recurse: bool = True):
        """``model.to(device)`` moves theta_i too (it is no buffer: a dtype cast must not round
        it). Left on the CPU, every rotation of a CUDA model would copy it over and wait."""
        super()._apply(fn, recurse)
        device = fn(self.frequencies[:0]).device
        self.frequencies = self.frequencies.to(device)
        if self._table is not None:
            self._table = (self._table[0].to(device), self._table[1].to(device))
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
        if self._table is not None and torch.compiler.is_compiling():
            cos, sin = self._table[0][positions], self._table[1][positions]  # (.., T, Dh/2)
        else:
            angles = self.angles(positions)  # (.., T, Dh/2)
            cos, sin = torch.cos(angles), torch.sin(angles)
        if cos.dim() == 3:  # (B, 1, T, Dh/2): broadcast over heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        cos, sin = cos.to(dtype), sin.to(dtype)
        self._last = (positions, positions._version, dtype, cos, sin) if cacheable else None
        return cos, sin

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (B, H, T, Dh); positions (T,) or (B, T) -> (B, H, T, Dh)."""
        t = x.size(-2)
        if tuple(positions.shape) not in ((t,), (x.size(0), t), (1, t)):
            raise ValueError(
                f"rotary positions of shape {tuple(positions.shape)} do not fit x of shape "
                f"{tuple(x.shape)} (B, H, T, Dh): give ({t},) or ({x.size(0)}, {t}) positions"
            )
        cos, sin = self.cos_sin(positions, x.dtype)
        x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, Dh/2) each
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, H, T, Dh)

    def describe(
        self, positions: Tensor, dtype: torch.dtype = torch.float64
    ) -> PositionDescription:
        angles = self.angles(positions).to(dtype)  # (T, Dh/2), what rotate turns q_m, k_m by
        theta = f"θ_i = {self.base:g}^{{-2i/{self.d_head}}}"
        scaling, factor = self.scaling.scaling, self.scaling.factor
        if self.given:
            theta, how = "θ_i given", " Its frequencies θ_i were given explicitly."
        elif scaling == "linear":
            theta += f" / {factor:g}"
            how = (
                f" Linear scaling (position interpolation) by {factor:g}: position m is read as "
                f"m / {factor:g}."
            )
        elif scaling == "llama3":
            theta += f", low frequencies / {factor:g} (Llama 3.1)"
            how = (
                f" Llama 3.1 scaling: wavelengths above L / {self.scaling.low_freq_factor:g} "
                f"(L = {self.scaling.original_max_len}) are divided by {factor:g}, below "
                f"L / {self.scaling.high_freq_factor:g} kept, interpolated between."
            )
        else:
            how = ""
        return PositionDescription(
            "rotary",
            "queries and keys",
            f"angle(m, i) = m · θ_i,  {theta}; q_m and k_m are turned by these angles",
            "RoPE (beyond the notes, docs/math.md): queries and keys are rotated inside attention, "
            "so q_m^T k_n depends only on m - n; nothing is added to the tokens." + how,
            angles,
            _cols("θ", angles.size(-1)),
            {"frequencies": self.frequencies.to(dtype)},
        )


class ALiBiPositions(Positions):
    """ALiBi: head h adds -m_h |i - j| to its logits (Press et al. 2022; ``attnlab.nn.alibi``).

    The slopes m_h are a constant buffer (they follow the module's device and are not saved).
    """

    kind = "alibi"
    biases = True
    slopes: Tensor  # m_h (H,), a buffer

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)  # m_h, (H,)

    @classmethod
    def build(cls, sizes: PositionSizes) -> ALiBiPositions:
        return cls(sizes.n_heads)

    def logit_bias(self, q_index: Tensor, k_index: Tensor, dtype: torch.dtype) -> Tensor:
        return alibi_bias(self.slopes.to(dtype), q_index, k_index)  # (1, H, T, S)

    def describe(
        self, positions: Tensor, dtype: torch.dtype = torch.float64
    ) -> PositionDescription:
        bias = self.logit_bias(positions, positions, dtype)[0]  # (H, T, T)
        slopes = ", ".join(f"{m:.4g}" for m in self.slopes.tolist())
        return PositionDescription(
            "alibi",
            "logits",
            "s_ij = q_i^T k_j / sqrt(d_k) - m_h |i - j|,  m_h = 2^{-8h/H}",
            "ALiBi carries order through a logit bias, not the embeddings: head h adds "
            f"-m_h |i - j| to its attention logits (slopes m_h = {slopes}); shown: head 0.",
            bias[0],
            _cols("j", bias.size(-1)),
            {"slopes": self.slopes.to(dtype), "bias": bias},
        )


def make_positions(
    kind: str,
    d_model: int,
    d_head: int,
    max_len: int,
    base: float = 10000.0,
    *,
    n_heads: int = 1,
    rope: RopeScaling = NO_SCALING,
) -> Positions:
    """Build the position scheme named by a config (``ModelConfig.positional``): the scheme
    registered under ``kind`` (:data:`SCHEMES`), for these sizes."""
    scheme = SCHEMES.get(kind)
    if scheme is None:
        raise ValueError(f"unknown positional {kind!r}; choose from {sorted(SCHEMES)}")
    return scheme.build(PositionSizes(d_model, d_head, n_heads, max_len, base, rope))
