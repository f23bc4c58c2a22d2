"""Multi-head attention: self-attention with a fused QKV projection, cross-attention, a loop form.

MultiHead(X, M) = Concat(head_1, ..., head_H) W^O,  head_h = Attention(X W_q^h, M W_k^h, M W_v^h)
(004 eq. 13; 000 "Multi-head Self-Attention" with W^O = O; 003 "Computation").

Shapes: B batch, T query length, S key length, D d_model (input width), H heads,
Dk = d_q = d_k per head, Dv per head, Do output width (d_out).

* :class:`SelfAttention` computes Q, K, V with **one** matmul against the stacked matrix
  [W_q | W_k | W_v] (003's "stack all the weight matrices into one"), reshapes to heads and runs all
  heads as one batched attention (000: "no more expensive than single-head").
* :class:`CrossAttention` projects queries from x and keys/values from the memory separately
  (000 "Cross-Attention"); the memory projection can be computed once and reused per decode step.
* :class:`LoopMultiHeadAttention` is the literal per-head loop, used to show both forms agree.
* ``out_proj=False`` gives 002's concatenation-only variant (then Do = H * Dv).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.nn.attention import AttentionOutput, scaled_dot_product_attention
from attnlab.nn.cache import KVCache
from attnlab.nn.norms import RMSNorm
from attnlab.nn.packing import (
    Packing,
    group_mask,
    group_positions,
    grouped_heads,
    pack_group,
    packed_heads,
    unpack,
    unpack_group,
)
from attnlab.nn.positional import RotaryPositions, default_positions


class _HeadsMixin(nn.Module):
    """Shared head bookkeeping: split (B, L, H*Dh) <-> (B, H, L, Dh), the attention call, W^O."""

    def _init_heads(
        self,
        d_model,
        n_heads,
        d_head,
        d_v,
        d_out,
        bias,
        out_proj,
        dropout,
        activation,
        scale,
        qk_norm,
        rotary,
        straight_through,
    ):
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
        self.dropout, self.activation, self.scale = dropout, activation, scale
        self.straight_through = straight_through
        self.out_proj = nn.Linear(n_heads * self.d_v, self.d_out, bias=bias) if out_proj else None
        self.q_norm = RMSNorm(self.d_head) if qk_norm else None
        self.k_norm = RMSNorm(self.d_head) if qk_norm else None
        self.rotary: RotaryPositions | None = rotary

    def _split(self, x: Tensor, d: int) -> Tensor:
        b, l, _ = x.shape
        return x.view(b, l, self.n_heads, d).transpose(1, 2)  # (B, H, L, d)

    def _merge(self, x: Tensor) -> Tensor:
        b, h, l, d = x.shape
        return x.transpose(1, 2).reshape(b, l, h * d)  # (B, L, H*Dv)

    def _prepare_qk(self, q: Tensor, k: Tensor, positions: Tensor | None, offset: int = 0):
        """QK-norm, then rotary positions on q, k (B, H, T, Dk) of the same T tokens: the given
        ``positions``, or ``offset``, ``offset`` + 1, ... (after ``offset`` cached tokens)."""
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            if positions is None:
                positions = default_positions(q.size(2), offset, q.device)
            q = self.rotary.rotate(q, positions)
            k = self.rotary.rotate(k, positions)
        return q, k

    def _attend(self, q, k, v, mask, causal, need_weights) -> AttentionOutput:
        """Heads q (B, H, T, Dk), k (B, H, S, Dk), v (B, H, S, Dv) -> the concatenation
        [h^(1); ...; h^(H)] (B, T, H*Dv) and the weights (B, H, T, S) or None."""
        out, weights = self._attend_heads(q, k, v, mask, causal, need_weights)  # (B, H, T, Dv)
        return AttentionOutput(self._merge(out), weights)

    def _attend_heads(self, q, k, v, mask, causal, need_weights=False) -> AttentionOutput:
        """head_h = Attention(q_h, k_h, v_h) for every head at once: (B, H, T, Dv), weights."""
        return scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            causal=causal,
            scale=self.scale,
            activation=self.activation,
            straight_through=self.straight_through,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
        )

    def _grouped_output(self, per_group: list[Tensor], packing: Packing) -> AttentionOutput:
        """Each row group's heads (b, H, T_g, Dv) -> W^O on the packed real tokens, (N, Do)."""
        return self._output(AttentionOutput(packed_heads(per_group, packing), None))

    def _output(self, heads: AttentionOutput) -> AttentionOutput:
        """W^O applied to the concatenated heads (.., H*Dv) -> (.., Do)."""
        out = self.out_proj(heads.out) if self.out_proj is not None else heads.out
        return AttentionOutput(out, heads.weights)

    def _output_packed(self, per_group: list[AttentionOutput], packing: Packing) -> AttentionOutput:
        """Each group's heads (b, T_g, H*Dv) -> W^O on the packed real tokens only, (N, Do)."""
        heads = torch.cat([pack_group(o.out, g) for o, g in zip(per_group, packing.groups)])
        return self._output(AttentionOutput(heads, per_group[0].weights if packing.whole else None))


