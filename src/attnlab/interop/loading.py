"""One loader for every format a model arrives in: an attnlab checkpoint or run directory
(:mod:`attnlab.checkpoint`, floor 3), a single-file safetensors export, a local Hugging Face
model directory, or a Hugging Face hub id. Every command that reads a model reads it here."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.checkpoint.load import OTHER_COPY, Checkpoint, check_finite
from attnlab.checkpoint.load import load_checkpoint as load_attnlab_checkpoint
from attnlab.data import LabelSet, PretrainedTokenizer, Tokenizer, load_tokenizer
from attnlab.errors import CheckpointError, UserError
from attnlab.interop.hub import resolve_model_path
from attnlab.interop.pretrained import is_hf_model_dir, load_pretrained
from attnlab.interop.safetensors_io import (
    load_safetensors,
    read_safetensors_config,
    read_safetensors_labels,
    read_safetensors_tokenizer,
)


def load_checkpoint(
    path: str | os.PathLike,
    *,
    map_location: str | torch.device = "cpu",
    expect_kind: str | Sequence[str] | None = None,
    verify: bool = True,
    fallback: bool = True,
    revision: str | None = None,
) -> Checkpoint:
    """Load a model from any of the formats above, as a :class:`Checkpoint`.

    An attnlab checkpoint or run directory loads through
    :func:`attnlab.checkpoint.load_checkpoint` (``map_location``, ``expect_kind``, ``verify``
    and ``fallback`` as there). A local Hugging Face model directory (a config.json with a
    ``model_type``) loads through ``attnlab.interop.pretrained``, and so does a Hugging Face hub
    id (at ``revision``) not shadowed by a local path (``attnlab.interop.hub``; ``~`` and
    ``$VARS`` expand).
    """
    path = resolve_model_path(path, revision=revision)
    if _is_hf_model_dir(path):
        return _load_hf_dir(path, map_location)
    if Path(path).is_file() and Path(path).suffix == ".safetensors":
        found = _load_safetensors_export(Path(path), map_location)
        if found is not None:
            return found
    return load_attnlab_checkpoint(
        path, map_location=map_location, expect_kind=expect_kind, verify=verify, fallback=fallback
    )


def _is_hf_model_dir(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and is_hf_model_dir(path)


def _load_safetensors_export(path: Path, map_location: Any) -> Checkpoint | None:
    """A single-file export (``attnlab export --format safetensors``: weights with the config,
    tokenizer and labels in its metadata) as a Checkpoint; None for a safetensors file without
    an attnlab config (e.g. the weights file of a checkpoint directory)."""
    try:
        config = read_safetensors_config(path)
    except (CheckpointError, ValueError, TypeError, OSError):
        return None
    model = load_safetensors(path)
    check_finite(dict(model.state_dict()), path, OTHER_COPY)
    tok = read_safetensors_tokenizer(path)
    labels = read_safetensors_labels(path)
    try:
        model.to(map_location)
    except (RuntimeError, AssertionError, ValueError) as err:
        raise UserError(f"cannot place the model on {str(map_location)!r} ({err})") from None
    return Checkpoint(
        model,
        config,
        load_tokenizer(tok) if tok else None,
        None,
        0,
        path,
        LabelSet.from_dict(labels) if labels else None,
    )


def _load_hf_dir(path: str | os.PathLike, map_location: str | torch.device) -> Checkpoint:
    """A local Hugging Face model directory (GPT-2, Llama family, BERT) as a Checkpoint, so every
    command that reads checkpoints reads these too (``attnlab.interop.pretrained``)."""
    found = load_pretrained(path)
    check_finite(dict(found.model.state_dict()), Path(path), OTHER_COPY)  # no silent NaN metrics
    tokenizer: Tokenizer | PretrainedTokenizer | None = found.tokenizer
    own = Path(path) / "attnlab_tokenizer.json"  # a char/byte tokenizer exported by attnlab
    if tokenizer is None and own.is_file():
        try:
            tokenizer = load_tokenizer(own)
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{str(own)!r} is not a valid tokenizer: {err}") from None
    try:
        found.model.to(map_location)
    except (RuntimeError, AssertionError, ValueError) as err:
        raise UserError(
            f"cannot place the model on {str(map_location)!r} ({err}); choose a device this "
            "machine has, e.g. 'cpu'"
        ) from None
    labels = LabelSet(found.labels) if found.labels else None
    return Checkpoint(found.model, found.config, tokenizer, None, 0, found.path, labels)
