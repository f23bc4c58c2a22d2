"""A NumPy oracle of the lecture notes' equations, written in loop form (tests only).

Every function here transcribes one equation of the notes in ``/work/shared/seeds`` as literally
as possible: sums are explicit loops over indices (``h_i = sum_j alpha_ij v_j`` loops over i and
j), heads are a Python loop, LayerNorm is computed element by element. Nothing is vectorised for
speed, so that a reader can check each line against the note it cites, and so that the library's
torch modules can be compared with an implementation that shares none of their code. This module
must never import torch and is never imported by library code (ARCHITECTURE.md).

Notes cited: 000 (Self-Attention and Transformers, a mathematical approach), 001 (Basic
Self-Attention), 002 (self-attention, matrix form), 003 (Transformers, Agarwal), 004 (Lecture notes
on attention & transformers; equations numbered 1-17).

Conventions:
  * Everything is float64; inputs are converted with ``np.asarray(..., dtype=np.float64)``.
  * Row vectors: a linear map is ``y = x @ W + b`` with ``W`` of shape (d_in, d_out). A
    ``torch.nn.Linear`` stores ``weight`` as (d_out, d_in), so pass ``linear.weight.T``. The
    recurrent ``lstm_cell`` is the one exception: it takes torch's (4H, D) layout as stored.
  * Sequences are 2-D ``(N, d)`` (one sequence, as in the notes); loop over a batch in the caller.
    Row-wise maps (softmax, norms, feed-forward, rotary) accept any leading dimensions.
  * Masks are bool, True = may attend (ARCHITECTURE.md). A masked score is treated as -inf, so it
    gets weight exactly 0 and drops out of the softmax normaliser; a query row with no allowed key
    returns a zero weight row and a zero output row.
  * ``scale``: True divides scores by sqrt(d_q) (per head: sqrt(d_head)), False does not scale, a
    float is used as the multiplier itself (as ``scale=`` of torch's SDPA).

Shapes: N queries, M keys/values, d_q query/key width, d_v value width, d_model model width,
H heads, d_head per-head width, d_ff feed-forward width, T source length (recurrent attention).

Deviations from the notes (all listed with reasons in docs/notes_errata.md):
  * 004's prose puts sqrt(d_q) outside the softmax; we follow its eq. 9 (inside the activation).
  * 004 eq. 17 has no epsilon, gain or bias; ``layer_norm`` adds all three (eps=0 is eq. 17).
  * Sinusoid positions count from 0 (Vaswani), not from 1 as 003 does.
  * 000's two-layer collapse uses alpha*_ik = sum_j alpha2_ij alpha1_jk (a matrix product).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

__all__ = [
    "AttentionOutput",
    "CollapsedAttention",
    "softmax",
    "hardmax",
    "basic_self_attention",
    "attention",
    "soft_cap",
    "multi_head_attention",
    "split_heads_weights",
    "causal_mask",
    "padding_mask",
    "layer_norm",
    "rms_norm",
    "feed_forward",
    "gated_feed_forward",
    "alibi_slopes",
    "alibi_bias",
    "sliding_window_mask",
    "grouped_query_attention",
    "sinusoidal_encoding",
    "rotary",
    "encoder_block",
    "decoder_block",
    "rnn_cell",
    "lstm_cell",
    "additive_score",
    "dot_score",
    "general_score",
    "additive_attention_step",
    "two_layer_attention_collapse",
]


class AttentionOutput(NamedTuple):
    """Attended values and the attention weights (each allowed row sums to 1)."""

    out: np.ndarray  # (N, d_v), or (N, d_out) for multi-head
    weights: np.ndarray  # (N, M), or (H, N, M) for multi-head


class CollapsedAttention(NamedTuple):
    """000's two stacked attention layers without a nonlinearity, as one layer."""

    weights: np.ndarray  # alpha* (n, n), alpha*_ik = sum_j alpha2_ij alpha1_jk
    V: np.ndarray  # V* (d, d_out) = V1 @ V2 in row form (000's V2 V1 in column form)


# --------------------------------------------------------------------------- scalar helpers


def _f64(a, name: str = "array") -> np.ndarray:
    arr = np.asarray(a, dtype=np.float64)
    if arr.dtype != np.float64:  # pragma: no cover - asarray either converts or raises
        raise TypeError(f"{name} must be convertible to float64")
    return arr


def _dot(u: np.ndarray, v: np.ndarray) -> float:
    """sum_l u_l v_l, accumulated exactly with math.fsum (the products are rounded once)."""
    if u.shape != v.shape or u.ndim != 1:
        raise ValueError(f"dot product needs two equal-length vectors, got {u.shape} and {v.shape}")
    return math.fsum(float(u[l]) * float(v[l]) for l in range(u.shape[0]))


