"""Models assembled from ``attnlab.nn``, behind three interfaces (LM, seq2seq, classifier)."""

from attnlab.models.base import (
    Classifier,
    Encoded,
    LanguageModel,
    LayerAttention,
    ModelOutput,
    Seq2SeqModel,
)
from attnlab.models.build import build_model
from attnlab.models.encoder import EncoderClassifier, EncoderOutput, TransformerEncoder
from attnlab.models.lm import DecoderLM
from attnlab.models.transformer_seq2seq import TransformerEncoderDecoder

__all__ = [
    "Classifier", "DecoderLM", "Encoded", "EncoderClassifier", "EncoderOutput", "LanguageModel",
    "LayerAttention", "ModelOutput", "Seq2SeqModel", "TransformerEncoder",
    "TransformerEncoderDecoder", "build_model",
]
