"""The simple RNN language model of 000 ("Future masking"): the baseline the Transformer replaced.

    h_{t-1} = sigma(W h_{t-2} + U x_{t-1}),    w_t ~ softmax(h_{t-1} E)

x_t = E_in w_t is the token embedding; the state after reading w_{1:t-1} scores the next token
through the output matrix E (``lm_head``). With ``tie_embeddings`` E is the (transposed) input
embedding, as in DecoderLM. The recurrence cannot look at the future, so no mask is needed (000).

It implements the same :class:`~attnlab.models.base.LanguageModel` interface as
:class:`~attnlab.models.lm.DecoderLM`: logits[:, t] score token t + 1, ``key_padding_mask`` marks
left padding (padding steps leave the state unchanged), and :meth:`new_cache` returns a
:class:`~attnlab.nn.recurrent.RecurrentCache` holding the hidden states, so generation feeds only
the new tokens and the recurrence continues.

Settings read from :class:`~attnlab.config.ModelConfig`: ``vocab_size``, ``d_model`` (embedding and
hidden width), ``n_layers`` (stacked RNN layers; layer 1 is exactly 000's, layer l > 1 reads layer
l - 1's states as its x_t), ``dropout`` (on embeddings, between layers and before the head),
``bias``, ``tie_embeddings``. Transformer-only fields are ignored.

``max_len`` is None: the recurrence has no context window (its memory is whatever fits in h), so
generation never has to crop the input. ``positions`` are accepted for interface compatibility and
ignored: order is implicit in the recurrence.

Hook points (attnlab.inspect): ``X`` the token embeddings x_t (B, T, D); ``rnn.cells.<l>.h`` the
states h_t of layer l, one step at a time (cached as (B, T, D)); a replaced h_t feeds step t + 1.

Shapes: B batch, T new tokens, D d_model (= hidden width H), L n_layers, V vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.models.base import LanguageModel, ModelOutput, check_ids, check_padding_mask
from attnlab.nn.dropout import Dropout
from attnlab.nn.hooks import HookPoint
from attnlab.nn.recurrent import RecurrentCache, SimpleRNN, refuse_cache_dtype


class RNNLM(LanguageModel[RecurrentCache]):
    """Elman RNN LM (000): logits (B, T, V) for the next token at every position."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.vocab_size, self.max_len = cfg.vocab_size, None
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.rnn = SimpleRNN(
            cfg.d_model, cfg.d_model, cfg.n_layers, dropout=cfg.dropout, bias=cfg.bias
        )
        self.drop = Dropout(cfg.dropout)
        self.hook_X = HookPoint()  # x_t = E_in w_t
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # Embedding ~ N(0, 1/D): unit-norm inputs x_t, and O(1) logits when E is tied.
        nn.init.normal_(self.tok_emb.weight, 0.0, 1.0 / math.sqrt(cfg.d_model))
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def forward(
        self,
        ids: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: RecurrentCache | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """ids (B, T) -> ModelOutput(logits (B, T, V), None).

        key_padding_mask (B, T): True = real token; padding steps keep the state unchanged.
        positions: ignored (see module docstring). cache: from :meth:`new_cache`, updated in place.
        The model has no attention, so ``attentions`` is None even with ``need_weights``.
        """
        check_ids(ids, self.vocab_size, "ids")
        check_padding_mask(key_padding_mask, ids)
        h0 = None
        if cache is not None:
            h0 = self._cached_state(cache, ids.size(0))
        x = self.drop(self.hook_X(self.tok_emb(ids)))  # (B, T, D)
        out, h_n = self.rnn(x, h0, key_padding_mask)  # (B, T, D), (L, B, D)
        if cache is not None:
            cache.state = (h_n,)
            cache.length += ids.size(1)
        logits = self.lm_head(self.drop(out))  # (B, T, V)
        return ModelOutput(logits, None)

    def new_cache(
        self, batch_size: int, max_len: int | None = None, dtype: str | None = None
    ) -> RecurrentCache:
        """Zero initial state h_0 for ``batch_size`` rows; ``max_len`` is accepted and unused,
        ``dtype`` must be None (no KV cache)."""
        refuse_cache_dtype("rnn_lm", dtype)
        param = self.lm_head.weight
        h0 = torch.zeros(
            self.cfg.n_layers, batch_size, self.cfg.d_model, dtype=param.dtype, device=param.device
        )  # (L, B, D)
        return RecurrentCache((h0,))

    def _cached_state(self, cache: RecurrentCache, batch_size: int) -> Tensor:
        if not isinstance(cache, RecurrentCache) or len(cache.state) != 1:
            raise TypeError(
                f"RNNLM needs the cache from its own new_cache(), got {type(cache).__name__}"
            )
        h0 = cache.state[0]
        expected = (self.cfg.n_layers, batch_size, self.cfg.d_model)
        if h0.shape != expected:
            raise ValueError(
                f"cache holds a state of shape {tuple(h0.shape)} but this call needs "
                f"{expected} (L, B, D); build the cache with new_cache({batch_size})"
            )
        return h0
