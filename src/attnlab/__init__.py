"""attnlab: self-attention and Transformers from first principles."""

import attnlab.fast  # noqa: F401  (the opt-in engine plugs into build_model(fast=True) from above)
from attnlab.config import PRESETS, ModelConfig
from attnlab.generate import GenerationConfig, generate, generate_seq2seq, stream
from attnlab.models import (
    RNNLM,
    DecoderClassifier,
    DecoderLM,
    EncoderClassifier,
    LSTMSeq2Seq,
    TransformerEncoder,
    TransformerEncoderDecoder,
    build_model,
)

__version__ = "0.1.0"
__all__ = [
    "PRESETS",
    "RNNLM",
    "DecoderClassifier",
    "DecoderLM",
    "EncoderClassifier",
    "GenerationConfig",
    "LSTMSeq2Seq",
    "ModelConfig",
    "TransformerEncoder",
    "TransformerEncoderDecoder",
    "build_model",
    "generate",
    "generate_seq2seq",
    "stream",
]
