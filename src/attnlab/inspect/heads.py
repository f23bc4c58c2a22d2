"""Heads: find a model's attention layers and ablate chosen heads (zero or mean).

A head is (layer, h): ``layer`` indexes the attention layers of one stack in order (the decoder
LM has one stack, ``blocks``; the encoder-decoder has the encoder's and the decoder's), ``h`` a
head of that layer. ``site`` picks self- or cross-attention (cross exists in encoder-decoder
decoders only), ``part`` picks the stack when a site has two ("encoder" or "decoder").

Ablating head h replaces its output head_h = A_h V_h (the ``heads`` activation, (B, H, T, Dv))
before the concatenation and W^O (004 eq. 13), by zeros or by its mean over a reference run:

    MultiHead(X) = concat(head_1, ..., 0, ..., head_H) W^O

so zero-ablation equals the model with head h's Dv rows of W^O (columns of ``out_proj.weight``) set
to zero (tested).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnlab.inspect.cache import ActivationCache
from attnlab.inspect.interventions import intervene
from attnlab.inspect.names import InspectError, hook_points
from attnlab.nn.multihead import CrossAttention, MultiHeadBase

SITES = ("self", "cross")
MODES = ("zero", "mean")


@dataclass(frozen=True)
class AttentionLayer:
    """One attention module: its public path (``blocks.0.self_attn``), stack, index in the stack
    and the module itself."""

    path: str
    stack: str
    index: int
    module: MultiHeadBase


def _site_of(module: nn.Module) -> str:
    return "cross" if isinstance(module, CrossAttention) else "self"


def attention_layers(
    model: nn.Module, site: str = "self", part: str | None = None
) -> list[AttentionLayer]:
    """The attention modules of ``model`` at ``site`` in one stack, in layer order.

    Raises a clear error when the model has no attention of that kind, or when it has two stacks
    at that site and ``part`` does not say which.
    """
    if site not in SITES:
        raise InspectError(f"site must be one of {SITES}, got {site!r}")
    points = hook_points(model)
    found = []
    for path, module in model.named_modules():
        if not isinstance(module, MultiHeadBase) or _site_of(module) != site:
            continue
        head, _, last = path.rpartition(".")  # blocks.3.self_attn -> blocks.3, self_attn
        stack, _, index = head.rpartition(".")
        if not index.isdigit():
            stack, index = head, "0"
        found.append(AttentionLayer(path, stack, int(index), module))
    if not found:
        kinds = sorted({n.rpartition(".")[2] for n in points})
        raise InspectError(
            f"this model has no {site}-attention heads to choose from (its activations: "
            f"{', '.join(kinds)}); "
            + (
                "cross-attention exists only in an encoder-decoder's decoder"
                if site == "cross"
                else "recurrent models have one attention (alpha) and no heads: intervene "
                "on 'alpha' or 'e' instead"
            )
        )
    stacks = list(dict.fromkeys(layer.stack for layer in found))
    if part is not None:
        chosen = _match_part(part, stacks)
        found = [layer for layer in found if layer.stack == chosen]
    elif len(stacks) > 1:
        raise InspectError(
            f"this model has {site}-attention in {len(stacks)} stacks ({', '.join(stacks)}); "
            "pass part='encoder' or part='decoder' to say which"
        )
    return found


def _match_part(part: str, stacks: list[str]) -> str:
    matches = [s for s in stacks if s == part or s.startswith(part + ".")]
    if not matches and part == "decoder":  # the encoder-decoder's decoder stack is top-level
        matches = [s for s in stacks if not s.startswith("encoder")]
    if len(matches) != 1:
        raise InspectError(f"part={part!r} does not pick one of the stacks {stacks}")
    return matches[0]


def n_heads_of(layer: AttentionLayer) -> int:
    return int(layer.module.n_heads)


class HeadSpec(NamedTuple):
    layer: int
    head: int


def _parse_heads(heads) -> list[HeadSpec]:
    if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(v, int) for v in heads):
        heads = [heads]
    out = []
    for item in heads:
        if not (
            isinstance(item, (tuple, list))
            and len(item) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
        ):
            raise InspectError(
                f"heads must be (layer, head) pairs of ints, e.g. [(0, 1), (2, 3)]; got {item!r}"
            )
        out.append(HeadSpec(*item))
    if not out:
        raise InspectError("no heads given; pass (layer, head) pairs, e.g. [(0, 1)]")
    return out


def group_heads(
    model: nn.Module, heads, site: str = "self", part: str | None = None
) -> dict[str, tuple[AttentionLayer, list[int]]]:
    """Check (layer, head) pairs against the model and group them by attention module:
    {path: (layer, [head indices])}."""
    layers = attention_layers(model, site, part)
    by_index = {layer.index: layer for layer in layers}
    grouped: dict[str, tuple[AttentionLayer, list[int]]] = {}
    for spec in _parse_heads(heads):
        if spec.layer not in by_index:
            raise InspectError(
                f"layer {spec.layer} is out of range: this model's {site}-attention layers are "
                f"{sorted(by_index)}"
            )
        layer = by_index[spec.layer]
        n = n_heads_of(layer)
        if not 0 <= spec.head < n:
            raise InspectError(
                f"head {spec.head} is out of range for layer {spec.layer} ({layer.path}), "
                f"which has {n} heads: use 0..{n - 1}"
            )
        grouped.setdefault(layer.path, (layer, []))[1].append(spec.head)
    return grouped


def mean_head_outputs(source: ActivationCache | Mapping[str, Tensor], path: str) -> Tensor:
    """Each head's output averaged over the batch and positions of a reference run: (H, Dv)."""
    name = f"{path}.heads"
    if name not in source:
        raise InspectError(
            f"mean ablation needs {name!r} from a reference run: pass "
            "means=run_with_cache(model, reference_inputs, names='*.heads')[1]"
        )
    value = source[name]
    if value.dim() == 4:  # (B, H, T, Dv) -> (H, Dv)
        return value.mean(dim=(0, 2))
    if value.dim() == 2:
        return value  # already (H, Dv)
    raise InspectError(f"{name!r} in means must be (B, H, T, Dv) or (H, Dv), got {value.shape}")


