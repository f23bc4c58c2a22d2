"""The decoder-only Transformer language model (000 "Transformer Decoder"; GPT-2).

w_t ~ softmax(f(w_{1:t-1})): embed, add positions, N causal blocks, a final norm, then the
"Linear + Softmax" head of 003 (the softmax is left to the loss / the sampler; we return logits).
With ``tie_embeddings`` the head reuses the embedding matrix E (Press & Wolf 2017); with
``final_logit_softcap`` c the logits are soft-capped, z -> c tanh(z / c) (Gemma 2).

Shapes: B batch, T new tokens, S = cached + new tokens, D d_model, V vocabulary, H heads.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.models.base import (
    LanguageModel,
    LayerAttention,
    ModelOutput,
    check_ids,
    check_padding_mask,
    check_positions,
)
from attnlab.models.cache import TransformerCache
from attnlab.models.layers import Embeddings, init_weights, make_causal_block, make_final_norm
from attnlab.nn.attention import soft_cap
from attnlab.nn.hooks import HookPoint
from attnlab.nn.masks import padding_mask
from attnlab.nn.positional import default_positions


class CausalTransformer(nn.Module):
    """The decoder-only trunk (000 "Transformer Decoder"): embed, add positions, N causal blocks,
    a final norm -> h (B, T, D), then the subclass's :meth:`read_out`. :class:`DecoderLM` reads
    the next token at every position of h, :class:`~attnlab.models.decoder_classifier.
    DecoderClassifier` a class at each row's last real position."""

    max_len: int | None  # the context window (always set: cfg.max_len)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.vocab_size, self.max_len = cfg.vocab_size, cfg.max_len
        self.embed = Embeddings(cfg.vocab_size, cfg)
        self.blocks = nn.ModuleList(
            make_causal_block(cfg, self.embed.pos_enc, i) for i in range(cfg.n_layers)
        )
        self.final_norm = make_final_norm(cfg)
        self.hook_final = HookPoint()  # the final norm's output, (B, T, D)

    def forward(
        self,
        ids: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: TransformerCache | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """ids (B, T) -> read_out(h): logits (B, T, V) of an LM, (B, C) of a classifier.

        key_padding_mask (B, T): True = real token (left padding in batched generation).
        positions (T,) or (B, T): absolute positions (default: cache length + 0..T-1).
        cache: from ``new_cache``; updated in place, so the next call passes only new tokens.
        """
        offset = cache.length if cache is not None else 0
        check_ids(ids, self.vocab_size, "ids")
        check_padding_mask(key_padding_mask, ids)
        check_positions(positions, ids)
        if offset + ids.size(1) > self.cfg.max_len:
            raise ValueError(
                f"sequence of length {offset + ids.size(1)} exceeds the model's context window "
                f"max_len={self.cfg.max_len}; crop the input to its last {self.cfg.max_len} tokens"
            )
        if positions is None:
            positions = default_positions(ids.size(1), offset, ids.device)
        x = self.embed(ids, positions)  # (B, T, D)
        if cache is not None:
            mask = cache.record_keys(key_padding_mask, ids.size(1))  # (B, 1, 1, S) or None
        else:
            mask = padding_mask(key_padding_mask)  # (B, 1, 1, T) or None
        weights = []
        for i, block in enumerate(self.blocks):
            layer_cache = cache.layers[i] if cache is not None else None
            x, w, _ = block(
                x, mask, positions=positions, cache=layer_cache, need_weights=need_weights
            )
            weights.append(LayerAttention(w, None))
        hidden = self.hook_final(self.final_norm(x))  # (B, T, D)
        logits = self.read_out(hidden, key_padding_mask)
        return ModelOutput(logits, tuple(weights) if need_weights else None)

    def read_out(self, hidden: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """The head on h (B, T, D); each subclass has its own."""
        raise NotImplementedError


class DecoderLM(CausalTransformer, LanguageModel[TransformerCache]):
    """GPT-like decoder-only LM: logits (B, T, V) for the next token at every position."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        init_weights(self, cfg.n_layers)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.tok_emb.weight

    def read_out(self, hidden: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """logits = h W_head: (B, T, D) -> (B, T, V), soft-capped c tanh(z / c) when
        ``final_logit_softcap`` is c (Gemma 2)."""
        return soft_cap(self.lm_head(hidden), self.cfg.final_logit_softcap)

    def new_cache(
        self, batch_size: int, max_len: int | None = None, dtype: str | None = None
    ) -> TransformerCache:
        """Empty KV buffers for ``max_len`` positions (default: the context window), in ``dtype``
        ("fp32", "bf16") or the model's compute dtype."""
        max_len = max_len or self.cfg.max_len
        return TransformerCache.empty(
            self.cfg, len(self.blocks), batch_size, max_len, self.lm_head.weight, dtype
        )
