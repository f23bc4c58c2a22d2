"""Generation: greedy, sampling (temperature, top-k, top-p, repetition penalty), beam search and
streaming, for language models and seq2seq models, with a KV cache and batched prompts.

See docs/generation.md for the strategies, the cache, left padding and the sliding window.
"""

from attnlab.generate.beam import beam_search, length_normalised
from attnlab.generate.config import GenerationConfig, GenerationResult, Hypothesis
from attnlab.generate.lm import generate
from attnlab.generate.sampling import (
    apply_temperature,
    greedy,
    make_generator,
    repetition_penalty,
    sample,
    top_k_filter,
    top_p_filter,
)
from attnlab.generate.seq2seq import generate_seq2seq, generate_seq2seq_padded
from attnlab.generate.stream import stream
from attnlab.generate.text import IncrementalDecoder
from attnlab.generate.weights import WEIGHT_MODES, quantize_weights

__all__ = [
    "GenerationConfig",
    "GenerationResult",
    "Hypothesis",
    "IncrementalDecoder",
    "WEIGHT_MODES",
    "apply_temperature",
    "beam_search",
    "generate",
    "generate_seq2seq",
    "generate_seq2seq_padded",
    "greedy",
    "length_normalised",
    "make_generator",
    "quantize_weights",
    "repetition_penalty",
    "sample",
    "stream",
    "top_k_filter",
    "top_p_filter",
]