def _linear(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Row-vector affine map y_j = sum_k x_k W_kj + b_j, for x of shape (..., d_in)."""
    W = _f64(W, "W")
    if W.ndim != 2 or x.shape[-1] != W.shape[0]:
        raise ValueError(
            f"x (..., {x.shape[-1]}) @ W needs W of shape ({x.shape[-1]}, d_out), got {W.shape}"
        )
    d_out = W.shape[1]
    if b is not None:
        b = _f64(b, "b")
        if b.shape != (d_out,):
            raise ValueError(f"bias must have shape ({d_out},), got {b.shape}")
    y = np.zeros(x.shape[:-1] + (d_out,))
    for idx in np.ndindex(*x.shape[:-1]):
        for j in range(d_out):
            y[idx + (j,)] = _dot(x[idx], W[:, j]) + (0.0 if b is None else b[j])
    return y


def _elementwise(fn: Callable[[float], float], a: np.ndarray) -> np.ndarray:
    out = np.empty_like(a)
    for idx in np.ndindex(*a.shape):
        out[idx] = fn(float(a[idx]))
    return out


def _relu(z: float) -> float:
    return z if z > 0.0 else 0.0


def _gelu(z: float) -> float:
    """Exact GELU, z Phi(z) = z/2 (1 + erf(z / sqrt 2)) (torch approximate='none')."""
    return 0.5 * z * (1.0 + math.erf(z / math.sqrt(2.0)))


def _gelu_tanh(z: float) -> float:
    """tanh approximation of GELU (GPT-2; torch approximate='tanh')."""
    return 0.5 * z * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))


def _sigmoid(z: float) -> float:
    if z >= 0.0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)  # avoids overflow of exp(-z) for very negative z
    return e / (1.0 + e)


def _silu(z: float) -> float:
    """SiLU / Swish: z sigmoid(z) (Elfwing et al. 2018), the gate of SwiGLU."""
    return z * _sigmoid(z)


_ACTIVATIONS: dict[str, Callable[[float], float]] = {
    "relu": _relu,
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "tanh": math.tanh,
    "sigmoid": _sigmoid,
    "silu": _silu,
}


def _activation(name: str, allowed: Sequence[str]) -> Callable[[float], float]:
    if name not in allowed:
        raise ValueError(f"activation must be one of {tuple(allowed)}, got {name!r}")
    return _ACTIVATIONS[name]


def _scale_factor(scale: bool | float, d_q: int) -> float:
    if scale is True:
        return 1.0 / math.sqrt(d_q)
    if scale is False:
        return 1.0
    return float(scale)


# --------------------------------------------------------------------------- row activations


def softmax(a) -> np.ndarray:
    """Softmax over the last axis (000, "Notation and basics").

    softmax(A)_{i,j} = exp(A_ij) / sum_{j'} exp(A_ij'), computed as exp(A_ij - m_i) / sum_j'
    exp(A_ij' - m_i) with m_i = max_j A_ij (mathematically identical, cannot overflow).
    Entries equal to -inf get probability 0; a row that is entirely -inf (a fully masked row)
    returns all zeros instead of NaN.
    a: (..., d) -> (..., d).
    """
    a = _f64(a, "a")
    out = np.zeros_like(a)
    for row in np.ndindex(*a.shape[:-1]):
        d = a.shape[-1]
        m = max(float(a[row + (j,)]) for j in range(d)) if d else -math.inf
        if m == -math.inf:
            continue  # no allowed entry: zero row
        e = [math.exp(float(a[row + (j,)]) - m) for j in range(d)]
        z = math.fsum(e)
        for j in range(d):
            out[row + (j,)] = e[j] / z
    return out


def hardmax(a) -> np.ndarray:
    """Hard attention activation of 004 (after eq. 12): one-hot at j* = argmax_j A_ij per row.

    Ties are broken deterministically by the lowest index (the first maximal entry). A row that is
    entirely -inf (fully masked) returns all zeros.
    a: (..., d) -> (..., d).
    """
    a = _f64(a, "a")
    out = np.zeros_like(a)
    for row in np.ndindex(*a.shape[:-1]):
        best_j, best = -1, -math.inf
        for j in range(a.shape[-1]):
            if float(a[row + (j,)]) > best:  # strict: a later equal entry never wins
                best_j, best = j, float(a[row + (j,)])
        if best_j >= 0:
            out[row + (best_j,)] = 1.0
    return out


# --------------------------------------------------------------------------- attention


def basic_self_attention(X) -> np.ndarray:
    """Parameter-free self-attention of 001: Y = softmax(X X^T) X.

    w'_ij = x_i^T x_j = sum_l x_il x_jl,   w_ij = exp(w'_ij) / sum_j' exp(w'_ij'),
    y_i = sum_j w_ij x_j.
    X: (t, k) -> Y: (t, k).
    """
    X = _f64(X, "X")
    if X.ndim != 2:
        raise ValueError(f"X must have shape (t, k), got {X.shape}")
    t, k = X.shape
    W_raw = np.zeros((t, t))
    for i in range(t):
        for j in range(t):
            W_raw[i, j] = math.fsum(float(X[i, l]) * float(X[j, l]) for l in range(k))
    W = softmax(W_raw)  # row-wise
    Y = np.zeros((t, k))
    for i in range(t):
        for j in range(t):
            Y[i] += W[i, j] * X[j]
    return Y


def attention(
    Q,
    K,
    V,
    mask=None,
    scale: bool | float = True,
    activation: str = "softmax",
    bias=None,
    softcap: float | None = None,
):
    """Single-head (scaled) dot-product attention, 004 eq. 9-12 (000, 002, 003 likewise).

    Attention(Q, K, V; a) = a(Q K^T / sqrt(d_q)) V   (eq. 9), i.e.
        s_ij = <q_i, k_j> / sqrt(d_q) = (1/sqrt(d_q)) sum_l q_il k_jl,
        s_ij <- c tanh(s_ij / c)     (only with ``softcap`` c: Gemma 2's logit soft-capping),
        A_i. = a(s_i1, ..., s_iM)    (a = softmax, or hardmax for hard attention),
        out_i = sum_j A_ij v_j.
    The scale sits inside the activation (004's prose after eq. 12 misplaces it outside).
    Masked pairs (mask_ij False) get s_ij = -inf, hence A_ij = 0, and leave the normaliser; a row
    with no allowed key has zero weights and a zero output.

    Q: (N, d_q) (eq. 10), K: (M, d_q) (eq. 11), V: (M, d_v) (eq. 12),
    mask: bool, broadcastable to (N, M), True = may attend.
    bias: (N, M) added to the scaled scores before the activation (ALiBi: ``alibi_bias``).
    softcap: c > 0 caps each logit (bias included) to c tanh(s / c) before the mask; None: no cap.
    Returns AttentionOutput(out (N, d_v), weights (N, M)).
    """
    Q, K, V = _f64(Q, "Q"), _f64(K, "K"), _f64(V, "V")
    if Q.ndim != 2 or K.ndim != 2 or V.ndim != 2:
        raise ValueError(f"Q, K, V must be 2-D, got {Q.shape}, {K.shape}, {V.shape}")
    N, d_q = Q.shape
    M = K.shape[0]
    if K.shape[1] != d_q:
        raise ValueError(f"queries and keys need the same width d_q, got {d_q} and {K.shape[1]}")
    if V.shape[0] != M:
        raise ValueError(f"K has {M} rows but V has {V.shape[0]}: one value per key")
    row_activation = {"softmax": softmax, "hardmax": hardmax}.get(activation)
    if row_activation is None:
        raise ValueError(f"activation must be 'softmax' or 'hardmax', got {activation!r}")
    allowed = _mask(mask, (N, M))
    factor = _scale_factor(scale, d_q)
    offset = np.zeros((N, M)) if bias is None else np.broadcast_to(_f64(bias, "bias"), (N, M))

    scores = np.zeros((N, M))
    for i in range(N):
        for j in range(M):
            s_ij = _dot(Q[i], K[j]) * factor + offset[i, j]
            if softcap is not None:
                s_ij = soft_cap(s_ij, softcap)
            scores[i, j] = s_ij if allowed[i, j] else -math.inf
    A = row_activation(scores)  # (N, M); all -inf rows -> zeros

    out = np.zeros((N, V.shape[1]))
    for i in range(N):
        for j in range(M):
            out[i] += A[i, j] * V[j]
    return AttentionOutput(out, A)


def soft_cap(s: float, c: float) -> float:
    """Logit soft-capping (Gemma 2, Team Gemma 2024 §2.2): c tanh(s / c), in (-c, c)."""
    if not c > 0:
        raise ValueError(f"the soft-cap c must be > 0, got {c}")
    return float(c) * math.tanh(float(s) / float(c))


def _mask(mask, shape: tuple[int, ...]) -> np.ndarray:
    if mask is None:
        return np.ones(shape, dtype=bool)
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        raise TypeError(f"mask must be bool (True = may attend), got dtype {m.dtype}")
    try:
        return np.broadcast_to(m, shape)
    except ValueError:
        raise ValueError(f"mask of shape {m.shape} does not broadcast to {shape}") from None


def split_heads_weights(W, n_heads: int) -> list[np.ndarray]:
    """Split a fused projection into per-head column blocks: W = [W^(1) | ... | W^(H)].

    Head l owns output columns l*d_head ... (l+1)*d_head - 1, the layout of a fused (d_model,
    H*d_head) matrix that is reshaped to (..., H, d_head) (torch's ``view(B, T, H, Dh)``).
    W: (d_model, H*d_head) -> H arrays (d_model, d_head). A fused bias (H*d_head,) splits into H
    arrays (d_head,) the same way.
    """
    W = _f64(W, "W")
    if W.ndim not in (1, 2):
        raise ValueError(f"W must be a (d_model, H*d_head) matrix or a bias vector, got {W.shape}")
    width = W.shape[-1]
    if n_heads < 1 or width % n_heads:
        raise ValueError(f"width {width} is not divisible by n_heads={n_heads}")
    d_head = width // n_heads
    return [W[..., l * d_head : (l + 1) * d_head].copy() for l in range(n_heads)]


def multi_head_attention(
    x,
    memory,
    Wq: Sequence,
    Wk: Sequence,
    Wv: Sequence,
    Wo=None,
    bq: Sequence | None = None,
    bk: Sequence | None = None,
    bv: Sequence | None = None,
    bo=None,
    mask=None,
    scale: bool | float = True,
) -> AttentionOutput:
    """Multi-head attention: 000 "Multi-head Self-Attention", 004 eq. 13, 002, 003.

    For each head l (000's K^(l), Q^(l), V^(l), here as row-vector matrices):
        q^(l)_i = x_i Wq[l] + bq[l],  k^(l)_j = m_j Wk[l] + bk[l],  v^(l)_j = m_j Wv[l] + bv[l],
        h^(l) = Attention(q^(l), k^(l), v^(l))   (scaled by sqrt(d_head), not sqrt(d_model)),
    then out_i = [h^(1)_i; ...; h^(H)_i] Wo + bo. With ``Wo=None`` the concatenation itself is
    returned (002's variant without an output projection; ``bo`` must then be None).
    ``memory=None`` means self-attention (m = x); otherwise cross-attention (000 "Cross-Attention"):
    queries from x, keys and values from memory.

    x: (N, d_model); memory: (M, d_mem) or None; Wq[l], Wk[l]: (d_model, d_head) and
    (d_mem, d_head); Wv[l]: (d_mem, d_v); Wo: (H*d_v, d_out); bq/bk/bv: lists of per-head vectors
    (use ``split_heads_weights`` on a fused bias too); bo: (d_out,);
    mask: bool broadcastable to (N, M), or (H, N, M) for a per-head mask; True = may attend.
    Returns AttentionOutput(out (N, d_out), weights (H, N, M)).
    """
    x = _f64(x, "x")
    m = x if memory is None else _f64(memory, "memory")
    if x.ndim != 2 or m.ndim != 2:
        raise ValueError(f"x and memory must be 2-D (N, d), got {x.shape} and {m.shape}")
    H = len(Wq)
    if H == 0 or len(Wk) != H or len(Wv) != H:
        raise ValueError(
            f"Wq, Wk, Wv must be equal-length non-empty lists, got {H}, {len(Wk)}, {len(Wv)}"
        )
    for name, b in (("bq", bq), ("bk", bk), ("bv", bv)):
        if b is not None and len(b) != H:
            raise ValueError(f"{name} must be a list of {H} per-head vectors")
    N, M = x.shape[0], m.shape[0]
    if mask is not None and np.asarray(mask).ndim == 3:
        masks = [_mask(np.asarray(mask)[l], (N, M)) for l in range(H)]
    else:
        masks = [_mask(mask, (N, M))] * H

    heads, weights = [], np.zeros((H, N, M))
    for l in range(H):
        q = _linear(x, Wq[l], None if bq is None else bq[l])  # (N, d_head)
        k = _linear(m, Wk[l], None if bk is None else bk[l])  # (M, d_head)
        v = _linear(m, Wv[l], None if bv is None else bv[l])  # (M, d_v)
        h, weights[l] = attention(q, k, v, mask=masks[l], scale=scale)
        heads.append(h)  # (N, d_v)

    concat = np.zeros((N, sum(h.shape[1] for h in heads)))  # (N, H*d_v)
    for i in range(N):
        concat[i] = np.concatenate([h[i] for h in heads])  # [h^(1)_i; ...; h^(H)_i]
    if Wo is None:
        if bo is not None:
            raise ValueError("bo given without Wo")
        return AttentionOutput(concat, weights)
    return AttentionOutput(_linear(concat, Wo, bo), weights)


# --------------------------------------------------------------------------- masks


def causal_mask(n: int, m: int | None = None) -> np.ndarray:
    """Future mask of 000 ("Future masking"): query i may attend to key j iff j <= i.

    With m > n keys (the n queries are the last n of m positions, as when decoding with a cache)
    the mask is aligned bottom-right: query i sits at position m - n + i and sees j <= m - n + i.
    Returns (n, m) bool, True = may attend.
    """
    m = n if m is None else m
    if m < n:
        raise ValueError(f"a causal mask needs at least as many keys as queries, got {n} and {m}")
    out = np.zeros((n, m), dtype=bool)
    for i in range(n):
        for j in range(m):
            out[i, j] = j <= (m - n) + i
    return out


def sliding_window_mask(n: int, m: int | None = None, window: int = 1) -> np.ndarray:
    """Local causal attention (Beltagy et al. 2020; Mistral): query i sees key j iff
    i - window < j <= i, with the n queries the last n of m positions (as ``causal_mask``).
    Returns (n, m) bool, True = may attend."""
    m = n if m is None else m
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out = np.zeros((n, m), dtype=bool)
    for i in range(n):
        p = (m - n) + i  # absolute position of query i
        for j in range(m):
            out[i, j] = p - window < j <= p
    return out


def padding_mask(lengths_or_bool, n: int) -> np.ndarray:
    """Key padding mask: True = real token (may be attended), False = padding.

    ``lengths_or_bool`` is either a length or a sequence of lengths (B,) -- position j of sequence
    b is real iff j < lengths[b] -- or a bool array (..., n) already in the True = real convention,
    which is validated and returned as a copy. Returns (n,) for a scalar length, else (B, n).
    For sequence b use ``padding_mask(...)[b]`` as the ``mask`` of ``attention``: shape (n,)
    broadcasts over queries, and ``causal_mask(n) & padding_mask(...)[b]`` combines both.
    """
    arr = np.asarray(lengths_or_bool)
    if arr.dtype == np.bool_:
        if arr.ndim == 0 or arr.shape[-1] != n:
            raise ValueError(f"bool padding mask must have last dimension {n}, got {arr.shape}")
        return arr.copy()
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"lengths must be integers (or a bool mask), got dtype {arr.dtype}")
    if arr.ndim > 1:
        raise ValueError(f"lengths must be a scalar or 1-D, got shape {arr.shape}")
    lengths = arr.reshape(-1)
    if np.any(lengths < 0) or np.any(lengths > n):
        raise ValueError(f"lengths must lie in [0, {n}], got {lengths.tolist()}")
    out = np.zeros((lengths.shape[0], n), dtype=bool)
    for b in range(lengths.shape[0]):
        for j in range(n):
            out[b, j] = j < lengths[b]
    return out[0] if arr.ndim == 0 else out


# --------------------------------------------------------------------------- norms, FFN


def layer_norm(a, gain=None, bias=None, eps: float = 0.0) -> np.ndarray:
    """Layer normalisation, 004 eq. 17 (Ba et al., 2016), over the last axis.

    mu = (1/H) sum_h a_h,  sigma = sqrt((1/H) sum_h (a_h - mu)^2 + eps),
    out_h = gain_h (a_h - mu) / sigma + bias_h.
    The variance is the biased one (1/H), as in eq. 17 and torch.nn.LayerNorm. eq. 17 itself is
    eps = 0, gain = 1, bias = 0; torch adds eps (default 1e-5) inside the square root.
    a: (..., H); gain, bias: (H,). Raises ValueError on a constant row when eps == 0.
    """
    a = _f64(a, "a")
    H = a.shape[-1]
    g = np.ones(H) if gain is None else _f64(gain, "gain")
    b = np.zeros(H) if bias is None else _f64(bias, "bias")
    if g.shape != (H,) or b.shape != (H,):
        raise ValueError(f"gain and bias must have shape ({H},), got {g.shape} and {b.shape}")
    out = np.zeros_like(a)
    for row in np.ndindex(*a.shape[:-1]):
        mu = math.fsum(float(a[row + (h,)]) for h in range(H)) / H
        var = math.fsum((float(a[row + (h,)]) - mu) ** 2 for h in range(H)) / H
        sigma = math.sqrt(var + eps)
        if sigma == 0.0:
            raise ValueError("layer_norm of a constant row is undefined with eps=0")
        for h in range(H):
            out[row + (h,)] = g[h] * (float(a[row + (h,)]) - mu) / sigma + b[h]
    return out


def rms_norm(a, gain=None, eps: float = 0.0) -> np.ndarray:
    """RMS normalisation (Zhang & Sennrich, 2019): LayerNorm without centring or bias.

    rms = sqrt((1/H) sum_h a_h^2 + eps),  out_h = gain_h a_h / rms.
    a: (..., H); gain: (H,). torch.nn.RMSNorm uses the same formula.
    """
    a = _f64(a, "a")
    H = a.shape[-1]
    g = np.ones(H) if gain is None else _f64(gain, "gain")
    if g.shape != (H,):
        raise ValueError(f"gain must have shape ({H},), got {g.shape}")
    out = np.zeros_like(a)
    for row in np.ndindex(*a.shape[:-1]):
        rms = math.sqrt(math.fsum(float(a[row + (h,)]) ** 2 for h in range(H)) / H + eps)
        if rms == 0.0:
            raise ValueError("rms_norm of a zero row is undefined with eps=0")
        for h in range(H):
            out[row + (h,)] = g[h] * float(a[row + (h,)]) / rms
    return out


def feed_forward(h, W1, b1, W2, b2, activation: str = "relu") -> np.ndarray:
    """Position-wise feed-forward network, 000 "Elementwise nonlinearity" (004 sec. 1.3).

    000 (column vectors): h_FF = W2 ReLU(W1 h + b1) + b2. Row-vector form used here:
        h_FF = act(h W1 + b1) W2 + b2,
    applied to every row independently. act: "relu" (000), "gelu" (exact, x Phi(x) with erf),
    "gelu_tanh" (GPT-2's tanh approximation).
    h: (..., d_model); W1: (d_model, d_ff); b1: (d_ff,) or None; W2: (d_ff, d_model'); b2 or None.
    """
    act = _activation(activation, ("relu", "gelu", "gelu_tanh"))
    h = _f64(h, "h")
    hidden = _elementwise(act, _linear(h, W1, b1))  # (..., d_ff)
    return _linear(hidden, W2, b2)  # (..., d_model')


def gated_feed_forward(h, Wg, W1, W2, activation: str = "silu", bg=None, b1=None, b2=None):
    """Gated feed-forward network (Shazeer 2020, "GLU Variants Improve Transformer", eq. 5-6).

    Row-vector form: h_FF = (act(h Wg + bg) * (h W1 + b1)) W2 + b2, ``*`` elementwise.
    act "silu" (z sigmoid(z)) gives SwiGLU, "gelu" GeGLU.
    h: (..., d_model); Wg, W1: (d_model, d_ff); W2: (d_ff, d_model').
    """
    act = _activation(activation, ("silu", "gelu", "gelu_tanh"))
    h = _f64(h, "h")
    gate = _elementwise(act, _linear(h, Wg, bg))  # (..., d_ff)
    up = _linear(h, W1, b1)  # (..., d_ff)
    hidden = np.zeros_like(up)
    for idx in np.ndindex(*up.shape):
        hidden[idx] = gate[idx] * up[idx]
    return _linear(hidden, W2, b2)


# --------------------------------------------------------------------------- ALiBi, GQA


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi head slopes (Press et al. 2022, §3): m_h = 2^(-8h/H), h = 1..H, for H a power of two;
    otherwise the H' = 2^floor(log2 H) slopes followed by the first H - H' odd-numbered slopes of
    2H' heads (the paper's code). Returns (H,)."""

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    lower = 1
    while lower * 2 <= n_heads:
        lower *= 2
    slopes = geometric(lower)
    extra = geometric(2 * lower)
    h = 0
    while len(slopes) < n_heads:
        slopes.append(extra[h])  # odd-numbered slopes: indices 0, 2, 4, ... of the 2H' sequence
        h += 2
    return np.array(slopes)


def alibi_bias(slope: float, q_positions, k_positions) -> np.ndarray:
    """ALiBi bias of one head: b_ij = -m |p_i - p_j| (Press et al.; for causal j <= i this is
    -m (i - j)). q_positions (N,), k_positions (M,) -> (N, M)."""
    qp, kp = np.asarray(q_positions), np.asarray(k_positions)
    out = np.zeros((qp.shape[0], kp.shape[0]))
    for i in range(qp.shape[0]):
        for j in range(kp.shape[0]):
            out[i, j] = -float(slope) * abs(float(qp[i]) - float(kp[j]))
    return out


def grouped_query_attention(
    x, Wq: Sequence, Wk: Sequence, Wv: Sequence, Wo=None, mask=None, biases=None
) -> AttentionOutput:
    """Grouped-query self-attention (Ainslie et al. 2023; MQA, Shazeer 2019, when H_kv = 1).

    H query heads, H_kv = len(Wk) key/value heads; query head l uses key/value head
    g = l // (H / H_kv):  h^(l) = Attention(x Wq[l], x Wk[g], x Wv[g]) (+ biases[l] on the
    logits, e.g. ALiBi), out = [h^(1); ...; h^(H)] Wo. x: (N, d_model); mask (N, N) or None.
    Returns AttentionOutput(out, weights (H, N, N)).
    """
    x = _f64(x, "x")
    H, H_kv = len(Wq), len(Wk)
    if H_kv == 0 or H % H_kv or len(Wv) != H_kv:
        raise ValueError(f"{H} query heads need a divisor of key/value heads, got {H_kv}")
    group = H // H_kv
    N = x.shape[0]
    heads, weights = [], np.zeros((H, N, N))
    for l in range(H):
        g = l // group
        q, k, v = _linear(x, Wq[l]), _linear(x, Wk[g]), _linear(x, Wv[g])
        bias = None if biases is None else biases[l]
        h, weights[l] = attention(q, k, v, mask=mask, bias=bias)
        heads.append(h)
    concat = np.concatenate(heads, axis=1)  # (N, H*d_v)
    return AttentionOutput(concat if Wo is None else _linear(concat, Wo), weights)


# --------------------------------------------------------------------------- positions


def sinusoidal_encoding(n_positions: int, d: int, base: float = 10000.0) -> np.ndarray:
    """Sinusoid position encoding, 004 eq. 16 / 003 / Vaswani et al. (2017) sec. 3.5.

    PE(n, 2i) = sin(n / base^(2i/d)),  PE(n, 2i+1) = cos(n / base^(2i/d)),
    for positions n = 0 .. n_positions - 1 (Vaswani counts from 0; 003 counts from 1, so 003's
    t = 1 is row 1 here) and columns 0 .. d - 1. For odd d the last column 2i = d - 1 is a sin.
    Returns (n_positions, d).
    """
    if n_positions < 0 or d < 1:
        raise ValueError(f"need n_positions >= 0 and d >= 1, got {n_positions}, {d}")
    PE = np.zeros((n_positions, d))
    for n in range(n_positions):
        for col in range(d):
            i = col // 2  # frequency index: columns 2i and 2i+1 share 1 / base^(2i/d)
            angle = n / base ** (2 * i / d)
            PE[n, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return PE


def rotary(x, positions, base: float = 10000.0) -> np.ndarray:
    """Rotary position embedding (RoPE, Su et al. 2021) in the "rotate-half" layout.

    Layout: dimension i is paired with i + d/2 (GPT-NeoX / Hugging Face Llama ``rotate_half``),
    NOT with i+1 as in the RoFormer paper's interleaved layout; the two layouts differ by a fixed
    permutation of the feature axis. For pair i = 0 .. d/2 - 1 and a row at position p:
        theta_i = base^(-2i/d)          (the pair's frequency, as in attnlab.nn.positional)
        phi_i   = p theta_i             (its angle at position p)
        out_i       = x_i cos phi_i - x_{i+d/2} sin phi_i,
        out_{i+d/2} = x_{i+d/2} cos phi_i + x_i sin phi_i,
    i.e. each pair is rotated by +phi_i = p theta_i. Hence <rotary(q, m), rotary(k, n)> depends
    on m - n only.
    x: (..., N, d) with d even (rows along axis -2); positions: (N,). Returns the shape of x.
    """
    x = _f64(x, "x")
    if x.ndim < 2 or x.shape[-1] % 2:
        raise ValueError(f"x must be (..., N, d) with d even, got {x.shape}")
    N, d = x.shape[-2], x.shape[-1]
    pos = _f64(positions, "positions")
    if pos.shape != (N,):
        raise ValueError(f"positions must have shape ({N},), got {pos.shape}")
    half = d // 2
    out = np.zeros_like(x)
    for lead in np.ndindex(*x.shape[:-2]):
        for r in range(N):
            row = x[lead + (r,)]
            for i in range(half):
                theta = float(pos[r]) / base ** (2 * i / d)
                c, s = math.cos(theta), math.sin(theta)
                out[lead + (r, i)] = row[i] * c - row[i + half] * s
                out[lead + (r, i + half)] = row[i + half] * c + row[i] * s
    return out


# --------------------------------------------------------------------------- blocks


def _norm(params: dict, key: str, a: np.ndarray) -> np.ndarray:
    p = params.get(key, {})
    eps = params.get("eps", 0.0)
    kind = params.get("norm", "layer")
    if kind == "layer":
        return layer_norm(a, p.get("gain"), p.get("bias"), eps=eps)
    if kind == "rms":
        if p.get("bias") is not None:
            raise ValueError("rms norm has no bias")
        return rms_norm(a, p.get("gain"), eps=eps)
    raise ValueError(f"params['norm'] must be 'layer' or 'rms', got {kind!r}")


def _ffn(params: dict, a: np.ndarray) -> np.ndarray:
    p = params["ffn"]
    return feed_forward(a, p["W1"], p.get("b1"), p["W2"], p.get("b2"), p.get("activation", "relu"))


def _residual(x: np.ndarray, f: Callable[[np.ndarray], np.ndarray], norm, norm_first: bool):
    """000 "Add & Norm": pre-norm h + f(LN(h)), or post-norm LN(h + f(h))."""
    if norm_first:
        return x + f(norm(x))
    return norm(x + f(x))


def encoder_block(x, params: dict, mask=None, norm_first: bool = True) -> np.ndarray:
    """Transformer encoder block (000 "Transformer Encoder"; Vaswani et al. Fig. 1, left).

    Pre-norm (norm_first=True):  x <- x + MHA(LN1(x));   x <- x + FFN(LN2(x)).
    Post-norm (norm_first=False): x <- LN1(x + MHA(x));  x <- LN2(x + FFN(x))  (Vaswani, 004's
    Add&Norm). No dropout. The final LayerNorm of a pre-norm stack belongs to the model, not here.

    ``params`` (a plain dict; omitted optional entries default to None / identity):
        "self_attn":      {"Wq": [H x (D, Dh)], "Wk": [...], "Wv": [...], "Wo": (H*Dh, D),
                           optional "bq", "bk", "bv" (lists of (Dh,)), "bo" (D,)}
                          -- the keyword arguments of ``multi_head_attention``;
        "ffn":            {"W1": (D, F), "b1": (F,), "W2": (F, D), "b2": (D,),
                           optional "activation": "relu" | "gelu" | "gelu_tanh"};
        "self_attn_norm", "ffn_norm": {"gain": (D,), "bias": (D,)};
        "eps":  float, inside the norms' square root (default 0.0 = 004 eq. 17; torch uses 1e-5);
        "norm": "layer" (default) or "rms".
    x: (N, D); mask: bool broadcastable to (N, N), True = may attend. Returns (N, D).
    """
    x = _f64(x, "x")

    def self_attn(a):
        return multi_head_attention(a, None, **params["self_attn"], mask=mask).out

    x = _residual(x, self_attn, lambda a: _norm(params, "self_attn_norm", a), norm_first)
    return _residual(
        x, lambda a: _ffn(params, a), lambda a: _norm(params, "ffn_norm", a), norm_first
    )


def decoder_block(
    x, memory, params: dict, self_mask=None, cross_mask=None, norm_first: bool = True
) -> np.ndarray:
    """Transformer decoder block with cross-attention (000 "Transformer Encoder-Decoder").

    Pre-norm:  x <- x + SelfMHA(LN1(x)); x <- x + CrossMHA(LN2(x), memory); x <- x + FFN(LN3(x)).
    Post-norm: x <- LN1(x + SelfMHA(x)); x <- LN2(x + CrossMHA(x, memory)); x <- LN3(x + FFN(x)).
    The memory (encoder output) is used as given (not normalised here). For a decoder-only block
    (000 "Transformer Decoder", no cross-attention) use ``encoder_block`` with a causal mask.

    ``params``: as for ``encoder_block`` plus "cross_attn" (same keys as "self_attn"; Wk, Wv map
    from the memory width) and "cross_attn_norm". Norm keys: "self_attn_norm", "cross_attn_norm",
    "ffn_norm".
    x: (T, D); memory: (S, D_mem); self_mask: bool broadcastable to (T, T) -- pass
    ``causal_mask(T)`` for autoregressive decoding, None means no mask; cross_mask: bool
    broadcastable to (T, S), e.g. a source padding row. Returns (T, D).
    """
    x = _f64(x, "x")
    memory = _f64(memory, "memory")

    def self_attn(a):
        return multi_head_attention(a, None, **params["self_attn"], mask=self_mask).out

    def cross_attn(a):
        return multi_head_attention(a, memory, **params["cross_attn"], mask=cross_mask).out

    x = _residual(x, self_attn, lambda a: _norm(params, "self_attn_norm", a), norm_first)
    x = _residual(x, cross_attn, lambda a: _norm(params, "cross_attn_norm", a), norm_first)
    return _residual(
        x, lambda a: _ffn(params, a), lambda a: _norm(params, "ffn_norm", a), norm_first
    )


# --------------------------------------------------------------------------- recurrent


def rnn_cell(h_prev, x, W, U, b=None, activation: str = "tanh") -> np.ndarray:
    """Elman RNN step of 000 ("Problems with RNN"): h_t = sigma(W h_{t-1} + U x_t).

    Row-vector form: h_t = sigma(h_{t-1} W + x_t U + b). For ``torch.nn.RNNCell`` pass
    W = weight_hh.T, U = weight_ih.T, b = bias_ih + bias_hh.
    h_prev: (..., d_h); x: (..., d_x); W: (d_h, d_h); U: (d_x, d_h); b: (d_h,).
    sigma: "tanh" (default), "relu" or "sigmoid". Returns (..., d_h).
    """
    act = _activation(activation, ("tanh", "relu", "sigmoid"))
    h_prev, x = _f64(h_prev, "h_prev"), _f64(x, "x")
    pre = _linear(h_prev, W) + _linear(x, U, b)
    return _elementwise(act, pre)


def lstm_cell(x, h, c, W_ih, W_hh, b_ih=None, b_hh=None) -> tuple[np.ndarray, np.ndarray]:
    """One LSTM step (the LSTM of 004 eq. 2-3), with torch.nn.LSTM's layout and gate order.

    Weights are taken exactly as torch stores them, (4H, D) and (4H, H) in COLUMN-vector form
    (the one exception to this module's row-vector convention), so ``cell.weight_ih`` etc. can be
    passed directly. Rows [0:H], [H:2H], [2H:3H], [3H:4H] belong to the gates i, f, g, o:
        z = W_ih x + b_ih + W_hh h + b_hh,
        i = sigmoid(z_i), f = sigmoid(z_f), g = tanh(z_g), o = sigmoid(z_o),
        c' = f * c + i * g,   h' = o * tanh(c').
    x: (..., D); h, c: (..., H). Returns (h', c'), each (..., H).
    """
    x, h, c = _f64(x, "x"), _f64(h, "h"), _f64(c, "c")
    W_ih, W_hh = _f64(W_ih, "W_ih"), _f64(W_hh, "W_hh")
    Hd = h.shape[-1]
    if W_ih.shape != (4 * Hd, x.shape[-1]) or W_hh.shape != (4 * Hd, Hd):
        raise ValueError(
            f"expected W_ih {(4 * Hd, x.shape[-1])} and W_hh {(4 * Hd, Hd)}, "
            f"got {W_ih.shape} and {W_hh.shape}"
        )
    z = _linear(x, W_ih.T, b_ih) + _linear(h, W_hh.T, b_hh)  # (..., 4H)
    h_new, c_new = np.zeros_like(h), np.zeros_like(c)
    for idx in np.ndindex(*h.shape[:-1]):
        for u in range(Hd):
            i = _sigmoid(z[idx + (u,)])
            f = _sigmoid(z[idx + (Hd + u,)])
            g = math.tanh(z[idx + (2 * Hd + u,)])
            o = _sigmoid(z[idx + (3 * Hd + u,)])
            c_new[idx + (u,)] = f * c[idx + (u,)] + i * g
            h_new[idx + (u,)] = o * math.tanh(c_new[idx + (u,)])
    return h_new, c_new


def additive_score(h, f, W, U, v) -> float:
    """Bahdanau's alignment score (004 eq. 6): a(h, f) = v^T tanh(W h + U f).

    Row form: a(h, f) = sum_r v_r tanh((h W)_r + (f U)_r).
    h: (d_h,); f: (d_f,); W: (d_h, d_a); U: (d_f, d_a); v: (d_a,).
    """
    hidden = _elementwise(math.tanh, _linear(_f64(h), W) + _linear(_f64(f), U))  # (d_a,)
    return _dot(_f64(v, "v"), hidden)


def dot_score(h, f) -> float:
    """Luong et al. (2015) "dot" score: a(h, f) = h^T f (needs d_h == d_f)."""
    return _dot(_f64(h, "h"), _f64(f, "f"))


def general_score(h, f, W) -> float:
    """Luong et al. (2015) "general" score: a(h, f) = h^T W f.  h: (d_h,); W: (d_h, d_f)."""
    return _dot(_linear(_f64(h, "h"), W), _f64(f, "f"))


def additive_attention_step(
    h_dec_prev, F, W=None, U=None, v=None, mask=None, score: str = "additive"
) -> tuple[np.ndarray, np.ndarray]:
    """One decoder step of Bahdanau attention, 004 eq. 6-8.

    e_lt = a(h^d_{l-1}, f_t)                 (eq. 6; score "additive": v^T tanh(W h + U f),
                                               "dot": h^T f, "general": h^T W f),
    alpha_l = softmax(e_l1, ..., e_lT)       (eq. 7; masked t get weight 0),
    v_l = sum_t alpha_lt f_t                 (eq. 8, the context vector).
    h_dec_prev: (d_h,) previous decoder state; F: (T, d_f) encoder features f_t (eq. 5);
    W, U, v: see ``additive_score`` / ``general_score`` (unused ones may be None);
    mask: (T,) bool, True = real source position. Returns (context (d_f,), weights (T,)); a fully
    masked source gives zeros.
    """
    h, F = _f64(h_dec_prev, "h_dec_prev"), _f64(F, "F")
    if h.ndim != 1 or F.ndim != 2:
        raise ValueError(f"h_dec_prev must be (d_h,) and F (T, d_f), got {h.shape}, {F.shape}")
    T = F.shape[0]
    allowed = _mask(mask, (T,))
    scorers = {
        "additive": lambda f: additive_score(h, f, W, U, v),
        "dot": lambda f: dot_score(h, f),
        "general": lambda f: general_score(h, f, W),
    }
    if score not in scorers:
        raise ValueError(f"score must be one of {tuple(scorers)}, got {score!r}")
    e = np.array([scorers[score](F[t]) if allowed[t] else -math.inf for t in range(T)])
    alpha = softmax(e)  # (T,)
    context = np.zeros(F.shape[1])
    for t in range(T):
        context += alpha[t] * F[t]
    return context, alpha


# --------------------------------------------------------------------------- 000's collapse


def two_layer_attention_collapse(x, V1, V2, A1, A2) -> CollapsedAttention:
    """000 "Elementwise nonlinearity": two attention layers without a nonlinearity are one.

    Layer 1: u_j = sum_k alpha1_jk x_k V1; layer 2: o_i = sum_j alpha2_ij u_j V2. Then
        o_i = sum_k (sum_j alpha2_ij alpha1_jk) x_k V1 V2 = sum_k alpha*_ik x_k V*,
    with alpha*_ik = sum_j alpha2_ij alpha1_jk (alpha* = A2 A1; 000 writes alpha_jk sum_j alpha_ij,
    which leaves j free) and V* = V1 V2 (000's V^(2) V^(1) in column-vector form). alpha* is again
    row-stochastic, so o is "one attention layer" -- for these fixed weights; in a real stack A2
    is computed from layer 1's output, which is where the softmax's nonlinearity enters.
    x: (n, d) (only checked for shape); V1: (d, d1); V2: (d1, d2); A1, A2: (n, n).
    Returns CollapsedAttention(weights alpha* (n, n), V V* (d, d2)).
    """
    x, V1, V2 = _f64(x, "x"), _f64(V1, "V1"), _f64(V2, "V2")
    A1, A2 = _f64(A1, "A1"), _f64(A2, "A2")
    n = x.shape[0]
    if A1.shape != (n, n) or A2.shape != (n, n):
        raise ValueError(f"A1 and A2 must be ({n}, {n}), got {A1.shape} and {A2.shape}")
    if V1.shape[0] != x.shape[1] or V2.shape[0] != V1.shape[1]:
        raise ValueError(f"incompatible V1 {V1.shape}, V2 {V2.shape} for x {x.shape}")
    alpha_star = np.zeros((n, n))
    for i in range(n):
        for k in range(n):
            alpha_star[i, k] = math.fsum(float(A2[i, j]) * float(A1[j, k]) for j in range(n))
    V_star = _linear(V1, V2)  # rows of V1 mapped by V2: V1 @ V2
    return CollapsedAttention(alpha_star, V_star)
