"""A model as one self-describing ``.safetensors`` file: the weights plus the attnlab config.

The file holds attnlab's own parameter names (``blocks.0.self_attn.qkv_proj.weight``, ...) and,
in the safetensors header metadata, the ModelConfig as JSON under ``"attnlab_config"`` (and
optionally the tokenizer's and a classifier's label set's ``to_dict()`` under
``"attnlab_tokenizer"`` and ``"attnlab_labels"``), so
:func:`load_safetensors` rebuilds the right model class from the file alone. Tied weights (the
LM head sharing the embedding matrix) are stored once; safetensors forbids aliases.

This is the export format for sharing weights with any safetensors reader; a training run
directory (config, tokenizer, optimizer state) is the job of ``attnlab.checkpoint.save``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_model
from torch import nn

from attnlab.checkpoint.atomic import atomic_write_with
from attnlab.checkpoint.load import refuse_non_finite
from attnlab.config import ModelConfig
from attnlab.errors import CheckpointError
from attnlab.models.build import build_model

CONFIG_KEY = "attnlab_config"
TOKENIZER_KEY = "attnlab_tokenizer"
LABELS_KEY = "attnlab_labels"


def save_safetensors(
    model: nn.Module,
    path: str | os.PathLike,
    config: ModelConfig | None = None,
    *,
    tokenizer: Any = None,
    labels: Any = None,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write ``model``'s weights and its config (``config`` or ``model.cfg``) to ``path``.

    ``tokenizer`` and ``labels`` (anything with ``to_dict()``: an attnlab Tokenizer, LabelSet) are
    embedded too; read them back with :func:`read_safetensors_tokenizer` / ``_labels``. Written
    to a temporary file and renamed into place (atomic). Extra string ``metadata`` is kept in the
    header.
    """
    cfg = config if config is not None else getattr(model, "cfg", None)
    if not isinstance(cfg, ModelConfig):
        raise TypeError(
            "save_safetensors needs the model's ModelConfig: pass config=... "
            f"({type(model).__name__} has no .cfg)"
        )
    meta = {"format": "pt", CONFIG_KEY: json.dumps(cfg.to_dict(), sort_keys=True)}
    for key, obj in ((TOKENIZER_KEY, tokenizer), (LABELS_KEY, labels)):
        if obj is not None:
            meta[key] = json.dumps(obj.to_dict(), ensure_ascii=False)
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"safetensors metadata must map str to str, got {k!r}: {v!r}")
        meta.setdefault(k, v)
    out = Path(path)
    refuse_non_finite(model, f"{str(out)!r} is not written (no command could load it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(out, lambda tmp: save_model(model, tmp, metadata=meta))
    return out


def _metadata(p: Path) -> dict[str, str]:
    if not p.is_file():
        raise CheckpointError(f"no safetensors file at {str(p)!r}")
    try:
        with safe_open(str(p), framework="pt") as f:
            return f.metadata() or {}
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"cannot read {str(p)!r} as safetensors: {err}") from None


def read_safetensors_tokenizer(path: str | os.PathLike) -> dict[str, Any] | None:
    """The tokenizer dict embedded by :func:`save_safetensors` (None if there is none); turn it
    into a tokenizer with ``attnlab.data.load_tokenizer``."""
    return _json_metadata(Path(path), TOKENIZER_KEY, "tokenizer")


def read_safetensors_labels(path: str | os.PathLike) -> dict[str, Any] | None:
    """The class label set embedded by :func:`save_safetensors` (None if there is none); turn it
    into labels with ``attnlab.data.LabelSet.from_dict``."""
    return _json_metadata(Path(path), LABELS_KEY, "label set")


def _json_metadata(p: Path, key: str, what: str) -> dict[str, Any] | None:
    text = _metadata(p).get(key)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"the {what} stored in {str(p)!r} is invalid: {err}") from None


def read_safetensors_config(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig stored in a file written by :func:`save_safetensors`."""
    p = Path(path)
    meta = _metadata(p)
    if CONFIG_KEY not in meta:
        raise CheckpointError(
            f"{str(p)!r} has no attnlab config in its metadata; it was not written by "
            "attnlab's save_safetensors (build the model yourself and pass model=...)"
        )
    try:
        return ModelConfig.from_dict(json.loads(meta[CONFIG_KEY]))
    except (json.JSONDecodeError, ValueError, TypeError) as err:
        msg = f"the attnlab config stored in {str(p)!r} is invalid: {err}"
        raise CheckpointError(msg) from None


def load_safetensors(path: str | os.PathLike, model: nn.Module | None = None) -> nn.Module:
    """Load weights from ``path`` into ``model`` (or a model built from the stored config).

    Missing or unexpected tensors and shape mismatches are CheckpointErrors naming the keys.
    Returns the model in eval mode.
    """
    if model is None:
        model = build_model(read_safetensors_config(path))
    elif not Path(path).is_file():
        raise CheckpointError(f"no safetensors file at {str(path)!r}")
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except RuntimeError as err:  # shape mismatches from load_state_dict
        raise CheckpointError(f"{str(path)!r} does not fit this model: {err}") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{str(path)!r} does not fit this model: missing {sorted(missing)[:5]}, unexpected "
            f"{sorted(unexpected)[:5]}; was it saved from a model with another config?"
        )
    return model.eval()
