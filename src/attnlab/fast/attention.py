"""Fast multi-head attention: the plain modules of ``attnlab.nn.multihead`` on packed row groups.

:class:`FastSelfAttention` and :class:`FastCrossAttention` subclass the plain modules, own the same
parameters and hook points, and compute the same function. What they add is **row groups**
(``attnlab.fast.packing``): inside a fast model's packed forward (:func:`packed`), x holds only
the N real tokens, (N, D); the projections run on those, and attention runs on groups of rows of
similar length, each padded to its own longest row (through the plain ``attend``).

Whenever the plain form is needed -- attention weights asked for, hard attention, a hook point
active -- they run the plain form (fast models do not pack while a hook is active).

Shapes: B batch, T query length, S key length, N real tokens, D d_model, H heads, Dh per head;
per group b rows of length T_g (queries) and S_g (keys).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from attnlab.fast.packing import Packing, group_mask, group_positions, grouped_heads, packed_heads
from attnlab.fast.switches import PATHS
from attnlab.nn.attention import (
    AttentionOutput,
    Softmax,
    points_active,
    scale_factor,
    scaled_dot_product_attention,
)
from attnlab.nn.masks import check_mask
from attnlab.nn.multihead import CrossAttention, SelfAttention
from attnlab.nn.positional import default_positions


class Route(NamedTuple):
    """Where the real tokens of the current packed forward are: queries and memory."""

    packing: Packing
    memory_packing: Packing | None


_ROUTE: ContextVar[Route | None] = ContextVar("attnlab_fast_route", default=None)


@contextmanager
def packed(packing: Packing, memory_packing: Packing | None = None):
    """Within this block, fast attention modules read 2-D inputs as packed (N, D) tokens."""
    token = _ROUTE.set(Route(packing, memory_packing))
    try:
        yield
    finally:
        _ROUTE.reset(token)


def _route(x: Tensor) -> Route | None:
    """The packed route for a 2-D x; a 3-D x is a plain (B, L, D) batch."""
    if x.dim() != 2:
        return None
    route = _ROUTE.get()
    if route is None:
        raise ValueError(f"x must have shape (B, L, D), got {tuple(x.shape)}")
    return route


class _PackedOutput:
    """W^O on packed tokens, shared by both fast modules."""

    out_proj: nn.Linear | None  # the attention module's W^O (``MultiHeadBase``)

    def packed_output(self, per_group: list[Tensor], packing: Packing) -> AttentionOutput:
        """Each group's heads (b, H, T_g, Dh) -> W^O on the packed real tokens, (N, Do)."""
        concat = packed_heads(per_group, packing)  # (N, H*Dh)
        return AttentionOutput(self.out_proj(concat) if self.out_proj is not None else concat, None)


def one_query_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, factor: float, bias: Tensor | None
) -> Tensor:
    """Eq. 9 for one query per row (a decode step), written as reductions over the cache:

        s_j = <q, k_j> * factor + bias_j,   a = softmax_j(s),   out = sum_j a_j v_j.

    Under ``torch.compile`` these become a few fused loops in the generated code that read the
    cache in its own dtype (a bf16 cache is widened inside the loop, never copied to fp32),
    where the fused kernel is an opaque call that needs the keys in the query's dtype.
    q (B, H, 1, Dk); k (B, H_kv, S, Dk), v (B, H_kv, S, Dv), H = G H_kv -> (B, H, 1, Dv).
    """
    b, h, _, dk = q.shape
    g, s = h // k.size(1), k.size(2)
    qg = q.view(b, k.size(1), g, 1, dk)  # (B, H_kv, G, 1, Dk): query head h reads h // G
    scores = (qg * k[:, :, None].to(q.dtype)).sum(dim=-1).view(b, h, 1, s) * factor  # (B, H, 1, S)
    if bias is not None:
        scores = scores + bias  # (B, H, 1, S)
    weights = Softmax()(scores, mask).reshape(b, k.size(1), g, s, 1)  # (B, H_kv, G, S, 1)
    out = (weights * v[:, :, None].to(q.dtype)).sum(dim=-2)  # (B, H_kv, G, Dv)
    return out.view(b, h, 1, v.size(-1))  # (B, H, 1, Dv)


