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

import base64
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import inspect
from attnlab.nn.attention import scale_factor
from attnlab.nn.grouped import repeat_kv
from attnlab.nn.multihead import CrossAttention, MultiHeadBase, SelfAttention


class Site(NamedTuple):
    """One kind of attention in a model: its layers' modules, in depth order."""

    name: str  # "encoder", "decoder" (masked self-attention) or "cross"
    modules: list[tuple[str, MultiHeadBase]]  # (module path, SelfAttention | CrossAttention)


def attention_sites(model: nn.Module) -> list[Site]:
    """Group a model's attention modules by kind, in the order the data flows through them."""
    groups: dict[str, list[tuple[str, MultiHeadBase]]] = {}
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
    call: tuple[tuple, dict]  # the module's (args, kwargs), to run it again (:func:`replay`)


@contextmanager
def record_inputs(modules: Sequence[tuple[str, nn.Module]]) -> Iterator[dict[str, Recorded]]:
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
            memory = x if memory is None else memory  # memory_kv given: keys from x's width
            call = (args, dict(kwargs))
            seen[path] = Recorded(_batched(x), _batched(memory), mask, causal, positions, call)

        return hook

    try:
        for path, module in modules:
            handles.append(module.register_forward_pre_hook(hook_for(path), with_kwargs=True))
        yield seen
    finally:
        for h in handles:
            h.remove()


class Enough(Exception):
    """Raised by :func:`stop_after` once every attention module of interest has run."""


@contextmanager
def stop_after(modules: Sequence[tuple[str, nn.Module]]) -> Iterator[None]:
    """End the forward pass (raise :class:`Enough`) as soon as each of ``modules`` has run once:
    the feed-forward after the last attention and the unembedding (GPT-2: 1,024 x 768 x 50,257
    multiply-adds, a third of the pass) are not computed for attention views."""
    done: set[int] = set()
    wanted = {id(m) for _, m in modules}

    def hook(module, _args, _output):
        done.add(id(module))
        if done >= wanted:
            raise Enough

    handles = [m.register_forward_hook(hook) for _, m in modules]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def last_position_only(model: nn.Module) -> Iterator[None]:
    """While inside, the model's output layer (``lm_head``) sees only the last position: the
    next-token view needs z_T alone, and GPT-2's unembedding of every position (1,024 x 768 x
    50,257 multiply-adds) would be a third of the pass. Logits come out (..., 1, V)."""
    head = getattr(model, "lm_head", None)
    if not isinstance(head, nn.Module):
        yield
        return
    handle = head.register_forward_pre_hook(lambda _m, args: (args[0][..., -1:, :], *args[1:]))
    try:
        yield
    finally:
        handle.remove()


def replay(
    model: nn.Module, path: str, module: nn.Module, rec: Recorded, names: list[str]
) -> inspect.ActivationCache:
    """Run one attention module again on the inputs it received (``rec``) and capture ``names``
    (its inspect names, e.g. ``blocks.3.self_attn.A``): the numbers of one head without a whole
    forward pass. Inside ``Session.ablated`` the module's own switched-off heads stay off."""
    args, kwargs = rec.call
    with inspect.capture(model, names) as cache, torch.inference_mode():
        module(*args, **kwargs)
    return cache


@contextmanager
def pooled_weights(
    modules: Sequence[tuple[str, MultiHeadBase]], size: int
) -> Iterator[dict[str, Tensor]]:
    """While inside, each module's A (1, H, T, S) is averaged down to (H, <=size, <=size) blocks as
    it is computed (the full maps of a long input are never all kept: 12 x 12 heads x 1,024^2
    floats would be 576 MB). Thumbnails of the model view."""
    pooled: dict[str, Tensor] = {}
    handles = []

    def hook_for(path: str):
        def hook(_module, _args, output):
            a = output[0].float()  # (H, T, S)
            t, s = a.shape[-2:]
            pooled[path] = F.adaptive_avg_pool2d(a, (min(t, size), min(s, size)))

        return hook

    try:
        for path, module in modules:
            handles.append(module.get_submodule("hook_A").register_forward_hook(hook_for(path)))
        yield pooled
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


