"""build_model(cfg): the one place a config becomes a model."""

from __future__ import annotations

import importlib

from torch import nn

from attnlab.config import ModelConfig


def build_model(cfg: ModelConfig, fast: bool | None = None) -> nn.Module:
    """Construct the model family named by ``cfg.kind`` (see :mod:`attnlab.config`).

    ``fast`` (default ``cfg.fast``) runs a Transformer on the engine of ``attnlab.fast``: the
    same parameters and function, with the engine's drop-in modules. Recurrent families have
    no fast form and are built as they are.
    """
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"build_model needs a ModelConfig, got {type(cfg).__name__}")
    model = _build(cfg)
    if cfg.fast if fast is None else fast:
        from attnlab.fast import accelerate

        accelerate(model)
    return model


# kind -> (module, class): imported on demand, so a model family costs nothing until it is used.
FAMILIES = {
    "decoder_lm": ("attnlab.models.lm", "DecoderLM"),
    "encoder_decoder": ("attnlab.models.transformer_seq2seq", "TransformerEncoderDecoder"),
    "classifier": ("attnlab.models.encoder", "EncoderClassifier"),
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
