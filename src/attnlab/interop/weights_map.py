"""Copy weights between a Hugging Face state dict and an attnlab model by a table of names.

A :class:`Mapped` row says "attnlab tensor ``ours`` is the concatenation (along rows) of the
Hugging Face tensors ``hf``" (one name for a plain copy; q, k, v for attnlab's fused projection),
transposed when the family stores ``Conv1D`` weights (in, out) (GPT-2), shifted by ``offset``
when the family stores a norm's gain g as w = g - 1 (Gemma's RMSNorm multiplies by 1 + w). A
``zero`` row is a tensor the family always stores and attnlab may lack (a bias of a bias-free
model): it is written as zeros and read back only when it is zero.

Coverage, both ways (:func:`check_table`): every attnlab tensor is mapped exactly once (a tied
alias counts as its tensor), no Hugging Face name is used twice, and on import every file tensor
is consumed (:func:`load_mapped` names the missing and the unexpected ones).

Shapes: attnlab keeps the ``nn.Linear`` layout (out, in); Llama and BERT files do too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.errors import CheckpointError
from attnlab.models.base import config_of
from attnlab.models.build import check_model_memory


class Mapped(NamedTuple):
    """attnlab ``ours`` = torch.cat([hf[0], hf[1], ...], dim=0) (each part transposed first when
    ``transpose``); rows of each part in ``sizes``. ``zero``: may be absent from the model."""

    hf: tuple[str, ...]
    ours: str
    sizes: tuple[int, ...] | None = None  # rows per part when more than one
    transpose: bool = False  # the file stores (in, out): GPT-2's Conv1D
    zero: bool = False  # the family always has it; a model without it stores zeros
    offset: float = 0.0  # ours = file + offset: Gemma's RMSNorm gains are stored as w in (1 + w)

    @classmethod
    def one(
        cls, hf: str, ours: str, *, transpose: bool = False, zero: bool = False, offset: float = 0.0
    ) -> Mapped:
        return cls((hf,), ours, None, transpose, zero, offset)


def _shape(parts: Sequence[Tensor]) -> Any:
    shapes = [tuple(p.shape) for p in parts]
    return shapes[0] if len(shapes) == 1 else shapes


def check_table(model: nn.Module, table: Sequence[Mapped], family: str) -> None:
    """Every tensor of ``model`` is mapped exactly once and no file name twice (CheckpointError
    naming the tensors otherwise). A tied alias (the LM head sharing the embedding) counts as
    the tensor it shares; a ``zero`` row may name a tensor the model lacks."""
    ours = model.state_dict(keep_vars=True)
    rows = [row.ours for row in table]
    files = [k for row in table for k in row.hf]
    twice = sorted(
        {k for k in rows if rows.count(k) > 1} | {k for k in files if files.count(k) > 1}
    )
    absent = [row.ours for row in table if row.ours not in ours and not row.zero]
    by_tensor: dict[int, set[str]] = {}
    for name, tensor in ours.items():
        by_tensor.setdefault(id(tensor), set()).add(name)
    mapped = set(rows)
    unmapped = sorted(min(names) for names in by_tensor.values() if not names & mapped)
    if twice or absent or unmapped:
        raise CheckpointError(
            f"the {family} tensor table does not cover this model one to one: mapped twice "
            f"{twice[:6]}, not in the model {absent[:6]}, unmapped {unmapped[:6]}; the model has "
            f"parts {family} cannot hold (export to safetensors instead)"
        )


M = TypeVar("M", bound=nn.Module)  # the model type a loader fills


def load_mapped(
    model: M,
    state_dict: Mapping[str, Tensor],
    table: Sequence[Mapped],
    family: str,
    *,
    ignored: re.Pattern | None = None,
) -> M:
    """Copy ``state_dict`` into ``model`` by ``table``; every attnlab tensor must be covered and
    every file tensor consumed (apart from ``ignored`` buffers).

    Missing Hugging Face tensors, unexpected ones and shape mismatches are CheckpointErrors
    naming the keys. Returns the model in eval mode.
    """
    check_table(model, table, family)
    tensors = dict(state_dict)
    targets = model.state_dict(keep_vars=True)
    missing = [k for row in table for k in row.hf if k not in tensors]
    if missing:
        raise CheckpointError(
            f"the {family} weights are missing {len(missing)} tensor(s): {missing[:6]}; the file "
            "is incomplete or config.json describes a bigger model than the weights"
        )
    with torch.no_grad():
        for row in table:
            parts = [tensors.pop(k) for k in row.hf]
            value = torch.cat([p.t() if row.transpose else p for p in parts], dim=0)
            if row.offset:
                value = value + row.offset
            target = targets.get(row.ours)
            if target is None:  # a zero row: the model lacks it, so the file must hold zeros
                if any(bool(p.any()) for p in parts):
                    raise CheckpointError(
                        f"{' + '.join(row.hf)} is non-zero but this model has no {row.ours} "
                        "(bias=False); build the model with bias=True"
                    )
                continue
            if tuple(value.shape) != tuple(target.shape):
                expect = tuple(target.t().shape) if row.transpose else tuple(target.shape)
                raise CheckpointError(
                    f"shape mismatch for {' + '.join(row.hf)}: the file has {_shape(parts)}, the "
                    f"config implies {expect}"
                    + (" (Conv1D, stored (in, out))" if row.transpose else "")
                    + f" ({row.ours}); the weights and config.json disagree"
                )
            target.copy_(value)
    unexpected = sorted(k for k in tensors if ignored is None or not ignored.search(k))
    if unexpected:
        raise CheckpointError(
            f"the {family} weights hold {len(unexpected)} tensor(s) attnlab does not know: "
            f"{unexpected[:6]}; config.json describes fewer layers than the weights, or this "
            "model has parts attnlab lacks"
        )
    return model.eval()


def export_mapped(model: nn.Module, table: Sequence[Mapped], family: str) -> dict[str, Tensor]:
    """The Hugging Face state dict of ``model`` by ``table`` (fused tensors split back, Conv1D
    weights transposed, absent ``zero`` rows written as zeros); checks coverage first."""
    check_table(model, table, family)
    ours = model.state_dict()
    out: dict[str, Tensor] = {}
    for row in table:
        if row.ours in ours:
            value = ours[row.ours].detach()
        else:  # a zero row: as wide as the weight beside it (bias-free model, GPT-2 and BERT)
            weight = ours[row.ours.removesuffix(".bias") + ".weight"]
            value = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
        if row.offset:
            value = value - row.offset  # exact for gains g >= 0.5: g - 1 needs no rounding
        parts = (value,) if row.sizes is None else value.split(list(row.sizes), dim=0)
        for key, part in zip(row.hf, parts, strict=True):
            out[key] = (part.t() if row.transpose else part).contiguous().clone()
    return out


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.to(b), b)


def tied_head(
    tensors: dict[str, Tensor], head: str, embedding: str, tied: bool, family: str
) -> None:
    """Check the output head ``head`` of a file against the config's tying: with tied embeddings
    an ``lm_head`` (if stored) must equal the embedding and is dropped from ``tensors``; untied,
    it must be there."""
    if not tied:
        if head not in tensors:
            raise CheckpointError(
                f"the config unties the output head (tie_word_embeddings=false) but the {family} "
                f"weights have no {head}"
            )
        return
    value, emb = tensors.pop(head, None), tensors.get(embedding)
    if value is not None and emb is not None and not _same(value, emb):
        raise CheckpointError(
            f"{head} differs from {embedding} but the config ties them "
            "(tie_word_embeddings=true); set tie_word_embeddings to false in config.json to "
            "keep the separate output head"
        )


def model_to_load(
    model: M | None,
    config: Any,
    *,
    loader: str,
    convert: Callable[[Any], ModelConfig],
    check: Callable[[ModelConfig], object],
    build: Callable[[ModelConfig], M],
    family: str,
    cls: type[M] | tuple[type[M], ...] | None = None,
) -> M:
    """The model a ``loader`` (``load_<family>_state_dict``) copies weights into: ``model``
    (an instance of ``cls``, or of one of them, when given), or a new one ``build`` makes from
    ``config``, an attnlab ModelConfig or a transformers config / config.json dict that
    ``convert`` maps. ``check`` raises ConfigError for the settings the family cannot hold."""
    if model is None:
        if config is None:
            raise TypeError(f"{loader} needs a model or a config to build one from")
        cfg = config if isinstance(config, ModelConfig) else convert(config)
        check(cfg)
        check_model_memory(cfg)  # a config asking for 1e6 width stops before allocating
        return build(cfg)
    if cls is not None and not isinstance(model, cls):
        names = " or ".join(c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,)))
        raise TypeError(f"{family} weights load into a {names}, got {type(model).__name__}")
    check(config_of(model))
    return model


def problems_message(family: str, problems: list[str], supported: str) -> str:
    """One error paragraph listing every setting that does not map."""
    return (
        f"this {family} config uses {len(problems)} thing(s) attnlab cannot build: "
        + "; ".join(problems)
        + f". attnlab supports {supported}"
    )


def config_dict(hf_config: Any, family: str) -> dict[str, Any]:
    """A transformers config object (``family``: its class name) or config.json's dict -> dict."""
    if hasattr(hf_config, "to_dict") and callable(hf_config.to_dict):
        return dict(hf_config.to_dict())
    if isinstance(hf_config, Mapping):
        return dict(hf_config)
    raise TypeError(
        f"expected a transformers {family} or a dict (config.json), got {type(hf_config).__name__}"
    )
