"""The Transformer encoder-decoder (Vaswani et al. 2017; 000 "Transformer Encoder-Decoder"; 003).

h^(x) = TransformerEncoder(x_{1:n}); the decoder runs masked self-attention over the shifted-right
target y_{<l} ("teacher forcing": tgt_in = [<bos>, y_1, ..., y_L] predicts tgt_out = [y_1, ..., y_L,
<eos>], attnlab.data.batching), cross-attention from its
states to h^(x), and a feed-forward net, then a linear head over the target vocabulary.

Shapes: B batch, S source length, T target length, D d_model, V target vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.models.base import (
    Encoded,
    LayerAttention,
    ModelOutput,
    Seq2SeqModel,
    check_ids,
    check_padding_mask,
    real_positions,
)
from attnlab.models.cache import TransformerCache
from attnlab.models.encoder import TransformerEncoder
from attnlab.models.layers import Embeddings, init_weights, make_decoder_block, make_final_norm
from attnlab.nn.blocks import DecoderBlock
from attnlab.nn.hooks import HookPoint
from attnlab.nn.masks import padding_mask
from attnlab.nn.positional import default_positions


class TransformerEncoderDecoder(Seq2SeqModel[TransformerCache]):
    """Encoder-decoder Transformer with source and target padding masks."""

    max_len: int  # the longest source and target, always bounded

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.vocab_size, self.tgt_vocab_size = cfg.vocab_size, cfg.target_vocab_size
        self.max_len = cfg.max_len
        self.encoder = TransformerEncoder(cfg)
        self.tgt_embed = Embeddings(self.tgt_vocab_size, cfg)
        self.blocks = nn.ModuleList(
            make_decoder_block(cfg, self.tgt_embed.pos_enc) for _ in range(cfg.decoder_layers)
        )
        self.final_norm = make_final_norm(cfg)
        self.hook_final = HookPoint()  # the decoder's final norm output, (B, T, D)
        self.lm_head = nn.Linear(cfg.d_model, self.tgt_vocab_size, bias=False)
        init_weights(self, cfg.n_layers + cfg.decoder_layers)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tgt_embed.tok_emb.weight

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Encoded:
        """src (B, S) -> memory (B, S, D). src_mask (B, S): True = real token."""
        check_ids(src, self.vocab_size, "source ids", self.max_len)
        check_padding_mask(src_mask, src, "src_mask")
        if src_mask is None:
            src_mask = torch.ones_like(src, dtype=torch.bool)
        memory = self.encoder(src, key_padding_mask=src_mask).hidden
        return Encoded(memory, src_mask, src)

    def decode(
        self,
        tgt_in: Tensor,
        encoded: Encoded,
        *,
        tgt_mask: Tensor | None = None,
        cache: TransformerCache | None = None,
        need_weights: bool = False,
        real_only: bool = False,
    ) -> ModelOutput:
        """tgt_in (B, T) shifted-right target ids -> logits (B, T, V), or (N, V) at the real
        positions with ``real_only``.

        tgt_mask (B, T) True = real token. The future mask is always applied. With a ``cache``
        only the new target tokens are given and cross-attention keys/values are reused.
        """
        offset = cache.length if cache is not None else 0
        self.check_target(tgt_in, tgt_mask, offset)
        positions = default_positions(tgt_in.size(1), offset, tgt_in.device)
        x = self.tgt_embed(tgt_in, positions)  # (B, T, D)
        memory_kv = None
        if cache is not None:
            self_mask = cache.record_keys(tgt_mask, tgt_in.size(1))  # (B, 1, 1, S) or None
            if cache.memory_kv is None:  # K, V of the memory, once per source
                blocks = cast("Iterable[DecoderBlock]", self.blocks)
                cache.memory_kv = [b.cross_attn.project_memory(encoded.memory) for b in blocks]
            memory_kv, src_mask = cache.memory_kv, cache.src_mask
        else:
            self_mask, src_mask = padding_mask(tgt_mask), encoded.src_mask  # (B, 1, 1, T)
        cross_mask = padding_mask(src_mask)  # (B, 1, 1, S)
        weights = []
        for i, block in enumerate(self.blocks):
            x, sw, cw = block(
                x,
                encoded.memory,
                self_mask=self_mask,
                cross_mask=cross_mask,
                positions=positions,
                cache=cache.layers[i] if cache is not None else None,
                memory_kv=memory_kv[i] if memory_kv is not None else None,
                need_weights=need_weights,
            )
            weights.append(LayerAttention(sw, cw))
        h = self.hook_final(self.final_norm(x))  # (B, T, D)
        if real_only:
            h = real_positions(h, tgt_mask)  # (N, D): the head never runs on padding
        logits = self.lm_head(h)  # (B, T, V), or (N, V)
        return ModelOutput(logits, tuple(weights) if need_weights else None)

    def check_target(self, tgt_in: Tensor, tgt_mask: Tensor | None, offset: int) -> None:
        """Target ids (B, T) and their mask, after ``offset`` cached positions."""
        check_ids(tgt_in, self.tgt_vocab_size, "target ids")
        check_padding_mask(tgt_mask, tgt_in, "tgt_mask")
        if offset + tgt_in.size(1) > self.max_len:
            raise ValueError(
                f"target length {offset + tgt_in.size(1)} exceeds max_len={self.max_len}"
            )

    def new_cache(
        self, encoded: Encoded, max_len: int | None = None, dtype: str | None = None
    ) -> TransformerCache:
        """The decoder's self-attention KV buffers in ``dtype`` ("fp32", "bf16") or the compute
        dtype; the cross-attention keys/values of the source stay in the compute dtype."""
        max_len = max_len or self.max_len
        b = encoded.memory.size(0)
        weight = self.lm_head.weight
        cache = TransformerCache.empty(self.cfg, len(self.blocks), b, max_len, weight, dtype)
        cache.src_mask = encoded.src_mask
        return cache
