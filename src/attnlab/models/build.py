"""build_model(cfg): the one place a config becomes a model."""

from __future__ import annotations

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


def _build(cfg: ModelConfig) -> nn.Module:
    if cfg.kind == "decoder_lm":
        from attnlab.models.lm import DecoderLM

        return DecoderLM(cfg)
    if cfg.kind == "encoder_decoder":
        from attnlab.models.transformer_seq2seq import TransformerEncoderDecoder

        return TransformerEncoderDecoder(cfg)
    if cfg.kind == "classifier":
        from attnlab.models.encoder import EncoderClassifier

        return EncoderClassifier(cfg)
    if cfg.kind == "encoder":
        from attnlab.models.encoder import TransformerEncoder

        return TransformerEncoder(cfg)
    if cfg.kind == "masked_lm":
        from attnlab.models.masked_lm import MaskedLM

        return MaskedLM(cfg)
    if cfg.kind == "rnn_lm":
        from attnlab.models.rnn_lm import RNNLM

        return RNNLM(cfg)
    if cfg.kind == "lstm_seq2seq":
        from attnlab.models.lstm_seq2seq import LSTMSeq2Seq

        return LSTMSeq2Seq(cfg)
    raise ValueError(f"unknown model kind {cfg.kind!r}")
