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
from attnlab.models.decoder_classifier import DecoderClassifier
from attnlab.models.encoder import EncoderClassifier, EncoderOutput, TransformerEncoder
from attnlab.models.lm import DecoderLM
from attnlab.models.lstm_seq2seq import LSTMSeq2Seq
from attnlab.models.rnn_lm import RNNLM
from attnlab.models.transformer_seq2seq import TransformerEncoderDecoder

__all__ = [
    "Classifier",
    "DecoderClassifier",
    "DecoderLM",
    "Encoded",
    "EncoderClassifier",
    "EncoderOutput",
    "LanguageModel",
    "LayerAttention",
    "LSTMSeq2Seq",
    "ModelOutput",
    "RNNLM",
    "Seq2SeqModel",
    "TransformerEncoder",
    "TransformerEncoderDecoder",
    "build_model",
]
