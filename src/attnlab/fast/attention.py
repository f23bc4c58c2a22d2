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
from typing import NamedTuple

from torch import Tensor

from attnlab.fast.packing import Packing, group_mask, group_positions, grouped_heads, packed_heads
from attnlab.nn.attention import AttentionOutput
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

    def packed_output(self, per_group: list[Tensor], packing: Packing) -> AttentionOutput:
        """Each group's heads (b, H, T_g, Dh) -> W^O on the packed real tokens, (N, Do)."""
        concat = packed_heads(per_group, packing)  # (N, H*Dh)
        return AttentionOutput(self.out_proj(concat) if self.out_proj is not None else concat, None)


class FastSelfAttention(_PackedOutput, SelfAttention):
    """:class:`~attnlab.nn.multihead.SelfAttention` that also runs on packed row groups."""

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


class FastCrossAttention(_PackedOutput, CrossAttention):
    """:class:`~attnlab.nn.multihead.CrossAttention` that also runs on packed row groups: query
    group g attends to memory group g (a fast model packs both in the same groups)."""

    def forward(self, x, memory=None, mask=None, *, memory_kv=None, need_weights=False):
        route = _route(x)
        if route is None:
            return super().forward(x, memory, mask, memory_kv=memory_kv, need_weights=need_weights)
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