def fast_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    need_weights: bool = False,
    **eq9: Any,
) -> AttentionOutput:
    """Eq. 9 as ``attnlab.nn.attention.scaled_dot_product_attention`` (same arguments), except
    that a compiled one-token decode step with the plain softmax attends by reductions
    (:func:`one_query_attention`); everything else (soft-capped logits too) goes to the plain
    kernel."""
    activation, points = eq9.get("activation"), eq9.get("points")
    hooked = points is not None and points_active(points)
    plain = need_weights or not isinstance(activation, Softmax) or hooked
    plain = plain or eq9.get("softcap") is not None
    one_query = q.size(-2) == 1 and torch.compiler.is_compiling() and PATHS["one_query"]
    if plain or not one_query or eq9.get("dropout_p", 0.0) > 0:
        return scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights, **eq9)
    if mask is not None:
        mask = check_mask(mask, q.size(0), q.size(1), 1, k.size(2))  # (B|1, H|1, 1, S)
    factor = scale_factor(eq9.get("scale", True), q.size(-1))
    return AttentionOutput(one_query_attention(q, k, v, mask, factor, eq9.get("bias")), None)


class FastSelfAttention(_PackedOutput, SelfAttention):
    """:class:`~attnlab.nn.multihead.SelfAttention` that also runs on packed row groups, and
    whose compiled one-token decode step attends by reductions (:func:`fast_attention`)."""

    attention = staticmethod(fast_attention)

    def forward(
        self, x, mask=None, *, causal=False, positions=None, cache=None, need_weights=False
    ):
        route = _route(x)
        if route is None:
            return super().forward(
                x, mask, causal=causal, positions=positions, cache=cache, need_weights=need_weights
            )
        packing = route.packing
        if positions is None:
            positions = default_positions(packing.length, 0, x.device)  # (T,)
        qkv = self.qkv(x[None])[0]  # (N, D) as one batch row -> (N, 3 H*Dh)
        per_group = []
        for g, q, k, v in zip(packing.groups, *grouped_heads(qkv, packing, 3, self.n_heads)):
            if self.q_norm is not None and self.k_norm is not None:  # q, k, v: (b, H, T_g, Dh)
                q, k = self.q_norm(q), self.k_norm(k)
            if self.pos_enc is not None and self.pos_enc.rotates:
                q = self.pos_enc.rotate(q, group_positions(positions, g))
                k = self.pos_enc.rotate(k, group_positions(positions, g))
            opts = self.attention_options()
            out = self.attention(q, k, v, group_mask(mask, g, g), causal=causal, **opts).out
            per_group.append(out)  # (b, H, T_g, Dh)
        return self.packed_output(per_group, packing)


class FastCrossAttention(_PackedOutput, CrossAttention):
    """:class:`~attnlab.nn.multihead.CrossAttention` that also runs on packed row groups: query
    group g attends to memory group g (a fast model packs both in the same groups)."""

    def forward(self, x, memory=None, mask=None, *, memory_kv=None, need_weights=False):
        route = _route(x)
        if route is None:
            return super().forward(x, memory, mask, memory_kv=memory_kv, need_weights=need_weights)
        packing, memory_packing = route
        assert memory_packing is not None  # a packed decoder packs its memory in the same groups
        (queries,) = grouped_heads(self.q_proj(x), packing, 1, self.n_heads)  # (b, H, T_g, Dh)
        kv = self.kv_proj(memory)  # (N_src, 2 H*Dh)
        keys, values = grouped_heads(kv, memory_packing, 2, self.n_heads)  # (b, H, S_g, Dh)
        per_group = []
        groups = zip(packing.groups, memory_packing.groups, queries, keys, values)
        for g, mg, q, k, v in groups:
            if self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            opts = self.attention_options()
            per_group.append(self.attention(q, k, v, group_mask(mask, g, mg), **opts).out)
        return self.packed_output(per_group, packing)
