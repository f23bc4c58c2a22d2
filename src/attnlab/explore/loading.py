"""What ``attnlab explore PATH`` can open: a run directory, a checkpoint, a local Hugging Face
directory (any model_type ``attnlab.interop.pretrained.MODEL_TYPES`` lists).

Only safe formats are read: attnlab checkpoints (safetensors + JSON, checked against their
manifest) and Hugging Face directories with ``model.safetensors`` (or safetensors shards) and a
``tokenizer.json``. A directory that offers only ``pytorch_model.bin`` (a pickle) is refused with
a message saying how to convert it. Nothing is downloaded.

:class:`LoadOptions` is where options that change how weights are read belong (the device now;
reduced-precision decode weights later), so the CLI, the app and the widget share one signature.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn

from attnlab.data import TASKS, LabelSet, make_task
from attnlab.errors import CheckpointError, ConfigError
from attnlab.generate.weights import check_cache_dtype, quantize_weights
from attnlab.interop.hf_tokenizer import has_tokenizer_files
from attnlab.interop.hub import expand_path, resolve_model_path
from attnlab.interop.loading import load_checkpoint
from attnlab.interop.pretrained import load_pretrained
from attnlab.train.build_data import VAL_SEED_OFFSET


@dataclass(frozen=True)
class LoadOptions:
    """How to load the model: ``device`` ("cpu", "cuda", ...) and, for language models,
    ``weights`` (``attnlab.generate.WEIGHT_MODES``: "fp32", or "bf16"/"int8"/"int4" linear
    weights for faster continuations; see docs/generation.md); ``kv_cache`` ("fp32", "bf16";
    None: the compute dtype) is checked against the model here and used by
    ``Session(cache_dtype=...)`` for continuations."""

    device: str = "cpu"
    weights: str = "fp32"
    kv_cache: str | None = None


class Loaded(NamedTuple):
    model: nn.Module
    tokenizer: Any  # the attnlab Tokenizer interface: encode, decode, token_to_str, vocab_size
    name: str  # what the page shows as the model's name
    labels: Any = None  # a classifier's class names
    example: str | None = None  # an input from the run's own data (held_out_example)


def load(path: str | os.PathLike, options: LoadOptions | None = None) -> Loaded:
    """Open ``path`` (run dir, checkpoint dir, or local Hugging Face dir) for exploring."""
    options = options or LoadOptions()
    loaded = _load(path, options)
    if options.weights != "fp32":
        try:
            quantize_weights(loaded.model, options.weights)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"weights={options.weights!r}: {err}", fields=("weights",)) from None
    if options.kv_cache is not None:
        try:
            check_cache_dtype(loaded.model, options.kv_cache)
        except ValueError as err:
            raise ConfigError(
                f"kv_cache={options.kv_cache!r}: {err}", fields=("kv_cache",)
            ) from None
    return loaded


def _load(path: str | os.PathLike, options: LoadOptions) -> Loaded:
    root = resolve_model_path(path)  # a hub id -> its snapshot in the Hugging Face cache
    if not root.exists():
        raise CheckpointError(
            f"{str(root)!r} does not exist; give a run directory or checkpoint written by "
            "`attnlab train`, a Hugging Face model directory, or a hub id"
        )
    config = root / "config.json"
    if root.is_dir() and config.is_file() and _is_hf_config(config):
        loaded = _load_hf(root, options)
        hub_id = not expand_path(path).exists()
        return loaded._replace(name=os.fspath(path)) if hub_id else loaded  # not its commit
    ckpt = load_checkpoint(root, map_location=options.device)
    if ckpt.tokenizer is None:
        raise CheckpointError(
            f"the checkpoint at {str(ckpt.path)!r} has no tokenizer.json, so text cannot be "
            "turned into tokens; save the checkpoint with its tokenizer"
        )
    name = f"{root.name} (step {ckpt.step})"
    return Loaded(ckpt.model, ckpt.tokenizer, name, ckpt.labels, held_out_example(ckpt))


def held_out_example(ckpt: Any) -> str | None:
    """An input like those the run was trained on, for the page's first view: the first
    validation source of a generated task, or the first line of an LM's text file; None when
    the run's data is not at hand (the page then picks a generic example)."""
    cfg = (ckpt.train_state or {}).get("train_config") or {}
    data = cfg.get("data")
    if not isinstance(data, str):
        return None
    if data in TASKS:
        seed = int(cfg.get("seed", 0)) + VAL_SEED_OFFSET  # the run's validation examples
        return make_task(data).make_pairs(1, seed=seed)[0][0]
    text = Path(data)
    if cfg.get("task") == "lm" and text.is_file():
        try:
            with text.open(encoding="utf-8") as f:
                line = next((s.strip() for s in f if s.strip()), "")
        except (OSError, UnicodeDecodeError):
            return None
        return line[:200] or None
    return None


def _is_hf_config(path: Path) -> bool:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # let the checkpoint loader report the damaged file
    return isinstance(data, dict) and "model_type" in data and "format" not in data


def _load_hf(root: Path, options: LoadOptions) -> Loaded:
    """A local Hugging Face directory (``attnlab.interop.pretrained.MODEL_TYPES``)."""
    if not any((root / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json")):
        raise CheckpointError(
            f"{str(root)!r} has no model.safetensors; the explorer never loads pickle files "
            "(pytorch_model.bin). Convert once with transformers: "
            "`AutoModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)`"
        )
    if not has_tokenizer_files(root):
        raise CheckpointError(
            f"{str(root)!r} has no tokenizer.json; save the tokenizer next to the weights "
            "(`AutoTokenizer.from_pretrained(dir).save_pretrained(dir)`)"
        )
    found = load_pretrained(root)
    labels = None
    if found.labels:
        labels = LabelSet(found.labels)
    return Loaded(found.model.to(options.device).eval(), found.tokenizer, root.name, labels)
