"""Fast multi-head attention: the plain modules of ``attnlab.nn.multihead`` plus the engine's paths.

:class:`FastSelfAttention` and :class:`FastCrossAttention` subclass the plain modules, own the same
parameters and hook points, and compute the same function. What they add:

* **row groups** (``attnlab.fast.packing``): inside a fast model's packed forward
  (:func:`packed`), x holds only the N real tokens, (N, D); the projections run on those, and
  attention runs on groups of rows of similar length, each padded to its own longest row;
* **one query under torch.compile** (:func:`one_query_attention`): a compiled decode step
  writes eq. 9 for a single query as reductions over the cache;
* **short keys** (``attnlab.fast.short_attention``): masked attention over at most 128 keys on
  the CPU as one autograd node with eq. 9's gradient written out.

``attnlab.fast.switches.PATHS`` turns each path off (benchmarks/fast_ab.py measures each).

Whenever the plain form is needed -- attention weights asked for, hard attention, a hook point
active -- they run the plain form (fast models do not pack while a hook is active).

Shapes: B batch, T query length, S key length, N real tokens, D d_model, H heads, Dh per head;
per group b rows of length T_g (queries) and S_g (keys).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple

import torch
from torch import Tensor

from attnlab.fast.packing import Packing, group_mask, group_positions, grouped_heads, packed_heads
from attnlab.fast.short_attention import short_key_attention, use_short_keys
from attnlab.fast.switches import PATHS
from attnlab.nn.attention import (
    AttentionOutput,
    attention_mask,
    attention_weights,
    scale_factor,
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


def one_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, factor: float):
    """Eq. 9 for one query per row (a decode step), written as reductions instead of matmuls:

        s_j = <q, k_j> * factor,  a = softmax_j(s),  out = sum_j a_j v_j.

    Under ``torch.compile`` these become a few fused loops over the cache in the generated code,
    where the fused kernel would be an opaque call per layer and token.
    q: (B, H, 1, Dk), k (B, H, S, Dk), v (B, H, S, Dv) -> (B, H, 1, Dv).
    """
    scores = (q * k).sum(dim=-1).unsqueeze(-2) * factor  # (B, H, 1, S)
    weights = attention_weights(scores, mask)  # (B, H, 1, S)
    return (weights.transpose(-2, -1) * v).sum(dim=-2, keepdim=True)  # (B, H, 1, Dv)


class _FastAttend:
    """The attention call of both fast modules: the one-query form under compile, else plain."""

    def attend(self, q, k, v, mask, causal, need_weights, bias=None) -> AttentionOutput:
        plain = need_weights or self.activation == "hardmax" or self.inner_points_active()
        if plain or bias is not None or (self.training and self.dropout > 0):  # bias: ALiBi
            return super().attend(q, k, v, mask, causal, need_weights, bias)
        factor = scale_factor(self.scale, q.size(-1))
        if q.size(-2) == 1 and torch.compiler.is_compiling() and PATHS["one_query"]:
            return AttentionOutput(one_query_attention(q, k, v, mask, factor), None)
        if mask is not None and PATHS["short_keys"] and use_short_keys(q, k, 0.0):
            mask = check_mask(mask, q.size(0), q.size(1), q.size(2), k.size(2))
            mask = attention_mask(mask, causal, q.size(-2), k.size(-2), q.device)
            return AttentionOutput(short_key_attention(q, k, v, mask, factor), None)
        return super().attend(q, k, v, mask, causal, need_weights)

    def packed_output(self, per_group: list[Tensor], packing: Packing) -> AttentionOutput:
        """Each group's heads (b, H, T_g, Dh) -> W^O on the packed real tokens, (N, Do)."""
        concat = packed_heads(per_group, packing)  # (N, H*Dh)
        return AttentionOutput(self.out_proj(concat) if self.out_proj is not None else concat, None)


class FastSelfAttention(_FastAttend, SelfAttention):
    """:class:`~attnlab.nn.multihead.SelfAttention` that also runs on packed row groups."""

    def forward(
        self, x, mask=None, *, causal=False, positions=None, cache=None, need_weights=False
    ):
        route = _route(x)
        if route is None:
            return super().forward(x, mask, causal=causal, positions=positions, cache=cache,
                                   need_weights=need_weights)  # fmt: skip
        packing = route.packing
        if positions is None:
            positions = default_positions(packing.length, 0, x.device)  # (T,)
        qkv = self.qkv_proj(x)  # (N, 3 H*Dh)
        per_group = []
        for g, q, k, v in zip(packing.groups, *grouped_heads(qkv, packing, 3, self.n_heads)):
            if self.q_norm is not None:  # q, k, v: (b, H, T_g, Dh)
                q, k = self.q_norm(q), self.k_norm(k)
            if self.rotary is not None:
                q = self.rotary.rotate(q, group_positions(positions, g))
                k = self.rotary.rotate(k, group_positions(positions, g))
            out = self.attend(q, k, v, group_mask(mask, g, g), causal, False).out
            per_group.append(out)  # (b, H, T_g, Dh)
        return self.packed_output(per_group, packing)


class FastCrossAttention(_FastAttend, CrossAttention):
    """:class:`~attnlab.nn.multihead.CrossAttention` that also runs on packed row groups: query
    group g attends to memory group g (a fast model packs both in the same groups)."""

    def forward(self, x, memory=None, mask=None, *, memory_kv=None, need_weights=False):
        route = _route(x)
        if route is None:
            return super().forward(x, memory, mask, memory_kv=memory_kv,
                                   need_weights=need_weights)  # fmt: skip
        packing, memory_packing = route
        (queries,) = grouped_heads(self.q_proj(x), packing, 1, self.n_heads)  # (b, H, T_g, Dh)
        kv = self.kv_proj(memory)  # (N_src, 2 H*Dh)
        keys, values = grouped_heads(kv, memory_packing, 2, self.n_heads)  # (b, H, S_g, Dh)
        per_group = []
        groups = zip(packing.groups, memory_packing.groups, queries, keys, values)
        for g, mg, q, k, v in groups:
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            per_group.append(self.attend(q, k, v, group_mask(mask, g, mg), False, False).out)
        return self.packed_output(per_group, packing)
