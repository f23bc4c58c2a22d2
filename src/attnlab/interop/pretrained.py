"""Any supported Hugging Face model directory (or live ``transformers`` model) in and out.

One entry point per direction, dispatching on ``config.json``'s ``model_type``:

    gpt2               -> decoder_lm   (attnlab.interop.gpt2)
    llama, mistral,    -> decoder_lm   (attnlab.interop.llama: RMSNorm, rotary, GQA, SwiGLU;
    qwen2, qwen3                        Qwen2's q/k/v biases, Qwen3's query/key norms)
    gemma, gemma2,     -> decoder_lm   (attnlab.interop.gemma: GeGLU, (1 + w) gains; Gemma 1's
    gemma3_text                         pre-norm block, Gemma 2's sandwich norms, soft-caps and
                                        alternating windows, Gemma 3's QK-norm)
                          (each decoder's ...ForSequenceClassification -> decoder_classifier)
    bert               -> encoder / classifier / masked_lm by ``architectures``
                                       (attnlab.interop.bert)

:func:`load_pretrained` reads a local directory (config.json, the weights as model.safetensors,
its shards, or pytorch_model.bin read with ``weights_only=True``, and the tokenizer through
:mod:`attnlab.interop.hf_tokenizer`), or a Hugging Face hub id (``gpt2``,
``HuggingFaceTB/SmolLM2-135M``) fetched into the standard Hugging Face cache by
:mod:`attnlab.interop.hub` (config, safetensors and tokenizer files only, never a pickle).
:func:`save_pretrained` writes the same layout back so ``transformers``' ``from_pretrained`` loads
it with equal outputs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from attnlab.checkpoint.load import refuse_non_finite
from attnlab.config import CLASSIFIER_KINDS, ModelConfig
from attnlab.errors import CheckpointError, ConfigError
from attnlab.interop import bert, gemma, gpt2, llama
from attnlab.interop.family import family_for
from attnlab.interop.gpt2_files import (
    CONFIG_FILE,
    SAFETENSORS_FILE,
    _read_json,
    read_weights,
    write_hf_dir,
)
from attnlab.interop.hf_tokenizer import (
    PretrainedTokenizer,
    has_tokenizer_files,
    load_pretrained_tokenizer,
)
from attnlab.interop.hub import expand_path, resolve_model_path
from attnlab.models import DecoderClassifier, DecoderLM
from attnlab.models.base import config_of

MODEL_TYPES = ("gpt2", *llama.MODEL_TYPES, *gemma.MODEL_TYPES, "bert")


class Pretrained(NamedTuple):
    """A model read from a Hugging Face directory, in eval mode, with what came with it."""

    model: nn.Module
    config: ModelConfig
    tokenizer: PretrainedTokenizer | None
    model_type: str
    labels: list[str] | None  # a classifier's id2label, in id order
    path: Path


def is_hf_model_dir(path: str | os.PathLike) -> bool:
    """A directory whose config.json names a ``model_type`` (a Hugging Face model directory)."""
    p = expand_path(path) / CONFIG_FILE
    if not p.is_file():
        return False
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "model_type" in data and "format" not in data


def model_config_from_hf(data: dict[str, Any]) -> ModelConfig:
    """config.json's dict (or a transformers config's ``to_dict()``) -> ModelConfig."""
    model_type = data.get("model_type")
    if model_type == "gpt2":
        return gpt2.gpt2_config_to_model_config(data)
    if model_type in llama.MODEL_TYPES:
        return llama.llama_config_to_model_config(data)
    if model_type in gemma.MODEL_TYPES:
        return gemma.gemma_config_to_model_config(data)
    if model_type == "bert":
        return bert.bert_config_to_model_config(data)
    raise ConfigError(
        f"model_type={model_type!r} is not supported; attnlab imports {list(MODEL_TYPES)} "
        "(GPT-2, the Llama family incl. Mistral, Qwen2 and Qwen3, Gemma 1, 2 and 3, and BERT)"
    )


def load_state_dict(config: ModelConfig, model_type: str, tensors: dict) -> nn.Module:
    """Build the model of ``config`` and copy Hugging Face ``tensors`` into it (eval mode)."""
    if model_type == "gpt2":
        return gpt2.load_gpt2_state_dict(None, tensors, config)
    if model_type in llama.MODEL_TYPES:
        return llama.LLAMA_LM.load(None, tensors, config)
    if model_type in gemma.MODEL_TYPES:
        return gemma.GEMMA_LM.load(None, tensors, config)
    return bert.load_bert_state_dict(None, tensors, config)


def load_pretrained(
    path: str | os.PathLike, *, tokenizer: bool = True, revision: str | None = None
) -> Pretrained:
    """The model (and tokenizer, when its files are there) of a Hugging Face model directory, or
    of a hub id (``gpt2``, ``org/name``) at ``revision``, through the standard Hugging Face cache
    (:func:`attnlab.interop.hub.resolve_model_path`; ``~`` and ``$VARS`` expand)."""
    root = resolve_model_path(path, revision=revision)
    if not root.is_dir():
        raise CheckpointError(
            f"{str(root)!r} is not a directory; give a Hugging Face model directory with "
            f"{CONFIG_FILE} and {SAFETENSORS_FILE}, or a hub id such as "
            "HuggingFaceTB/SmolLM2-135M (fetch one ahead with `hf download ID`)"
        )
    data = _read_json(root / CONFIG_FILE, "the model config")
    config = model_config_from_hf(data)
    model = load_state_dict(config, data["model_type"], read_weights(root))
    tok = None
    if tokenizer and has_tokenizer_files(root):
        tok = load_pretrained_tokenizer(root, vocab_size=config.vocab_size)
    labels = None
    if config.kind in CLASSIFIER_KINDS:
        assert config.n_classes is not None  # ModelConfig validates: a classifier has n_classes
        id2label = data.get("id2label") or {}
        labels = [str(id2label.get(str(i), id2label.get(i, i))) for i in range(config.n_classes)]
    return Pretrained(model, config, tok, data["model_type"], labels, root)


def from_hf_model(hf_model: Any) -> nn.Module:
    """The attnlab model (eval mode) with the weights of a live ``transformers`` model object."""
    config = getattr(hf_model, "config", None)
    if config is None or not callable(getattr(hf_model, "state_dict", None)):
        raise TypeError(
            f"expected a transformers model (with .config and .state_dict()), got "
            f"{type(hf_model).__name__}"
        )
    data = dict(config.to_dict())
    data["architectures"] = [type(hf_model).__name__]
    cfg = model_config_from_hf(data)
    with torch.no_grad():
        return load_state_dict(cfg, data["model_type"], dict(hf_model.state_dict()))


def hf_export(
    model: nn.Module,
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
    pad_id: int | None = None,
    labels: list[str] | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json dict, state dict) of ``model`` in the Hugging Face family whose round trip
    keeps its config exactly (:func:`attnlab.interop.family.family_for`): Llama (Mistral) for
    rotary RMSNorm SwiGLU decoders, GPT-2 for learned-position LayerNorm decoders (their
    ...ForSequenceClassification for decoder classifiers), BERT for encoders. A model no family
    holds is a ConfigError naming every field that does not map."""
    cfg = config_of(model)
    ids = dict(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    family = family_for(cfg)
    for decoder in (llama.LLAMA_LM, gemma.GEMMA_LM, gpt2.GPT2_LM):
        if family in decoder.families:
            if not isinstance(model, DecoderLM | DecoderClassifier):
                raise TypeError(
                    f"a {family.name} export needs a decoder, got {type(model).__name__}"
                )
            return decoder.config_json(cfg, ids, labels), decoder.export(model)
    return bert.model_config_to_bert_config(cfg, labels), bert.to_bert_state_dict(model)


def save_pretrained(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    tokenizer: Any = None,
    labels: list[str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` (and its ``tokenizer``: a pretrained one, or attnlab's own) as a Hugging
    Face directory that ``transformers``' ``from_pretrained`` loads with equal outputs."""
    refuse_non_finite(model, f"{str(path)!r} is not written (no command could load it)")
    ids = {}
    if tokenizer is not None:
        ids = dict(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
    config, tensors = hf_export(model, labels=labels, **ids)
    config["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    tensors = _drop_aliases(tensors)
    root = expand_path(path)
    if (root / CONFIG_FILE).is_file() and not overwrite:
        raise CheckpointError(
            f"{str(root)!r} already holds a {CONFIG_FILE}; export into a new or empty directory "
            "so nothing is overwritten"
        )
    write_hf_dir(root, config, tensors)
    if isinstance(tokenizer, PretrainedTokenizer):
        tokenizer.save_pretrained(root, config_of(model).max_len)
    elif tokenizer is not None:  # attnlab's char/byte/BPE tokenizers
        from attnlab.interop.export import save_tokenizer_files  # export imports this module

        save_tokenizer_files(tokenizer, root, config_of(model).max_len)
    return root


def _drop_aliases(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors stores no shared memory: keep the first name of each tied tensor (HF re-ties
    the output head to the embeddings on load)."""
    seen: set[int] = set()
    out = {}
    for key, t in tensors.items():
        ptr = t.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        out[key] = t
    return out
