"""GPT-2 checkpoints on disk and in memory: local Hugging Face directories and live HF models.

A Hugging Face model directory holds ``config.json`` and the weights as ``model.safetensors``
(or shards listed in ``model.safetensors.index.json``), or the older ``pytorch_model.bin``.
Nothing here downloads: fetch a model once with your own tools (for example
``hf download gpt2 --local-dir gpt2``), then point :func:`from_pretrained_dir` at it.
``transformers`` is never imported here; :func:`from_transformers` duck-types the model object.

Export writes the same layout so ``transformers.GPT2LMHeadModel.from_pretrained(dir)`` loads it.
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from attnlab.checkpoint.atomic import atomic_write_text, atomic_write_with
from attnlab.checkpoint.load import refuse_non_finite
from attnlab.errors import CheckpointError
from attnlab.interop.causal_lm import DecoderModel
from attnlab.interop.gpt2 import (
    gpt2_config_to_model_config,
    load_gpt2_state_dict,
    model_config_to_gpt2_config,
    to_gpt2_state_dict,
)
from attnlab.models.lm import DecoderLM

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"


def from_pretrained_dir(path: str | os.PathLike) -> DecoderModel:
    """A DecoderLM (eval mode) from a LOCAL Hugging Face GPT-2 directory (a DecoderClassifier
    from a GPT2ForSequenceClassification one); never downloads."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(
            f"{str(root)!r} is not a directory; give a local Hugging Face GPT-2 directory with "
            f"{CONFIG_FILE} and {SAFETENSORS_FILE} (attnlab never downloads: fetch it first, "
            "e.g. `hf download gpt2 --local-dir gpt2`)"
        )
    cfg = gpt2_config_to_model_config(_read_json(root / CONFIG_FILE, "the model config"))
    return load_gpt2_state_dict(None, read_weights(root), cfg)


def from_transformers(hf_model: Any) -> DecoderModel:
    """A DecoderLM (eval mode) with the weights of a live ``transformers`` GPT-2 model object
    (GPT2LMHeadModel or GPT2Model; a DecoderClassifier for GPT2ForSequenceClassification)."""
    config = getattr(hf_model, "config", None)
    if config is None or not callable(getattr(hf_model, "state_dict", None)):
        raise TypeError(
            f"expected a transformers GPT-2 model (with .config and .state_dict()), got "
            f"{type(hf_model).__name__}"
        )
    with torch.no_grad():
        return load_gpt2_state_dict(None, hf_model.state_dict(), config)


def read_weights(root: Path) -> dict[str, Tensor]:
    """All tensors of a HF model directory (single file or shards), on the CPU."""
    if (root / SAFETENSORS_FILE).is_file():
        return _load_safetensors(root / SAFETENSORS_FILE)
    if (root / SAFETENSORS_INDEX).is_file():
        return _load_shards(root, SAFETENSORS_INDEX, _load_safetensors)
    if (root / BIN_FILE).is_file():
        return _load_bin(root / BIN_FILE)
    if (root / BIN_INDEX).is_file():
        return _load_shards(root, BIN_INDEX, _load_bin)
    found = sorted(p.name for p in root.iterdir())
    raise CheckpointError(
        f"no weights in {str(root)!r}: expected {SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or "
        f"{BIN_FILE}; the directory holds {found[:10]}"
    )


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(
            f"{what} {str(path)!r} is missing; a Hugging Face model directory needs {path.name}"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{what} {str(path)!r} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} {str(path)!r} must hold a JSON object")
    return data


def _load_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(
            f"cannot read {str(path)!r} (truncated or not safetensors): {err}"
        ) from None


def _load_bin(path: Path) -> dict[str, Tensor]:
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing
            warnings.simplefilter("ignore", UserWarning)
            data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch's own message suggests unpickling anyway; attnlab never does, so it is not shown.
        raise CheckpointError(
            f"{str(path)!r} holds Python objects besides tensors, and attnlab reads only plain "
            "tensors from .bin files (anything else would run code from the file). Use the "
            "model's model.safetensors instead"
        ) from None
    except Exception as err:  # zip and EOF errors have many types; all mean "unreadable"
        raise CheckpointError(
            f"cannot read {str(path)!r} as a PyTorch weights file (only plain tensors are "
            f"allowed; {type(err).__name__}); it is truncated or not a weights file"
        ) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{str(path)!r} does not hold a state dict")
    return data


def _load_shards(root: Path, index_name: str, load) -> dict[str, Tensor]:
    index = _read_json(root / index_name, "the shard index")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index_name} in {str(root)!r} has no 'weight_map' object")
    tensors: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if not (root / shard).is_file():
            raise CheckpointError(
                f"shard {shard!r} listed in {index_name} is missing from {str(root)!r}"
            )
        tensors.update(load(root / shard))
    return tensors


def save_gpt2_dir(
    model: DecoderLM,
    path: str | os.PathLike,
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
    pad_id: int | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face GPT-2 directory (config.json + model.safetensors).

    ``transformers.GPT2LMHeadModel.from_pretrained(path)`` then loads it. Each file is written to a
    temporary name and renamed, so an interrupted export never leaves a half-written file.
    """
    refuse_non_finite(model, f"{str(path)!r} is not written (no command could load it)")
    config = model_config_to_gpt2_config(model.cfg, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    tensors = to_gpt2_state_dict(model)
    config["dtype"] = str(model.lm_head.weight.dtype).removeprefix("torch.")
    if model.cfg.tie_embeddings:  # safetensors stores no aliases; HF re-ties on load
        del tensors["lm_head.weight"]
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"export target {str(root)!r} exists and is not a directory")
    if (root / CONFIG_FILE).is_file():  # never clobber another model's config (e.g. attnlab's)
        try:
            existing = json.loads((root / CONFIG_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            existing = None
        if not isinstance(existing, dict) or existing.get("model_type") != "gpt2":
            raise CheckpointError(
                f"{str(root)!r} already holds a {CONFIG_FILE} that is not a GPT-2 config; "
                "export into a new or empty directory so nothing is overwritten"
            )
    return write_hf_dir(root, config, tensors)


def write_hf_dir(root: Path, config: dict[str, Any], tensors: dict[str, Tensor]) -> Path:
    """model.safetensors + config.json in ``root`` (created), each written atomically."""
    root.mkdir(parents=True, exist_ok=True)

    atomic_write_with(
        root / SAFETENSORS_FILE, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"})
    )
    atomic_write_text(root / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return root
