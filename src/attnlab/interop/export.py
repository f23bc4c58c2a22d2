"""Export a trained model (and its tokenizer) to a format other tools read.

Formats:
    hf           a Hugging Face directory in the model's own family (``attnlab.interop.
                 pretrained.save_pretrained``): Llama for rotary/RMSNorm/SwiGLU decoders (GQA and
                 sliding windows included; Mistral then), GPT-2 for learned-position decoders,
                 BERT for encoders, classifiers and masked LMs; with the tokenizer.
    hf-gpt2      a Hugging Face GPT-2 directory: config.json + model.safetensors, loadable with
                 ``transformers.GPT2LMHeadModel.from_pretrained(dir)``. The tokenizer (BPE, char
                 or byte) is also written as tokenizer.json + tokenizer_config.json so
                 ``AutoTokenizer.from_pretrained(dir)`` loads it with the same ids; every
                 tokenizer is kept in attnlab's own format as attnlab_tokenizer.json.
    safetensors  one self-describing .safetensors file with attnlab parameter names, and the
                 ModelConfig, tokenizer and class labels in its metadata (``load_safetensors``).

Nothing is overwritten by accident: an existing target (a file, or a non-empty directory for
hf-gpt2) is refused unless ``force``, and a target inside an attnlab checkpoint or run
``checkpoints/`` directory is always refused (overwriting ``model.safetensors`` there would break
the checkpoint's manifest).

Tokenizers are duck-typed (``to_dict``, ``save``, ``pad_id``/``bos_id``/``eos_id``, ``specials``
and, for BPE, ``hf``) so this layer does not import ``attnlab.data``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.checkpoint.atomic import atomic_write_text
from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.interop.gpt2 import check_gpt2_compatible
from attnlab.interop.gpt2_files import save_gpt2_dir
from attnlab.interop.safetensors_io import save_safetensors
from attnlab.interop.tokenizer_json import hf_tokenizer
from attnlab.models.lm import DecoderLM

FORMATS = ("hf", "hf-gpt2", "safetensors")
ATTNLAB_TOKENIZER_FILE = "attnlab_tokenizer.json"


def export_as(
    model: nn.Module,
    fmt: str,
    out: str | os.PathLike,
    *,
    config: ModelConfig | None = None,
    tokenizer: Any = None,
    labels: Any = None,
    force: bool = False,
) -> Path:
    """Write ``model`` (with its ``config``, default ``model.cfg``, and its ``tokenizer`` and class
    ``labels`` if given) to ``out`` in format ``fmt``; returns the path written (a directory for
    hf-gpt2, a file for safetensors). ``force`` replaces an existing target (never one inside a
    checkpoint directory)."""
    if fmt not in FORMATS:
        raise ConfigError(
            f"unknown export format {fmt!r}; choose one of {list(FORMATS)}", fields=("fmt",)
        )
    out = Path(out)
    if fmt == "safetensors":
        if out.is_dir():
            raise ConfigError(
                f"out={str(out)!r} is a directory; safetensors export writes one "
                "file, e.g. out='model.safetensors'",
                fields=("out",),
            )
        check_export_target(out, force)
        return save_safetensors(model, out, config, tokenizer=tokenizer, labels=labels)
    if fmt == "hf":
        from attnlab.interop.pretrained import save_pretrained  # pretrained imports this module

        check_export_target(out, force)
        names = list(getattr(labels, "names", labels) or []) or None
        return save_pretrained(model, out, tokenizer=tokenizer, labels=names, overwrite=force)
    if not isinstance(model, DecoderLM):
        raise ConfigError(
            f"hf-gpt2 export needs a decoder-only language model (kind='decoder_lm'), this "
            f"checkpoint holds a {type(model).__name__}; use fmt='hf' (the model's own Hugging "
            "Face family) or fmt='safetensors' instead",
            fields=("fmt",),
        )
    check_gpt2_compatible(model.cfg)
    check_export_target(out, force)
    ids = {}
    if tokenizer is not None:
        ids = {"bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id, "pad_id": tokenizer.pad_id}
    root = save_gpt2_dir(model, out, **ids)
    if tokenizer is not None:
        save_tokenizer_files(tokenizer, root, model.cfg.max_len)
    return root


def _is_checkpoint_dir(path: Path) -> bool:
    """An attnlab checkpoint (config.json + manifest.json) or a run's checkpoints/ directory."""
    if (path / "config.json").is_file() and (path / "manifest.json").is_file():
        return True
    return path.name == "checkpoints" and (path / "latest").is_file()


def check_export_target(out: Path, force: bool) -> None:
    """Refuse a target inside a checkpoint directory, and an existing one unless ``force``."""
    inside = next((d for d in (out, *out.resolve().parents) if _is_checkpoint_dir(d)), None)
    if inside is not None:
        raise ConfigError(
            f"out={str(out)!r} lies inside the checkpoint directory {str(inside)!r}; writing "
            f"there would damage the checkpoint, so choose a path outside it (e.g. out="
            f"'exports/{out.name}')",
            fields=("out",),
        )
    taken = out.is_file() or out.is_symlink() or (out.is_dir() and any(out.iterdir()))
    if taken and not force:
        raise ConfigError(
            f"out={str(out)!r} already exists; pass force=True to replace it, or choose "
            f"another out path so nothing is overwritten",
            fields=("force", "out"),
        )


def save_tokenizer_files(tokenizer: Any, root: Path, max_len: int) -> list[Path]:
    """attnlab_tokenizer.json always; tokenizer.json + tokenizer_config.json (what
    ``transformers.AutoTokenizer`` reads) for a BPE tokenizer backed by Hugging Face
    ``tokenizers`` and for the char and byte tokenizers (built by
    :func:`attnlab.interop.tokenizer_json.hf_tokenizer`). Returns the files written."""
    written = [root / ATTNLAB_TOKENIZER_FILE]
    atomic_write_text(written[0], json.dumps(tokenizer.to_dict(), ensure_ascii=False))
    hf = getattr(tokenizer, "hf", None)
    if hf is None or not callable(getattr(hf, "to_str", None)):
        hf = hf_tokenizer(tokenizer)
    if hf is None:
        return written  # a tokenizer type with no Hugging Face twin
    specials = list(tokenizer.specials)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "pad_token": specials[tokenizer.pad_id],
        "bos_token": specials[tokenizer.bos_id],
        "eos_token": specials[tokenizer.eos_id],
        "clean_up_tokenization_spaces": False,
    }
    if getattr(tokenizer, "unk_id", None) is not None:
        config["unk_token"] = specials[tokenizer.unk_id]
    for name, body in (
        ("tokenizer.json", hf.to_str()),
        ("tokenizer_config.json", json.dumps(config, indent=2) + "\n"),
    ):
        atomic_write_text(root / name, body)
        written.append(root / name)
    return written
