"""The notes' mechanisms as small modules: attention, masks, positions, norms, blocks.

Each mechanism has one plain forward, the equation written out beside PyTorch's fused kernel;
named hook points (``attnlab.nn.hooks``) expose its values. The CPU fast paths live apart, in
``attnlab.fast``, which this package never imports.
"""

from attnlab.nn.attention import (
    AttentionOutput,
    Hardmax,
    RowActivation,
    Softmax,
    basic_self_attention,
    hardmax,
    scaled_dot_product_attention,
    soft_cap,
)
from attnlab.nn.blocks import BlockOutput, CausalBlock, DecoderBlock, EncoderBlock
from attnlab.nn.cache import KVCache
from attnlab.nn.dropout import Dropout
from attnlab.nn.feedforward import FeedForward
from attnlab.nn.masks import causal_mask, combine_masks, padding_mask
from attnlab.nn.multihead import CrossAttention, LoopMultiHeadAttention, SelfAttention
from attnlab.nn.norms import LayerNorm, RMSNorm
from attnlab.nn.positional import (
    ALiBiPositions,
    ConcatPositions,
    LearnedPositions,
    NoPositions,
    PositionDescription,
    Positions,
    RotaryPositions,
    SinusoidalPositions,
    make_positions,
    sinusoidal_table,
)
from attnlab.nn.recurrent import (
    AdditiveScore,
    DotScore,
    GeneralScore,
    RecurrentCache,
    RNNCell,
    SimpleRNN,
    attention_step,
)

__all__ = [
    "ALiBiPositions",
    "Hardmax",
    "PositionDescription",
    "Positions",
    "RowActivation",
    "Softmax",
    "make_positions",
    "AdditiveScore",
    "DotScore",
    "GeneralScore",
    "RNNCell",
    "RecurrentCache",
    "SimpleRNN",
    "attention_step",
    "AttentionOutput",
    "BlockOutput",
    "CausalBlock",
    "ConcatPositions",
    "CrossAttention",
    "DecoderBlock",
    "Dropout",
    "EncoderBlock",
    "FeedForward",
    "KVCache",
    "LayerNorm",
    "LearnedPositions",
    "LoopMultiHeadAttention",
    "NoPositions",
    "RMSNorm",
    "RotaryPositions",
    "SelfAttention",
    "SinusoidalPositions",
    "basic_self_attention",
    "causal_mask",
    "combine_masks",
    "hardmax",
    "padding_mask",
    "scaled_dot_product_attention",
    "soft_cap",
    "sinusoidal_table",
]