class SelfAttention(_HeadsMixin):
    """Multi-head self-attention with a fused QKV projection (one matmul for all heads)."""

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
        activation: str = "softmax",
        scale: bool | float = True,
        qk_norm: bool = False,
        rotary: RotaryPositions | None = None,
        straight_through: bool = False,
    ):
        super().__init__()
        self._init_heads(
            d_model,
            n_heads,
            d_head,
            d_v,
            d_out,
            bias,
            out_proj,
            dropout,
            activation,
            scale,
            qk_norm,
            rotary,
            straight_through,
        )
        self.qkv_proj = nn.Linear(d_model, n_heads * (2 * self.d_head + self.d_v), bias=bias)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        causal: bool = False,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        packing: Packing | None = None,
    ) -> AttentionOutput:
        """x: (B, T, D) -> out (B, T, Do), weights (B, H, T, S) or None.

        With a ``cache`` the new keys/values are written at [cache.length, cache.length + T) and
        the queries attend to all S = cache.length + T cached keys; ``mask`` must then cover S.
        ``positions`` (T,) or (B, T) are the absolute positions used by rotary embeddings.
        With ``packing`` x holds only the real tokens, (N, D), and so does the output (N, Do).
        """
        _check_input(x, self.d_model, "x", packed=packing is not None)
        _check_dtype(x, self.qkv_proj, "x")
        _check_weights_layout(need_weights, packing)
        if packing is not None and cache is not None:
            raise ValueError(
                "a KV cache cannot be used with a packed batch (decode steps are "
                "not packed; pass one or the other)"
            )
        qkv = self.qkv_proj(x)  # (B, T, 2 H*Dk + H*Dv), or (N, .) packed
        if packing is None:
            heads = self._self_attend(qkv, mask, causal, positions, cache, need_weights)
            return self._output(heads)
        if not packing.whole and self.d_v == self.d_head:
            return self._self_attend_groups(qkv, mask, causal, positions, packing)
        # Attention needs the sequence layout: one group of rows at a time (see nn.packing).
        return self._output_packed(
            [
                self._self_attend(
                    unpack_group(qkv, g),
                    group_mask(mask, g, g, packing.whole),
                    causal,
                    group_positions(positions, g, packing.whole),
                    None,
                    need_weights,
                )
                for g in packing.groups
            ],
            packing,
        )

    def _self_attend_groups(self, qkv, mask, causal, positions, packing) -> AttentionOutput:
        """Packed qkv (N, 3 H*Dh) -> attention on each row group (nn.packing) -> W^O, (N, Do)."""
        per_group = []
        for g, q, k, v in zip(packing.groups, *grouped_heads(qkv, packing, 3, self.n_heads)):
            q, k = self._prepare_qk(q, k, group_positions(positions, g, False))  # (b, H, T_g, Dh)
            mask_g = group_mask(mask, g, g, False)
            per_group.append(self._attend_heads(q, k, v, mask_g, causal).out)  # (b, H, T_g, Dh)
        return self._grouped_output(per_group, packing)

    def _self_attend(self, qkv, mask, causal, positions, cache, need_weights) -> AttentionOutput:
        """qkv (B, T, 2 H*Dk + H*Dv) -> concatenated heads (B, T, H*Dv), weights."""
        hk, hv = self.n_heads * self.d_head, self.n_heads * self.d_v
        q, k, v = qkv.split([hk, hk, hv], dim=-1)  # (B, T, H*Dk) x2, (B, T, H*Dv)
        q = self._split(q, self.d_head)  # (B, H, T, Dk)
        k = self._split(k, self.d_head)  # (B, H, T, Dk)
        v = self._split(v, self.d_v)  # (B, H, T, Dv)
        q, k = self._prepare_qk(q, k, positions, cache.length if cache is not None else 0)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, S, Dk), (B, H, S, Dv)
        return self._attend(q, k, v, mask, causal, need_weights)


