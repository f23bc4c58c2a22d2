"""Multi-head attention: self-attention, cross-attention, and the literal per-head loop.

MultiHead(X, M) = Concat(head_1, ..., head_H) W^O,  head_h = Attention(X W_q^h, M W_k^h, M W_v^h)
(004 eq. 13; 000 "Multi-head Self-Attention" with W^O = O; 003 "Computation").

Shapes: B batch, T query length, S key length, D d_model (input width), Dm memory width, H heads,
Dk = d_q = d_k per head, Dv per head, Do output width (d_out).

* :class:`SelfAttention` computes Q, K, V with **one** matmul against the stacked matrix
  [W_q | W_k | W_v] (003's "stack all the weight matrices into one"), reshapes to heads and runs all
  heads as one batched attention (000: "no more expensive than single-head").
* :class:`CrossAttention` projects queries from x and keys/values from the memory
  (000 "Cross-Attention"); the memory projection can be computed once and reused per decode step.
* :class:`LoopMultiHeadAttention` is the literal per-head loop, used to show both forms agree.
* ``out_proj=False`` gives 002's concatenation-only variant (then Do = H * Dv).
* ``qkv_proj=False`` (self-attention only) gives 001's basic, parameter-free self-attention:
  no W_q, W_k, W_v, each x_i is its own query, key and value (q_i = k_i = v_i = x_i, split into
  heads as the projections' outputs would be).
* Today's variants of self-attention, each one argument of :class:`SelfAttention`:
  ``n_kv_heads`` (grouped-query / multi-query attention, ``attnlab.nn.grouped``: fewer key/value
  heads, each shared by H / H_kv query heads; the KV cache holds only those), ``pos_enc`` (a
  position scheme acting inside attention: rotary's rotation of q and k, ALiBi's linear distance
  biases on the logits; ``attnlab.nn.positional``) and ``window`` (sliding-window causal
  attention, ``attnlab.nn.masks.sliding_window_mask``).
* Every module computes eq. 9 by calling the one kernel,
  ``attnlab.nn.attention.scaled_dot_product_attention``, with its hook points; none re-writes it.

Hook points (``attnlab.nn.hooks``; read or replaced by ``attnlab.inspect``): Q, K, V (per head),
Q_rot, K_rot (after rotary positions), scores (Q K^T), scaled, mask (read-only), A, heads (A V),
concat, out. While one of scores/scaled/mask/A/heads is hooked the kernel writes eq. 9 out, so
those values exist; otherwise it calls PyTorch's fused kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.nn.attention import (
    AttentionOutput,
    RowActivation,
    check_softcap,
    points_active,
    row_activation,
    scaled_dot_product_attention,
)
from attnlab.nn.cache import KVCache
from attnlab.nn.hooks import HookPoint
from attnlab.nn.masks import combine_masks, sliding_window_mask
from attnlab.nn.norms import RMSNorm
from attnlab.nn.positional import Positions, default_positions


class MultiHeadBase(nn.Module):
    """What self- and cross-attention share: head sizes, W^O, QK-norm, the attention call.

    d_head (Dk) defaults to D // H and d_v (Dv) to d_head; d_out (Do) to D, or H * Dv without W^O
    (``out_proj=False``). ``activation`` is the row activation a (``attnlab.nn.attention``'s
    :class:`RowActivation`, or its config name "softmax" or "hardmax", the latter with
    ``straight_through`` gradients or not), ``scale`` the factor on Q K^T (True: 1/sqrt(Dk)),
    ``softcap`` c soft-caps the logits to c tanh(s / c) (Gemma 2; None: no cap),
    ``dropout`` the probability on the weights A while training, ``qk_norm`` RMS-normalises q and
    k per head (epsilon ``qk_norm_eps``). ``bias`` switches the biases of W_q,
    W_k, W_v and W^O, ``out_bias`` that of W^O alone (default: ``bias``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        d_head: int | None = None,
        d_v: int | None = None,
        d_out: int | None = None,
        bias: bool = True,
        out_proj: bool = True,
        dropout: float = 0.0,
        activation: str | RowActivation = "softmax",
        scale: bool | float = True,
        qk_norm: bool = False,
        straight_through: bool = False,
        out_bias: bool | None = None,
        qk_norm_eps: float = 1e-5,
        softcap: float | None = None,
    ):
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if d_head is None and d_model % n_heads:
            raise ValueError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}; "
                "choose n_heads dividing d_model or pass d_head explicitly"
            )
        self.d_model, self.n_heads = d_model, n_heads
        self.d_head = d_head if d_head is not None else d_model // n_heads
        self.d_v = d_v if d_v is not None else self.d_head
        self.d_out = d_out if d_out is not None else (d_model if out_proj else n_heads * self.d_v)
        if not out_proj and self.d_out != n_heads * self.d_v:
            raise ValueError(
                f"without an output projection the width is H*Dv={n_heads * self.d_v}, "
                f"not d_out={self.d_out}"
            )
        self.dropout, self.scale, self.bias = dropout, scale, bias
        self.softcap = check_softcap(softcap)  # c of cap(s) = c tanh(s / c), or None
        self.activation = row_activation(activation, straight_through)  # a of eq. 9
        out_bias = bias if out_bias is None else out_bias  # Qwen2: biased q, k, v, unbiased W^O
        self.out_proj = (
            nn.Linear(n_heads * self.d_v, self.d_out, bias=out_bias) if out_proj else None
        )
        self.q_norm = RMSNorm(self.d_head, qk_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.d_head, qk_norm_eps) if qk_norm else None
        self.hook_Q, self.hook_K, self.hook_V = HookPoint(), HookPoint(), HookPoint()
        # eq. 9's inner points (``attnlab.nn.attention.AttentionPoints``)
        self.hook_scores, self.hook_scaled, self.hook_mask = HookPoint(), HookPoint(), HookPoint()
        self.hook_A, self.hook_heads = HookPoint(), HookPoint()
        self.hook_concat, self.hook_out = HookPoint(), HookPoint()

    def split_heads(self, x: Tensor, d: int, heads: int | None = None) -> Tensor:
        """(B, L, H*d) -> (B, H, L, d); ``heads`` defaults to the H query heads."""
        b, l, _ = x.shape
        return x.view(b, l, heads or self.n_heads, d).transpose(1, 2)  # (B, H, L, d)

    def inner_points_active(self) -> bool:
        """True while a hook reads or replaces a value only the explicit form computes."""
        return points_active(self)

    # Eq. 9 itself: the one kernel of ``attnlab.nn.attention`` (the engine, ``attnlab.fast``,
    # puts its own here; it calls this one whenever it does not apply).
    attention = staticmethod(scaled_dot_product_attention)

    def attention_options(self) -> dict:
        """This module's arguments to eq. 9: the scale, the logit soft-cap, the row activation a,
        the dropout on A (while training), and its hook points."""
        p = self.dropout if self.training else 0.0
        return dict(
            scale=self.scale,
            softcap=self.softcap,
            activation=self.activation,
            dropout_p=p,
            points=self,
        )

    def output(self, heads: AttentionOutput) -> AttentionOutput:
        """Concat(head_1, ..., head_H) W^O: heads (B, H, T, Dv) -> (B, T, Do), weights."""
        b, h, t, dv = heads.out.shape
        concat = self.hook_concat(heads.out.transpose(1, 2).reshape(b, t, h * dv))  # (B, T, H*Dv)
        out = self.out_proj(concat) if self.out_proj is not None else concat  # (B, T, Do)
        return AttentionOutput(self.hook_out(out), heads.weights)


