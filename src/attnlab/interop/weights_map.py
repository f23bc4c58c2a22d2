"""Copy weights between a Hugging Face state dict and an attnlab model by a table of names.

A :class:`Mapped` row says "attnlab tensor ``ours`` is the concatenation (along rows) of the
Hugging Face tensors ``hf``" (one name for a plain copy; q, k, v for attnlab's fused projection).
:func:`load_mapped` applies a table in one direction with every check a user needs (missing and
unexpected keys named, shapes compared), :func:`export_mapped` in the other, splitting fused
tensors back by the widths of their parts.

Shapes: the tensors keep the ``nn.Linear`` layout (out, in) on both sides for Llama and BERT.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.errors import CheckpointError
from attnlab.models.build import check_model_memory


class Mapped(NamedTuple):
    """attnlab ``ours`` = torch.cat([hf[0], hf[1], ...], dim=0); rows of each part in ``sizes``."""

    hf: tuple[str, ...]
    ours: str
    sizes: tuple[int, ...] | None = None  # rows per part when more than one

    @classmethod
    def one(cls, hf: str, ours: str) -> Mapped:
        return cls((hf,), ours)


def load_mapped(
    model: nn.Module,
    state_dict: Mapping[str, Tensor],
    table: Sequence[Mapped],
    family: str,
    *,
    ignored: re.Pattern | None = None,
) -> nn.Module:
    """Copy ``state_dict`` into ``model`` by ``table``; every attnlab tensor must be covered.

    Missing Hugging Face tensors, unexpected ones (not in the table and not ``ignored``) and shape
    mismatches are CheckpointErrors naming the keys. Returns the model in eval mode.
    """
    tensors = dict(state_dict)
    targets = model.state_dict(keep_vars=True)
    missing = [k for row in table for k in row.hf if k not in tensors]
    if missing:
        raise CheckpointError(
            f"the {family} weights lack {len(missing)} tensor(s): {missing[:6]}; the file is "
            "incomplete or config.json describes a bigger model than the weights"
        )
    with torch.no_grad():
        for row in table:
            parts = [tensors.pop(k) for k in row.hf]
            value = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
            target = targets.get(row.ours)
            if target is None:
                raise CheckpointError(f"attnlab model has no tensor {row.ours!r} for {row.hf}")
            if tuple(value.shape) != tuple(target.shape):
                raise CheckpointError(
                    f"shape mismatch for {' + '.join(row.hf)}: the file has "
                    f"{[tuple(p.shape) for p in parts]}, the config implies {tuple(target.shape)} "
                    f"({row.ours}); the weights and config.json disagree"
                )
            target.copy_(value)
    unexpected = sorted(k for k in tensors if ignored is None or not ignored.search(k))
    if unexpected:
        raise CheckpointError(
            f"the {family} weights hold {len(unexpected)} tensor(s) attnlab does not map: "
            f"{unexpected[:6]}; config.json describes fewer layers than the weights, or this "
            "model has parts attnlab lacks"
        )
    covered = {row.ours for row in table}
    params = {name for name, _ in model.named_parameters()}  # tied weights appear once
    uncovered = sorted(params - covered)
    if uncovered:
        raise CheckpointError(f"the {family} weights leave {uncovered[:6]} unset")
    return model.eval()


def export_mapped(model: nn.Module, table: Sequence[Mapped]) -> dict[str, Tensor]:
    """The Hugging Face state dict of ``model`` by ``table`` (fused tensors split back)."""
    ours = model.state_dict()
    out: dict[str, Tensor] = {}
    for row in table:
        value = ours[row.ours].detach()
        parts = (value,) if row.sizes is None else value.split(list(row.sizes), dim=0)
        for key, part in zip(row.hf, parts, strict=True):
            out[key] = part.contiguous().clone()
    return out


def model_to_load(
    model: nn.Module | None,
    config: Any,
    *,
    loader: str,
    convert: Callable[[Any], ModelConfig],
    check: Callable[[ModelConfig], None],
    build: Callable[[ModelConfig], nn.Module],
    family: str,
    cls: type | None = None,
) -> nn.Module:
    """The model a ``loader`` (``load_<family>_state_dict``) copies weights into: ``model``
    (an instance of ``cls`` when given), or a new one ``build`` makes from ``config``, an attnlab
    ModelConfig or a transformers config / config.json dict that ``convert`` maps. ``check``
    raises ConfigError for the settings the family cannot hold."""
    if model is None:
        if config is None:
            raise TypeError(f"{loader} needs a model or a config to build one from")
        cfg = config if isinstance(config, ModelConfig) else convert(config)
        check(cfg)
        check_model_memory(cfg)  # a config asking for 1e6 width stops before allocating
        return build(cfg)
    if cls is not None and not isinstance(model, cls):
        raise TypeError(f"{family} weights load into a {cls.__name__}, got {type(model).__name__}")
    check(model.cfg)
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


def mismatches(cfg: Any, wanted: Mapping[str, Any], family: str) -> list[str]:
    """``name=value (<family> needs <wanted>)`` for every field of ``cfg`` that differs."""
    return [
        f"{k}={getattr(cfg, k)!r} ({family} needs {v!r})"
        for k, v in wanted.items()
        if getattr(cfg, k) != v
    ]