def cached_steps(
    module: MultiHeadBase, path: str, rec: Recorded, cache: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """Every quantity of one module's attention equation for all heads, from an attnlab.inspect
    cache of a batch of one: X (T, D), M (S, Dm), Q (H, T, Dk), K (H, S, Dk), V (H, S, Dv),
    scores and scaled (H, T, S), mask (T, S) bool, A (H, T, S), heads (H, T, Dv),
    concat (T, H*Dv), out (T, Do), and the scale factor 1/sqrt(d_k). With grouped-query
    attention (H_kv < H key/value heads) K and V are given per query head: head h's are key/value
    head h // G (``attnlab.nn.grouped.repeat_kv``, the expansion the attention itself makes)."""
    rotary = getattr(module, "rotates", False)
    get = {n: cache[f"{path}.{n}"][0] for n in STEP_NAMES}
    if rotary:  # the notes' Q and K of the dot product are the rotated ones
        get["Q"], get["K"] = cache[f"{path}.Q_rot"][0], cache[f"{path}.K_rot"][0]
    get["K"], get["V"] = (per_query_head(get[n], module.n_heads) for n in ("K", "V"))
    t, s = get["A"].shape[-2:]
    mask = torch.broadcast_to(get["mask"], (get["mask"].size(0), t, s))[0]  # (T, S)
    factor = scale_factor(module.scale, get["Q"].size(-1))
    return {**get, "X": rec.x[0], "M": rec.memory[0], "mask": mask, "factor": torch.tensor(factor)}


def per_query_head(kv: Tensor, n_heads: int) -> Tensor:
    """(H_kv, S, D) keys or values of one input -> (H, S, D), query head h's at index h."""
    return repeat_kv(kv[None], n_heads)[0]


def kv_head(module: MultiHeadBase, h: int) -> int:
    """The key/value head query head ``h`` reads: :func:`per_query_head` applied to the head
    indices, so the label comes from the same expansion the attention makes."""
    heads = torch.arange(getattr(module, "n_kv_heads", module.n_heads))[:, None, None]
    return int(per_query_head(heads, module.n_heads)[h])


def matrix(t: Tensor) -> list:
    """A tensor as nested lists of floats rounded to 7 decimals (JSON-ready)."""
    return torch.round(t.detach().double().cpu(), decimals=7).tolist()


EXACT_CELLS = 1 << 18  # up to 512 x 512 values travel as float32; larger maps as float16


def pack(t: Tensor, *, exact: bool | None = None) -> dict:
    """A tensor as compact JSON: {"dtype", "shape", "data" (base64, little-endian)}.

    float32 (exact to ~1e-7) up to EXACT_CELLS values, float16 (3 significant digits) beyond, so
    one 1,024 x 1,024 map is 2 MB instead of ~20 MB of JSON text, and a causal one ("layout":
    "tril", only j <= i sent) 1 MB; a bool mask is uint8 0/1.
    static/explorer.js ``unpack`` reads it back into a Float32Array."""
    t = t.detach().cpu()
    if t.dtype == torch.bool:
        dtype, raw = "u8", t.to(torch.uint8)
    else:
        exact = t.numel() <= EXACT_CELLS if exact is None else exact
        dtype, raw = ("f32", t.float()) if exact else ("f16", t.float().clamp(-65504, 65504).half())
    packed = {"dtype": dtype, "shape": list(t.shape)}
    if t.numel() > EXACT_CELLS and _lower_triangular(t):  # causal: send j <= i only, half
        rows, cols = torch.tril_indices(t.size(0), t.size(1))
        raw, packed["layout"] = raw[rows, cols], "tril"
    return {**packed, "data": _b64(raw)}


def _lower_triangular(t: Tensor) -> bool:
    """A square map whose every entry above the diagonal is 0 (a causal head's A)."""
    return t.dim() == 2 and t.size(0) == t.size(1) and not torch.triu(t, diagonal=1).any()


def unpack(packed: dict) -> Tensor:
    """:func:`pack` read back (tests, notebooks): a float64 tensor of the packed shape."""
    kind = {"f32": "<f4", "f16": "<f2", "u8": "u1"}[packed["dtype"]]
    values = np.frombuffer(base64.b64decode(packed["data"]), dtype=kind).astype(np.float64)
    if packed.get("layout") == "tril":  # the lower triangle, row by row; zeros above
        full = np.zeros(packed["shape"])
        full[np.tril_indices(packed["shape"][0], 0, packed["shape"][1])] = values
        values = full
    values = values.reshape(packed["shape"])
    if "scales" in packed:  # pack_scaled: bytes / 255 x each leading slice's scale
        scales = np.asarray(packed["scales"]).reshape((-1,) + (1,) * (values.ndim - 1))
        values = values / 255.0 * scales
    return torch.from_numpy(values)


def pack_scaled(t: Tensor) -> dict:
    """Non-negative maps (thumbnails) as uint8 per leading index, each scaled by its own maximum:
    value = byte / 255 * scale[i] (a diffuse head is as visible as a sharp one)."""
    t = t.detach().float().cpu()
    flat = t.reshape(t.size(0), -1)  # (N, cells)
    scale = flat.amax(dim=1).clamp_min(1e-12)  # (N,)
    q = torch.round(flat / scale[:, None] * 255).to(torch.uint8)
    packed = {"dtype": "u8", "shape": list(t.shape), "data": _b64(q)}
    return {**packed, "scales": [float(s) for s in scale]}


def _b64(t: Tensor) -> str:
    """Bytes of ``t`` in base64 (little-endian: the byte order of every machine torch runs on)."""
    return base64.b64encode(t.contiguous().numpy().tobytes()).decode("ascii")