@contextmanager
def ablate_heads(
    model: nn.Module,
    heads: Iterable[tuple[int, int]] | tuple[int, int],
    *,
    mode: str = "zero",
    site: str = "self",
    part: str | None = None,
    means: ActivationCache | Mapping[str, Tensor] | None = None,
) -> Iterator[None]:
    """Zero- or mean-ablate the given (layer, head) pairs inside the block.

    mode "zero": head_h = 0. mode "mean": head_h = its mean over a reference run, ``means`` =
    the cache of ``run_with_cache(model, reference, names="*.heads")`` (a mean over the current
    call would be wrong in generation, where a call sees one token, so it is not guessed).
    """
    if mode not in MODES:
        raise InspectError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "mean" and means is None:
        raise InspectError(
            "mean ablation needs reference activations: pass "
            "means=run_with_cache(model, reference_inputs, names='*.heads')[1]"
        )
    changes = {}
    for path, (layer, idx) in group_heads(model, heads, site, part).items():
        fill = mean_head_outputs(means, path) if means is not None and mode == "mean" else None
        want = (n_heads_of(layer), getattr(layer.module, "d_v", None))  # (H, Dv)
        if fill is not None and want[1] is not None and tuple(fill.shape) != want:
            raise InspectError(  # means of another model's run
                f"means for {path!r} are {tuple(fill.shape)} per head but this layer's heads "
                f"are (H, Dv) = {want}; take means from a reference run of this model"
            )
        changes[f"{path}.heads"] = _head_filler(idx, n_heads_of(layer), fill)
    with intervene(model, changes):
        yield


def _head_filler(heads: list[int], n_heads: int, fill: Tensor | None):
    """value (B, H, T, Dv) -> the same with heads ``heads`` replaced by 0 or ``fill`` (H, Dv)."""
    chosen = torch.zeros(n_heads, dtype=torch.bool)
    chosen[heads] = True

    def replace(value: Tensor) -> Tensor:
        where = chosen.to(value.device)[None, :, None, None]  # (1, H, 1, 1)
        if fill is None:
            return value.masked_fill(where, 0.0)
        f = fill.to(device=value.device, dtype=value.dtype)[None, :, None, :]  # (1, H, 1, Dv)
        return torch.where(where, f, value)

    return replace