class SelfAttention(MultiHeadBase):
    """Multi-head self-attention: Q, K, V = X [W_q | W_k | W_v] in one matmul (003), then
    MultiHead(X) = Concat_h(a(Q_h K_h^T / sqrt(Dk) + bias_h) V_h) W^O   (004 eq. 9, 13).

    Keyword arguments as :class:`MultiHeadBase`, plus
      * ``pos_enc``: the model's position scheme (``attnlab.nn.positional``). One that acts
        inside attention is kept: a rotation side rotates queries and keys by their positions
        (rotary, Su et al. 2021), a logit-bias side adds its bias to the logits (ALiBi, Press et
        al. 2022). A scheme that acts on the embeddings only (learned, sinusoidal, concatenated,
        none) has nothing to do here and is not kept;
      * ``n_kv_heads`` (H_kv, default H): key/value heads, each shared by G = H / H_kv query heads
        (grouped-query attention, Ainslie et al. 2023; H_kv = 1 is multi-query attention,
        Shazeer 2019). W_k, W_v shrink to H_kv heads and so does the KV cache; query head h
        reads key/value head h // G (``attnlab.nn.grouped.repeat_kv``). hook_K and hook_V hold
        the H_kv heads, (B, H_kv, T, Dk|Dv);
      * ``window`` (W): sliding-window causal attention, query i sees keys i - W < j <= i
        (``attnlab.nn.masks.sliding_window_mask``); a KV cache built with the same window keeps
        only what the window needs;
      * ``qkv_proj`` (default True): False drops W_q, W_k, W_v, so q_i = k_i = v_i = x_i (001
        "Basic Self-Attention"; needs H * Dk = H * Dv = D and H_kv = H).
    A logit bias and the window measure i - j in token indices, which left padding shifts equally
    for queries and keys, so they need no positions.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        pos_enc: Positions | None = None,
        n_kv_heads: int | None = None,
        window: int | None = None,
        qkv_proj: bool = True,
        **kw,
    ):
        super().__init__(d_model, n_heads, **kw)
        self.n_kv_heads = n_kv_heads if n_kv_heads is not None else n_heads
        if not isinstance(self.n_kv_heads, int) or n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads!r}: each "
                "key/value head serves the same number of query heads"
            )
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"window={window!r} must be a positive int (keys per query) or None")
        if pos_enc is not None and not isinstance(pos_enc, Positions):
            raise TypeError(f"pos_enc must be a position scheme, got {type(pos_enc).__name__}")
        in_attention = pos_enc is not None and (pos_enc.rotates or pos_enc.biases)
        self.pos_enc = pos_enc if in_attention else None  # shared with the embeddings
        self.window = window
        self.hook_Q_rot, self.hook_K_rot = HookPoint(), HookPoint()
        width = n_heads * self.d_head + self.n_kv_heads * (self.d_head + self.d_v)
        sizes = (n_heads * self.d_head, self.n_kv_heads * self.d_head, self.n_kv_heads * self.d_v)
        if not qkv_proj and sizes != (d_model,) * 3:
            raise ValueError(
                "qkv_proj=False (q = k = v = x) needs H * Dk = H * Dv = d_model and n_kv_heads = "
                f"n_heads, got d_model={d_model}, n_heads={n_heads}, d_head={self.d_head}, "
                f"d_v={self.d_v}, n_kv_heads={self.n_kv_heads}; leave d_head, d_v and n_kv_heads "
                "unset"
            )
        # [W_q | W_k | W_v]; None: 001's basic self-attention, each x_i its own query, key, value
        self.qkv_proj = nn.Linear(d_model, width, bias=self.bias) if qkv_proj else None

    def qkv(self, x: Tensor) -> Tensor:
        """[Q | K | V] = X [W_q | W_k | W_v] (one matmul), or [X | X | X] without projections
        (``qkv_proj=False``: q_i = k_i = v_i = x_i, 001 "Basic Self-Attention"): (B, T, width)."""
        return self.qkv_proj(x) if self.qkv_proj is not None else x.repeat(1, 1, 3)

    @property
    def rotates(self) -> bool:
        """True when queries and keys are rotated by their positions (hook points Q_rot, K_rot)."""
        return self.pos_enc is not None and self.pos_enc.rotates

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        causal: bool = False,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """x: (B, T, D) -> out (B, T, Do), weights (B, H, T, S) or None.

        With a ``cache`` the new keys/values are written at [cache.length, cache.length + T) and
        the queries attend to the S keys the cache holds after the append (cache.length + T, or
        fewer with a window, which drops keys older than W - 1); ``mask`` must then cover S.
        ``positions`` (T,) or (B, T) are the absolute positions used by a rotation side.
        """
        check_input(x, self.d_model, "x", self.qkv_proj)
        g, scheme = self.n_kv_heads, self.pos_enc
        sizes = [self.n_heads * self.d_head, g * self.d_head, g * self.d_v]
        q, k, v = self.qkv(x).split(sizes, dim=-1)  # (B, T, H*Dk), (B, T, H_kv*Dk), (B, T, H_kv*Dv)
        q = self.hook_Q(self.split_heads(q, self.d_head))  # (B, H, T, Dk)
        k = self.hook_K(self.split_heads(k, self.d_head, g))  # (B, H_kv, T, Dk)
        v = self.hook_V(self.split_heads(v, self.d_v, g))  # (B, H_kv, T, Dv)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if scheme is not None and scheme.rotates:
            if positions is None:  # the T new tokens follow the cached ones
                offset = cache.length if cache is not None else 0
                positions = default_positions(x.size(1), offset, x.device)
            q = self.hook_Q_rot(scheme.rotate(q, positions))  # (B, H, T, Dk)
            k = self.hook_K_rot(scheme.rotate(k, positions))  # (B, H_kv, T, Dk)
        start = 0  # the absolute index of the first key: keys are [start, end), queries the last T
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H_kv, S, Dk), (B, H_kv, S, Dv): all keys held
            start = cache.start
        end = start + k.size(2)
        if self.window is not None:  # the window's mask is causal too
            local = sliding_window_mask(x.size(1), end - start, self.window, x.device)  # (T, S)
            mask = combine_masks(mask, local)
        bias = None
        if scheme is not None and scheme.biases:
            q_index = torch.arange(end - x.size(1), end, device=x.device)  # (T,)
            k_index = torch.arange(start, end, device=x.device)  # (S,)
            bias = scheme.logit_bias(q_index, k_index, q.dtype)  # (1, H, T, S)
        heads = self.attention(
            q,
            k,
            v,
            mask,
            causal=causal,
            need_weights=need_weights,
            bias=bias,
            **self.attention_options(),
        )  # (B, H, T, Dv), weights (B, H, T, S) or None
        return self.output(heads)


class CrossAttention(MultiHeadBase):
    """Multi-head cross-attention: queries from x (B, T, D), keys/values from memory (B, S, Dm):
    q_i = Q h^(y)_i, k_j = K h^(x)_j, v_j = V h^(x)_j (000 "Cross-Attention"), then eq. 9 and
    W^O as in self-attention. No positions are applied here: the memory already carries them.
    """

    def __init__(self, d_model: int, n_heads: int, *, d_memory: int | None = None, **kw):
        super().__init__(d_model, n_heads, **kw)
        self.d_memory = d_memory if d_memory is not None else d_model
        self.q_proj = nn.Linear(d_model, n_heads * self.d_head, bias=self.bias)
        self.kv_proj = nn.Linear(self.d_memory, n_heads * (self.d_head + self.d_v), bias=self.bias)

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the memory (B, S, Dm), computed once per source:
        k (B, H, S, Dk), v (B, H, S, Dv)."""
        check_input(memory, self.d_memory, "memory", self.kv_proj)
        hk, hv = self.n_heads * self.d_head, self.n_heads * self.d_v
        k, v = self.kv_proj(memory).split([hk, hv], dim=-1)  # (B, S, H*Dk), (B, S, H*Dv)
        k = self.hook_K(self.split_heads(k, self.d_head))  # (B, H, S, Dk)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return k, self.hook_V(self.split_heads(v, self.d_v))  # (B, H, S, Dv)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """x: (B, T, D), memory: (B, S, Dm) -> out (B, T, Do), weights (B, H, T, S) or None.

        Pass ``memory_kv`` from :meth:`project_memory` instead of ``memory`` to reuse keys/values.
        """
        check_input(x, self.d_model, "x", self.q_proj)
        if memory_kv is not None:
            k, v = memory_kv
        elif memory is not None:
            k, v = self.project_memory(memory)
        else:
            raise ValueError("cross-attention needs memory (B, S, D) or memory_kv")
        if k.size(0) != x.size(0):
            raise ValueError(f"memory batch {k.size(0)} != query batch {x.size(0)}")
        q = self.hook_Q(self.split_heads(self.q_proj(x), self.d_head))  # (B, H, T, Dk)
        if self.q_norm is not None:
            q = self.q_norm(q)
        heads = self.attention(q, k, v, mask, need_weights=need_weights, **self.attention_options())
        return self.output(heads)  # (B, T, Do)


class LoopMultiHeadAttention(nn.Module):
    """The per-head loop of 000: h_i = O [h_i^(1); ...; h_i^(k)], each head with its own Q, K, V.

    Slower than the fused form and numerically equal to it (see :meth:`from_fused`).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_head: int,
        d_v: int,
        d_out: int | None,
        bias: bool = True,
    ):
        super().__init__()
        self.q = nn.ModuleList(nn.Linear(d_model, d_head, bias=bias) for _ in range(n_heads))
        self.k = nn.ModuleList(nn.Linear(d_model, d_head, bias=bias) for _ in range(n_heads))
        self.v = nn.ModuleList(nn.Linear(d_model, d_v, bias=bias) for _ in range(n_heads))
        self.out_proj = nn.Linear(n_heads * d_v, d_out, bias=bias) if d_out is not None else None

    @classmethod
    def from_fused(cls, attn: SelfAttention) -> LoopMultiHeadAttention:
        """Copy a fused :class:`SelfAttention`'s weights into per-head matrices."""
        h, dk, dv = attn.n_heads, attn.d_head, attn.d_v
        g = attn.n_kv_heads  # query head i uses key/value head i // (h // g)
        if attn.pos_enc is not None or attn.window is not None:
            raise ValueError(
                "the loop form has no rotary, ALiBi or window; compare plain attention only"
            )
        if attn.qkv_proj is None:
            raise ValueError("the loop form copies W_q, W_k, W_v; this attention has none")
        bias = attn.qkv_proj.bias is not None
        d_out = attn.d_out if attn.out_proj is not None else None
        loop = cls(attn.d_model, h, dk, dv, d_out, bias)
        # (H*Dk + H_kv*(Dk+Dv), D): rows [q heads | k heads | v heads]
        w = attn.qkv_proj.weight.detach()
        b = attn.qkv_proj.bias.detach() if bias else None
        with torch.no_grad():
            for i in range(h):
                for lin, start, d in (
                    (loop.q[i], i * dk, dk),
                    (loop.k[i], h * dk + (i // (h // g)) * dk, dk),
                    (loop.v[i], (h + g) * dk + (i // (h // g)) * dv, dv),
                ):
                    assert isinstance(lin, nn.Linear)
                    lin.weight.copy_(w[start : start + d])
                    if b is not None:
                        lin.bias.copy_(b[start : start + d])
            if loop.out_proj is not None and attn.out_proj is not None:  # both iff d_out is set
                loop.out_proj.load_state_dict(attn.out_proj.state_dict())
        return loop

    def forward(self, x: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """x: (B, T, D) -> (B, T, Do)."""
        heads = []
        for q, k, v in zip(self.q, self.k, self.v):
            out, _ = scaled_dot_product_attention(
                q(x)[:, None], k(x)[:, None], v(x)[:, None], mask, causal=causal
            )  # (B, 1, T, Dv)
            heads.append(out[:, 0])  # (B, T, Dv)
        h = torch.cat(heads, dim=-1)  # (B, T, H*Dv)
        return self.out_proj(h) if self.out_proj is not None else h


def check_input(x: Tensor, width: int, name: str, layer: nn.Linear | None) -> None:
    """x must be a floating (B, L, width) tensor of the layer's dtype (any, without a layer),
    L > 0."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.size(-1) != width:
        raise ValueError(f"{name} must have shape (B, L, {width}), got {tuple(x.shape)}")
    if x.size(-2) == 0:
        raise ValueError(f"{name} is an empty sequence (L=0)")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {x.dtype}")
    if (
        layer is not None
        and x.dtype != layer.weight.dtype
        and not torch.is_autocast_enabled(x.device.type)
    ):
        raise TypeError(
            f"{name} has dtype {x.dtype} but the attention weights are {layer.weight.dtype}; "
            f"convert the input or the module (e.g. module.to({x.dtype}))"
        )
