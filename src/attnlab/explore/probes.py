"""Reading one forward pass of a Transformer head by head, and switching heads off.

This is the explorer's only contact with the model's inside; everything else in
``attnlab.explore`` asks :mod:`attnlab.explore.session`. Where the attention modules own hook
points (``hook_Q``, ``hook_A``, ...), every quantity is read with ``attnlab.inspect.capture`` under
its public name (``blocks.0.self_attn.A``) and heads are switched off with
``attnlab.inspect.ablate_heads``; the module's inputs X and M are recorded by a forward pre-hook.
For models built before the hook points, the quantities are recomputed from those inputs with the
module's own weights and helpers, step by step as the notes write them:

    Q = X W_Q, K = M W_K, V = M W_V              (002; 004 eq. 13, per head, after any rotary)
    scores = Q K^T,  scaled = scores / sqrt(d_k)  (004 eq. 9)
    A = softmax(scaled masked to -inf where the mask is False)   (000 future mask; 004 mask M)
    heads = A V,  concat = [head_1; ...; head_H],  out = concat W^O   (004 eq. 13)

Shapes: B batch (1 here), H heads, T queries, S keys, D d_model, Dk, Dv per head, Do output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnlab.nn.attention import hardmax
from attnlab.nn.masks import causal_mask, combine_masks
from attnlab.nn.multihead import CrossAttention, SelfAttention


class Site(NamedTuple):
    """One kind of attention in a model: its layers' modules, in depth order."""

    name: str  # "encoder", "decoder" (masked self-attention) or "cross"
    modules: list[tuple[str, nn.Module]]  # (module path, SelfAttention | CrossAttention)


def attention_sites(model: nn.Module) -> list[Site]:
    """Group a model's attention modules by kind, in the order the data flows through them."""
    groups: dict[str, list[tuple[str, nn.Module]]] = {}
    for path, module in model.named_modules():
        if isinstance(module, CrossAttention):
            groups.setdefault("cross", []).append((path, module))
        elif isinstance(module, SelfAttention):
            parent = model.get_submodule(path.rpartition(".")[0]) if "." in path else model
            causal = bool(getattr(parent, "causal", False)) or hasattr(parent, "cross_attn")
            groups.setdefault("decoder" if causal else "encoder", []).append((path, module))
    order = ("encoder", "decoder", "cross")
    return [Site(name, groups[name]) for name in order if name in groups]


class Recorded(NamedTuple):
    """What one attention module received in a forward pass (batch of one, no cache)."""

    x: Tensor  # (1, T, D) queries' input
    memory: Tensor  # (1, S, Dm) keys' and values' input (x itself for self-attention)
    mask: Tensor | None  # broadcastable to (1, H, T, S), True = may attend
    causal: bool
    positions: Tensor | None


@contextmanager
def record_inputs(modules: list[tuple[str, nn.Module]]) -> Iterator[dict[str, Recorded]]:
    """Record each module's inputs during the forward passes run inside the block."""
    seen: dict[str, Recorded] = {}
    handles = []

    def hook_for(path: str):
        def hook(module, args, kwargs):
            x = args[0]
            if isinstance(module, CrossAttention):
                memory = args[1] if len(args) > 1 else kwargs.get("memory")
                mask = args[2] if len(args) > 2 else kwargs.get("mask")
                causal, positions = False, None
            else:
                memory = x
                mask = args[1] if len(args) > 1 else kwargs.get("mask")
                causal, positions = kwargs.get("causal", False), kwargs.get("positions")
            seen[path] = Recorded(_batched(x), _batched(memory), mask, causal, positions)

        return hook

    try:
        for path, module in modules:
            handles.append(module.register_forward_pre_hook(hook_for(path), with_kwargs=True))
        yield seen
    finally:
        for h in handles:
            h.remove()


def _batched(x: Tensor) -> Tensor:
    """A packed single row (N, D) back to (1, N, D) (one row packs to its tokens in order)."""
    return x[None] if x.dim() == 2 else x


STEP_NAMES = ("Q", "K", "V", "scores", "scaled", "mask", "A", "heads", "concat", "out")


def has_hook_points(modules: list[tuple[str, nn.Module]]) -> bool:
    """True when the attention modules own the hook points attnlab.inspect reads."""
    return bool(modules) and all(hasattr(m, "hook_A") for _, m in modules)


def step_names(path: str, module: nn.Module, steps: tuple[str, ...] = STEP_NAMES) -> list[str]:
    """The inspect names of one attention module's ``steps`` (plus the rotated Q, K with RoPE)."""
    rotary = getattr(module, "rotary", None) is not None and "Q" in steps
    names = [f"{path}.{n}" for n in steps]
    return names + ([f"{path}.Q_rot", f"{path}.K_rot"] if rotary else [])


