"""attnlab: self-attention and Transformers from first principles."""

from attnlab.config import PRESETS, ModelConfig
from attnlab.models import (
    DecoderLM,
    EncoderClassifier,
    TransformerEncoder,
    TransformerEncoderDecoder,
    build_model,
)

__version__ = "0.1.0"
__all__ = [
    "PRESETS", "DecoderLM", "EncoderClassifier", "ModelConfig", "TransformerEncoder",
    "TransformerEncoderDecoder", "build_model",
]
