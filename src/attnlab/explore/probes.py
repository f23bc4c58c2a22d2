"""Reading one forward pass of a Transformer head by head, and switching heads off.

This is the explorer's only contact with the model's inside; everything else in
``attnlab.explore`` asks :mod:`attnlab.explore.session`. Every quantity of a head is read with
``attnlab.inspect.capture`` under its public name (``blocks.0.self_attn.A``), heads are switched
off with ``attnlab.inspect.ablate_heads``, and the inputs X and M of an attention module (what the
walkthrough starts from) are recorded by a forward pre-hook. The names and the equations:

    Q = X W_Q, K = M W_K, V = M W_V              (002; 004 eq. 13, per head; Q_rot, K_rot: RoPE)
    scores = Q K^T,  scaled = scores / sqrt(d_k)  (004 eq. 9)
    mask, A = softmax(scaled where the mask allows)   (000 future mask; 004 mask M)
    heads = A V,  concat = [head_1; ...; head_H],  out = concat W^O   (004 eq. 13)

Shapes: B batch (1 here), H heads, T queries, S keys, D d_model, Dk, Dv per head, Do output.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnlab.nn.attention import scale_factor
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


def step_names(path: str, module: nn.Module, steps: tuple[str, ...] = STEP_NAMES) -> list[str]:
    """The inspect names of one attention module's ``steps`` (plus the rotated Q, K with RoPE)."""
    rotary = getattr(module, "rotates", False) and "Q" in steps
    names = [f"{path}.{n}" for n in steps]
    return names + ([f"{path}.Q_rot", f"{path}.K_rot"] if rotary else [])


def cached_steps(module: nn.Module, path: str, rec: Recorded, cache) -> dict[str, Tensor]:
    """Every quantity of one module's attention equation for all heads, from an attnlab.inspect
    cache of a batch of one: X (T, D), M (S, Dm), Q (H, T, Dk), K (H, S, Dk), V (H, S, Dv),
    scores and scaled (H, T, S), mask (T, S) bool, A (H, T, S), heads (H, T, Dv),
    concat (T, H*Dv), out (T, Do), and the scale factor 1/sqrt(d_k)."""
    rotary = getattr(module, "rotates", False)
    get = {n: cache[f"{path}.{n}"][0] for n in STEP_NAMES}
    if rotary:  # the notes' Q and K of the dot product are the rotated ones
        get["Q"], get["K"] = cache[f"{path}.Q_rot"][0], cache[f"{path}.K_rot"][0]
    t, s = get["A"].shape[-2:]
    mask = torch.broadcast_to(get["mask"], (get["mask"].size(0), t, s))[0]  # (T, S)
    factor = scale_factor(module.scale, get["Q"].size(-1))
    return {**get, "X": rec.x[0], "M": rec.memory[0], "mask": mask, "factor": torch.tensor(factor)}


def matrix(t: Tensor) -> list:
    """A tensor as nested lists of floats rounded to 7 decimals (JSON-ready)."""
    return torch.round(t.detach().double().cpu(), decimals=7).tolist()