class CrossAttention(_HeadsMixin):
    """Multi-head cross-attention: queries from x (B, T, D), keys/values from memory (B, S, Dm).

    q_i = Q h^(y)_i, k_j = K h^(x)_j, v_j = V h^(x)_j (000 "Cross-Attention"). No positions are
    applied here: the memory already carries them.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        d_memory: int | None = None,
        d_head: int | None = None,
        d_v: int | None = None,
        d_out: int | None = None,
        bias: bool = True,
        out_proj: bool = True,
        dropout: float = 0.0,
        activation: str = "softmax",
        scale: bool | float = True,
        qk_norm: bool = False,
        straight_through: bool = False,
    ):
        super().__init__()
        self._init_heads(
            d_model,
            n_heads,
            d_head,
            d_v,
            d_out,
            bias,
            out_proj,
            dropout,
            activation,
            scale,
            qk_norm,
            None,
            straight_through,
        )
        self.d_memory = d_memory if d_memory is not None else d_model
        self.q_proj = nn.Linear(d_model, n_heads * self.d_head, bias=bias)
        self.kv_proj = nn.Linear(self.d_memory, n_heads * (self.d_head + self.d_v), bias=bias)

    def project_memory(
        self, memory: Tensor, packing: Packing | None = None
    ) -> tuple[Tensor, Tensor]:
        """Keys and values of the memory, once per source: (B, H, S, Dk), (B, H, S, Dv).

        With ``packing`` the memory holds only the real source tokens, (N_src, Dm).
        """
        kv = self._project_kv(memory, packed=packing is not None)  # (B, S, .) or (N_src, .)
        if packing is not None:
            kv = unpack(kv, packing)  # (B, S, .)
        return self._memory_heads(kv)

    def _project_kv(self, memory: Tensor, packed: bool) -> Tensor:
        """memory (B, S, Dm), or (N_src, Dm) packed -> [M W_k | M W_v] (.., H*(Dk+Dv))."""
        _check_input(memory, self.d_memory, "memory", packed=packed)
        _check_dtype(memory, self.kv_proj, "memory")
        return self.kv_proj(memory)

    def _memory_heads(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """kv (B, S, H*(Dk+Dv)) -> k (B, H, S, Dk), v (B, H, S, Dv)."""
        k, v = kv.split([self.n_heads * self.d_head, self.n_heads * self.d_v], dim=-1)
        k = self._split(k, self.d_head)  # (B, H, S, Dk)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return k, self._split(v, self.d_v)  # (B, H, S, Dv)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        need_weights: bool = False,
        packing: Packing | None = None,
        memory_packing: Packing | None = None,
    ) -> AttentionOutput:
        """x: (B, T, D), memory: (B, S, Dm) -> out (B, T, Do), weights (B, H, T, S) or None.

        Pass ``memory_kv`` from :meth:`project_memory` instead of ``memory`` to reuse keys/values.
        ``packing`` / ``memory_packing``: x / memory hold only real tokens (see nn.packing); when
        the rows are grouped, both packings share the groups.
        """
        _check_input(x, self.d_model, "x", packed=packing is not None)
        _check_weights_layout(need_weights, packing)
        if memory_kv is None and memory is None:
            raise ValueError("cross-attention needs memory (B, S, D) or memory_kv")
        q = self.q_proj(x)  # (B, T, H*Dk) or (N, .)
        if packing is not None and not packing.whole:
            if memory_packing is None or len(memory_packing.groups) != len(packing.groups):
                raise ValueError("grouped queries need the memory packed in the same row groups")
            kv = self._project_kv(memory, packed=True)  # (N_src, H*(Dk+Dv))
            if self.d_v == self.d_head:
                return self._cross_attend_groups(q, kv, mask, packing, memory_packing)
            return self._output_packed(
                [
                    self._cross_attend(
                        unpack_group(q, g),
                        self._memory_heads(unpack_group(kv, mg)),
                        group_mask(mask, g, mg, False),
                        need_weights,
                    )
                    for g, mg in zip(packing.groups, memory_packing.groups)
                ],
                packing,
            )
        if memory_kv is None:
            memory_kv = self.project_memory(memory, memory_packing)
        if packing is None:
            return self._output(self._cross_attend(q, memory_kv, mask, need_weights))
        heads = self._cross_attend(unpack(q, packing), memory_kv, mask, need_weights)
        return self._output_packed([heads], packing)

    def _cross_attend_groups(self, q, kv, mask, packing, memory_packing) -> AttentionOutput:
        """Packed q (N, H*Dh) and memory kv (N_src, 2 H*Dh) -> attention on each row group
        (query group g with memory group g, nn.packing) -> W^O, (N, Do)."""
        (queries,) = grouped_heads(q, packing, 1, self.n_heads)  # each (b, H, T_g, Dh)
        keys, values = grouped_heads(kv, memory_packing, 2, self.n_heads)  # each (b, H, S_g, Dh)
        per_group = []
        for g, mg, q_g, k_g, v_g in zip(packing.groups, memory_packing.groups, queries, keys,
                                        values):  # fmt: skip
            if self.q_norm is not None:
                q_g, k_g = self.q_norm(q_g), self.k_norm(k_g)
            out = self._attend_heads(q_g, k_g, v_g, group_mask(mask, g, mg, False), False).out
            per_group.append(out)  # (b, H, T_g, Dh)
        return self._grouped_output(per_group, packing)

    def _cross_attend(self, q, memory_kv, mask, need_weights) -> AttentionOutput:
        """q (B, T, H*Dk), memory keys/values (B, H, S, .) -> concatenated heads (B, T, H*Dv)."""
        k, v = memory_kv
        if k.size(0) != q.size(0):
            raise ValueError(f"memory batch {k.size(0)} != query batch {q.size(0)}")
        q = self._split(q, self.d_head)  # (B, H, T, Dk)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return self._attend(q, k, v, mask, False, need_weights)


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
        bias = attn.qkv_proj.bias is not None
        d_out = attn.d_out if attn.out_proj is not None else None
        loop = cls(attn.d_model, h, dk, dv, d_out, bias)
        w = attn.qkv_proj.weight.detach()  # (H*(2Dk+Dv), D): rows [q heads | k heads | v heads]
        b = attn.qkv_proj.bias.detach() if bias else None
        with torch.no_grad():
            for i in range(h):
                for lin, start, d in (
                    (loop.q[i], i * dk, dk),
                    (loop.k[i], h * dk + i * dk, dk),
                    (loop.v[i], 2 * h * dk + i * dv, dv),
                ):
                    lin.weight.copy_(w[start : start + d])
                    if bias:
                        lin.bias.copy_(b[start : start + d])
            if d_out is not None:
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


def _check_weights_layout(need_weights: bool, packing: Packing | None) -> None:
    if need_weights and packing is not None and not packing.whole:
        raise ValueError(
            "attention weights (B, H, T, S) need the batch packed as one group "
            "(make_packing without row groups)"
        )


def _check_input(x: Tensor, width: int, name: str, packed: bool = False) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != (2 if packed else 3) or x.size(-1) != width:
        want = f"(N, {width}) packed" if packed else f"(B, L, {width})"
        raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")
    if x.size(-2) == 0:
        raise ValueError(f"{name} is an empty sequence (L=0)")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {x.dtype}")


def _check_dtype(x: Tensor, layer: nn.Linear, name: str) -> None:
    if x.dtype != layer.weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"{name} has dtype {x.dtype} but the attention weights are {layer.weight.dtype}; "
            f"convert the input or the module (e.g. module.to({x.dtype}))"
        )
