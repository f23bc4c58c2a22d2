"""build_model(cfg): the one place a config becomes a model."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from attnlab.budget import check_allocation, fits_easily
from attnlab.config import ModelConfig


def build_model(cfg: ModelConfig, fast: bool | None = None) -> nn.Module:
    """Construct the model family named by ``cfg.kind`` (see :mod:`attnlab.config`).

    ``fast`` (default ``cfg.fast``) runs a Transformer on the engine of ``attnlab.fast``: the
    same parameters and function, with the engine's drop-in modules. Recurrent families have
    no fast form and are built as they are. The engine plugs in from above (:func:`plug_engine`);
    ``models`` never imports it.
    """
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"build_model needs a ModelConfig, got {type(cfg).__name__}")
    check_model_memory(cfg)
    model = _build(cfg)
    if cfg.fast if fast is None else fast:
        if _engine is None:
            raise RuntimeError("build_model(fast=True) needs the engine: import attnlab.fast")
        _engine(model)
    return model


# The engine's ``accelerate``, set by ``attnlab.fast`` when it is imported (``import attnlab``
# imports it): the engine sits above the models and plugs itself in.
_engine: Callable[[nn.Module], nn.Module] | None = None


def plug_engine(accelerate: Callable[[nn.Module], nn.Module]) -> None:
    """Make ``build_model(..., fast=True)`` put its models on ``accelerate`` (``attnlab.fast``)."""
    global _engine
    _engine = accelerate


# kind -> (module, class): imported on demand, so a model family costs nothing until it is used.
FAMILIES = {
    "decoder_lm": ("attnlab.models.lm", "DecoderLM"),
    "encoder_decoder": ("attnlab.models.transformer_seq2seq", "TransformerEncoderDecoder"),
    "classifier": ("attnlab.models.encoder", "EncoderClassifier"),
    "decoder_classifier": ("attnlab.models.decoder_classifier", "DecoderClassifier"),
    "encoder": ("attnlab.models.encoder", "TransformerEncoder"),
    "masked_lm": ("attnlab.models.masked_lm", "MaskedLM"),
    "rnn_lm": ("attnlab.models.rnn_lm", "RNNLM"),
    "lstm_seq2seq": ("attnlab.models.lstm_seq2seq", "LSTMSeq2Seq"),
}


def _build(cfg: ModelConfig) -> nn.Module:
    if cfg.kind not in FAMILIES:
        raise ValueError(f"unknown model kind {cfg.kind!r}")
    module, name = FAMILIES[cfg.kind]
    return getattr(importlib.import_module(module), name)(cfg)


def count_parameters(cfg: ModelConfig) -> int:
    """The number of parameters (and buffers) ``build_model(cfg)`` allocates, counted on the
    meta device: exact, without allocating them."""
    with torch.device("meta"):
        model = _build(cfg)
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() for t in tensors.values())


def check_model_memory(
    cfg: ModelConfig, copies: int = 1, purpose: str = "", device: torch.device | None = None
) -> None:
    """Stop, with the estimate and the limit, before building a model whose ``copies`` fp32
    copies (1: the weights; 4: training with AdamW) would not fit in this machine's memory
    (a CUDA ``device``: in that device's free memory)."""
    d, v = cfg.d_model, max(cfg.vocab_size, cfg.target_vocab_size)
    layers = cfg.n_layers + (cfg.n_decoder_layers or cfg.n_layers)
    rough = 2 * v * d + cfg.max_len * d + layers * (8 * d * d + 3 * d * cfg.ff_dim)
    if fits_easily(4 * copies * rough, device):
        return
    n = count_parameters(cfg)
    check_allocation(
        4 * copies * n,
        f"a {cfg.kind} model of {n:,} parameters (d_model={cfg.d_model}, n_layers="
        f"{cfg.n_layers}, d_ff={cfg.ff_dim}, vocab_size={cfg.vocab_size}){purpose}",
        "make it smaller (d_model, n_layers, d_ff, vocab_size or max_len)",
        device=device,
    )