def cached_steps(module: nn.Module, path: str, rec: Recorded, cache) -> dict[str, Tensor]:
    """The steps of :func:`head_steps` read from an ``attnlab.inspect`` cache (batch of one)."""
    rotary = getattr(module, "rotary", None) is not None
    get = {n: cache[f"{path}.{n}"][0] for n in STEP_NAMES}
    if rotary:  # the notes' Q and K of the dot product are the rotated ones
        get["Q"], get["K"] = cache[f"{path}.Q_rot"][0], cache[f"{path}.K_rot"][0]
    t, s = get["A"].shape[-2:]
    mask = torch.broadcast_to(get["mask"], (get["mask"].size(0), t, s))[0]  # (T, S)
    factor = _scale_factor(module.scale, get["Q"].size(-1))
    return {**get, "X": rec.x[0], "M": rec.memory[0], "mask": mask,
            "factor": torch.tensor(factor)}  # fmt: skip


def head_steps(module: nn.Module, rec: Recorded) -> dict[str, Tensor]:
    """Every quantity of the attention equation for all heads, named as in the notes.

    Returns X (T, D), M (S, Dm), Q (H, T, Dk), K (H, S, Dk), V (H, S, Dv), scores and scaled
    (H, T, S), mask (T, S) bool, A (H, T, S), heads (H, T, Dv), concat (T, H*Dv), out (T, Do).
    """
    x, memory = rec.x, rec.memory
    if isinstance(module, CrossAttention):
        q = module._split(module.q_proj(x), module.d_head)  # (1, H, T, Dk)
        k, v = module._memory_heads(module.kv_proj(memory))  # (1, H, S, Dk), (1, H, S, Dv)
        if module.q_norm is not None:
            q = module.q_norm(q)
    else:
        hk, hv = module.n_heads * module.d_head, module.n_heads * module.d_v
        q, k, v = module.qkv_proj(x).split([hk, hk, hv], dim=-1)  # (1, T, H*Dk) x2, (1, T, H*Dv)
        q = module._split(q, module.d_head)  # (1, H, T, Dk)
        k = module._split(k, module.d_head)  # (1, H, T, Dk)
        v = module._split(v, module.d_v)  # (1, H, T, Dv)
        q, k = module._prepare_qk(q, k, rec.positions)
    t, s = q.size(2), k.size(2)
    scores = q @ k.transpose(-2, -1)  # (1, H, T, S)
    factor = _scale_factor(module.scale, module.d_head)
    scaled = scores * factor
    mask = combine_masks(rec.mask, causal_mask(t, s, device=x.device) if rec.causal else None)
    full = torch.ones(t, s, dtype=torch.bool, device=x.device)
    mask2d = full if mask is None else torch.broadcast_to(mask, (1, 1, t, s))[0, 0]  # (T, S)
    scaled_masked = scaled.masked_fill(~mask2d, float("-inf"))
    if module.activation == "hardmax":  # hard attention: one-hot at the row's argmax (004)
        weights = hardmax(scaled_masked)  # (1, H, T, S)
    else:
        weights = scaled_masked.softmax(dim=-1)  # (1, H, T, S)
    heads = weights @ v  # (1, H, T, Dv)
    concat = module._merge(heads)  # (1, T, H*Dv)
    out = module.out_proj(concat) if module.out_proj is not None else concat  # (1, T, Do)
    return {
        "X": x[0],
        "M": memory[0],
        "Q": q[0],
        "K": k[0],
        "V": v[0],
        "scores": scores[0],
        "scaled": scaled[0],
        "factor": torch.tensor(factor),
        "mask": mask2d,
        "A": weights[0],
        "heads": heads[0],
        "concat": concat[0],
        "out": out[0],
    }


def matrix(t: Tensor) -> list:
    """A tensor as nested lists of floats rounded to 7 decimals (JSON-ready)."""
    return torch.round(t.detach().double().cpu(), decimals=7).tolist()


def _scale_factor(scale: bool | float, d_head: int) -> float:
    if scale is True:
        return 1.0 / math.sqrt(d_head)
    return 1.0 if scale is False else float(scale)


@contextmanager
def ablate(modules: list[nn.Module], heads: dict[int, list[int]]) -> Iterator[None]:
    """Zero-ablate heads: head h of modules[layer] contributes nothing to the concatenation
    [head_1; ...; head_H] that W^O sees (004 eq. 13), for every forward pass inside the block."""
    handles = []

    def zero(module: nn.Module, index: list[int]):
        dv = module.d_v

        def cut(concat: Tensor) -> Tensor:
            concat = concat.clone()
            for h in index:
                concat[..., h * dv : (h + 1) * dv] = 0.0  # (.., H*Dv): head h's columns
            return concat

        if module.out_proj is not None:
            return module.out_proj.register_forward_pre_hook(lambda _m, args: (cut(args[0]),))
        return module.register_forward_hook(lambda _m, _a, out: out._replace(out=cut(out.out)))

    try:
        for layer, index in heads.items():
            if index:
                handles.append(zero(modules[layer], sorted(index)))
        yield
    finally:
        for h in handles:
            h.remove()
