"""LSTM encoder-decoder (Sutskever et al. 2014) and its attention decoder (Bahdanau et al. 2015).

004 eq. 1-3, the plain model:
    h^e_t, c^e_t = LSTM^enc(x_t, h^e_{t-1}, c^e_{t-1})                       (eq. 2)
    v = transform(h^e_T) initialises h^d_0, c^d_0                             (eq. 1)
    h^d_l, c^d_l = LSTM^dec(y_{l-1}, h^d_{l-1}, c^d_{l-1}),  p(y_l | h^d_l)   (eq. 3)
004 eq. 4-8, with ``rnn_attention`` set ("additive" = Bahdanau; "dot"/"general" = Luong):
    f_t = T_theta(h^e_t)                     (eq. 5, a linear feature map, ``feature``)
    e_lt = a(h^d_{l-1}, f_t)                 (eq. 6, see attnlab.nn.recurrent)
    alpha_l = softmax(e_l)                   (eq. 7, over real source positions only)
    v_l = sum_t alpha_lt f_t                 (eq. 8)
    h^d_l, c^d_l = LSTM^dec([y_{l-1}; v_l], h^d_{l-1}, c^d_{l-1}),  p(y_l | h^d_l)   (eq. 4)

Layout and choices (ModelConfig fields in brackets):
  * Encoder: ``torch.nn.LSTM`` with [n_layers] layers of width [d_model], optionally
    [bidirectional] (h^e_t = [forward; backward], width E = 2 D). [reverse_source] feeds x_{T:1}
    (004's trick); only the real tokens of each row are reversed, wherever the padding sits.
  * ``encode`` returns the encoder states h^e_t of the top layer in *source order* as ``memory``
    (B, S, E), zero at padding, so attention weights line up with the source as written.
  * v is the top layer's last state in reading order (both directions' last states when
    bidirectional). Every decoder layer starts from h^d_0 = tanh(W_h v + b_h), c^d_0 = W_c v + b_c
    (Bahdanau et al., App. A.2.2, initialise s_0 = tanh(W_s h_1) the same way). The map is learned
    even when widths agree, since the note asks for "transforming" h^e_T.
  * The attention decoder also starts from v; the projected keys (U f_t, or W f_t for "general")
    are computed once per source: once per ``decode`` call without a cache, once in
    ``new_cache`` with one. Each step then scores with the top layer's h^d_{l-1}.
  * Decoder: ``torch.nn.LSTM`` with [n_decoder_layers] layers; logits = E_out h^d_l, the note's
    p(y_l | h^d_l) (v_l reaches the output through the LSTM input, not by concatenation).
    [tie_embeddings] ties E_out to the target embedding. [dropout] acts on embeddings, between
    LSTM layers and before the output layer. [d_attn] is the additive score width A.
  * ``max_len`` is None: neither side has a length limit.

Hook points (attnlab.inspect; names in brackets): the encoder states h^e_t in source order
[h_enc] (B, S, E); the summary v [v] (B, E); the decoder's top states h^d_l [h_dec] (B, T, D).
With attention also: the features f_t [f] (B, S, D); the score's projected keys (U f_t, W f_t or
f_t) [keys] (B, S, A or D); and per decoder step the energies e_l [e] (before the source mask),
the weights alpha_l [alpha] and the context v_l [v_l], cached stacked as (B, T, S), (B, T, S),
(B, T, D). A replaced value flows on: v sets the initial state, f the keys and contexts, alpha_l
the context v_l, v_l the next decoder state.

Shapes: B batch, S source length, T target length, D d_model (= LSTM width), E = D or 2 D encoder
state width, A d_attn, L decoder layers, V target vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.models.base import (
    Encoded,
    LayerAttention,
    ModelOutput,
    Seq2SeqModel,
    check_ids,
    check_not_all_padding,
    check_padding_mask,
    real_positions,
)
from attnlab.nn.dropout import Dropout
from attnlab.nn.hooks import HookPoint
from attnlab.nn.masks import is_right_padded
from attnlab.nn.recurrent import (
    AttentionPoints,
    RecurrentCache,
    StepHookPoint,
    attention_step,
    lstm_right_padded,
    make_score,
    refuse_cache_dtype,
)

State = tuple[Tensor, Tensor]  # (h, c), each (L, B, D)


def source_order(mask: Tensor, reverse: bool) -> Tensor:
    """order[b, i] = the source position the encoder reads at step i: the real tokens of row b in
    order (or reversed, x_{T:1}), then its padding positions. mask (B, S) -> (B, S) int64."""
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # (B, S) real first
    if reverse:
        lengths = mask.sum(dim=1, keepdim=True)  # (B, 1)
        step = torch.arange(mask.size(1), device=mask.device)[None, :]  # (1, S)
        order = order.gather(1, torch.where(step < lengths, lengths - 1 - step, step))
    return order


class LSTMSeq2Seq(Seq2SeqModel[RecurrentCache]):
    """Sutskever LSTM encoder-decoder; with ``rnn_attention`` the Bahdanau/Luong decoder."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.vocab_size, self.tgt_vocab_size = cfg.vocab_size, cfg.target_vocab_size
        self.max_len = None
        d, n_dec = cfg.d_model, cfg.decoder_layers
        self.d_memory = 2 * d if cfg.bidirectional else d  # E
        self.attention = cfg.rnn_attention
        self.src_emb = nn.Embedding(cfg.vocab_size, d)
        self.tgt_emb = nn.Embedding(self.tgt_vocab_size, d)
        self.encoder = nn.LSTM(
            d,
            d,
            cfg.n_layers,
            batch_first=True,
            dropout=cfg.dropout if cfg.n_layers > 1 else 0.0,
            bidirectional=cfg.bidirectional,
        )
        self.init_h = nn.Linear(self.d_memory, n_dec * d)  # v -> h^d_0 of every layer
        self.init_c = nn.Linear(self.d_memory, n_dec * d)  # v -> c^d_0 of every layer
        self.hook_h_enc = HookPoint()  # h^e_t (eq. 2), source order
        self.hook_v = HookPoint()  # v, the summary (eq. 1)
        self.points = None
        if self.attention != "none":
            self.feature = nn.Linear(self.d_memory, d)  # T_theta (eq. 5)
            self.score = make_score(self.attention, d, d, cfg.attn_dim)  # a(h, f) (eq. 6)
            self.hook_f = HookPoint()  # f_t (eq. 5)
            self.hook_keys = HookPoint()  # the score's source half, e.g. U f_t
            self.hook_e = StepHookPoint()  # e_l (eq. 6)
            self.hook_alpha = StepHookPoint()  # alpha_l (eq. 7)
            self.hook_v_l = StepHookPoint()  # v_l (eq. 8)
            self.points = AttentionPoints(self.hook_e, self.hook_alpha, self.hook_v_l)
        self.hook_h_dec = HookPoint()  # h^d_l, the top decoder states (eq. 3-4)
        d_in = 2 * d if self.attention != "none" else d  # [y_{l-1}; v_l] or y_{l-1}
        self.decoder = nn.LSTM(
            d_in, d, n_dec, batch_first=True, dropout=cfg.dropout if n_dec > 1 else 0.0
        )
        self.drop = Dropout(cfg.dropout)
        self.lm_head = nn.Linear(d, self.tgt_vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tgt_emb.weight

    def _init_weights(self) -> None:
        """Embeddings ~ N(0, 1/D) (unit-norm inputs); LSTMs keep torch's Uniform(+-1/sqrt(D))
        but start with forget-gate bias 1 (Jozefowicz et al. 2015), so early gradients flow."""
        for emb in (self.src_emb, self.tgt_emb):
            nn.init.normal_(emb.weight, 0.0, 1.0 / math.sqrt(self.cfg.d_model))
        d = self.cfg.d_model
        for lstm in (self.encoder, self.decoder):
            for name, p in lstm.named_parameters():
                if name.startswith("bias_ih"):
                    with torch.no_grad():
                        p[d : 2 * d].fill_(1.0)  # gate order i, f, g, o
                elif name.startswith("bias_hh"):
                    with torch.no_grad():
                        p[d : 2 * d].fill_(0.0)

    # ----------------------------------------------------------------------------- encoder
    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Encoded:
        """src (B, S) ids, src_mask (B, S) True = real token -> Encoded(memory (B, S, E), ...)."""
        check_ids(src, self.vocab_size, "source ids")
        check_padding_mask(src_mask, src, "src_mask")
        if src_mask is None:
            src_mask = torch.ones_like(src, dtype=torch.bool)
        check_not_all_padding(src_mask, "src_mask")
        lengths = src_mask.sum(dim=1)  # (B,)
        full = bool(src_mask.all())
        if full and not self.cfg.reverse_source:
            out, _ = self.encoder(self.drop(self.src_emb(src)))  # (B, S, E)
            return Encoded(self.hook_h_enc(out), src_mask, src)
        order = source_order(src_mask, self.cfg.reverse_source)  # (B, S) step -> position
        x = self.drop(self.src_emb(src.gather(1, order)))  # (B, S, D) in reading order
        if full:
            out, _ = self.encoder(x)  # (B, S, E)
        else:  # each row runs for its own length: padding never touches a real step's state
            out = lstm_right_padded(self.encoder, x, lengths)  # (B, S, E), zero tail
        index = order[:, :, None].expand(-1, -1, out.size(-1))  # (B, S, E)
        memory = torch.zeros_like(out).scatter(1, index, out)  # (B, S, E) in source order
        return Encoded(self.hook_h_enc(memory), src_mask, src)

    def global_representation(self, memory: Tensor, src_mask: Tensor) -> Tensor:
        """v: the top encoder layer's state after its last step in reading order (each direction's
        own last step when bidirectional). memory (B, S, E), src_mask (B, S) -> (B, E)."""
        d, s = self.cfg.d_model, src_mask.size(1)
        pos = torch.arange(s, device=src_mask.device)[None, :]  # (1, S)
        first = torch.where(src_mask, pos, s).amin(dim=1)  # (B,) first real position
        last = torch.where(src_mask, pos, -1).amax(dim=1)  # (B,) last real position
        fwd_end, bwd_end = (first, last) if self.cfg.reverse_source else (last, first)
        rows = torch.arange(memory.size(0), device=memory.device)
        v = memory[rows, fwd_end, :d]  # (B, D)
        if self.cfg.bidirectional:
            v = torch.cat([v, memory[rows, bwd_end, d:]], dim=-1)  # (B, 2D)
        return v

    def _prepare_source(self, encoded: Encoded) -> tuple[dict[str, Tensor], tuple[Tensor, Tensor]]:
        """Everything the decoder needs from a source, computed once: the initial state (h^d_0,
        c^d_0) from v, and (with attention) the features f_t and their projected keys."""
        memory, mask = self._check_encoded(encoded)
        b, d, n_dec = memory.size(0), self.cfg.d_model, self.cfg.decoder_layers
        v = self.hook_v(self.global_representation(memory, mask))  # (B, E)
        h0 = torch.tanh(self.init_h(v)).view(b, n_dec, d).transpose(0, 1).contiguous()  # (L,B,D)
        c0 = self.init_c(v).view(b, n_dec, d).transpose(0, 1).contiguous()  # (L, B, D)
        source = {"mask": mask}
        if self.attention != "none":
            features = self.hook_f(self.feature(memory))  # (B, S, D) f_t = T_theta(h^e_t)
            source["features"] = features
            source["keys"] = self.hook_keys(self.score.project_keys(features))  # (B, S, A or D)
        return source, (h0, c0)

    def _check_encoded(self, encoded: Encoded) -> tuple[Tensor, Tensor]:
        memory, mask = encoded.memory, encoded.src_mask
        if memory.dim() != 3 or memory.size(-1) != self.d_memory:
            raise ValueError(
                f"encoded memory has shape {tuple(memory.shape)} but this decoder expects "
                f"(B, S, {self.d_memory}) encoder states (d_model={self.cfg.d_model}, "
                f"bidirectional={self.cfg.bidirectional}); encode the source with this model"
            )
        if mask is None or mask.dtype != torch.bool or mask.shape != memory.shape[:2]:
            raise ValueError(
                f"encoded src_mask must be bool (B, S) = {tuple(memory.shape[:2])}, "
                f"got {None if mask is None else (mask.dtype, tuple(mask.shape))}"
            )
        check_not_all_padding(mask, "src_mask")
        return memory, mask

    # ----------------------------------------------------------------------------- decoder
    def decode(
        self,
        tgt_in: Tensor,
        encoded: Encoded,
        *,
        tgt_mask: Tensor | None = None,
        cache: RecurrentCache | None = None,
        need_weights: bool = False,
        real_only: bool = False,
    ) -> ModelOutput:
        """tgt_in (B, T) shifted-right target ids -> logits (B, T, V), or (N, V) at the real
        positions with ``real_only`` (the head skips padding).

        tgt_mask (B, T): True = real token; step by step, padding steps leave the decoder state
        unchanged (the one-call path, for right padding without attention or cache, runs through
        the padding instead: the real positions are the same, only the padding's outputs differ).
        cache: from :meth:`new_cache`; holds the state, so pass only new tokens; updated in place.
        need_weights: attentions = (LayerAttention(None, alpha (B, 1, T, S)),), alpha_l of every
        step (eq. 7); None for the plain model, which has no attention.
        """
        check_ids(tgt_in, self.tgt_vocab_size, "target ids")
        check_padding_mask(tgt_mask, tgt_in, "tgt_mask")
        if cache is None:
            source, state = self._prepare_source(encoded)
        else:
            source, state = self._cached(cache)
        if source["mask"].size(0) != tgt_in.size(0):
            raise ValueError(
                f"target batch has {tgt_in.size(0)} rows but the encoded source "
                f"has {source['mask'].size(0)}"
            )
        real = tgt_mask
        if tgt_mask is not None and bool(tgt_mask.all()):
            tgt_mask = None
        y = self.drop(self.tgt_emb(tgt_in))  # (B, T, D)
        weights = None
        if self.attention == "none" and (
            tgt_mask is None or (cache is None and is_right_padded(tgt_mask))
        ):
            out, state = self.decoder(y, state)  # (B, T, D): eq. 3 for all steps in one call
        else:
            out, state, weights = self._decode_steps(y, state, source, tgt_mask)
        if cache is not None:
            cache.state = state
            cache.length += tgt_in.size(1)
        out = self.hook_h_dec(out)  # (B, T, D) h^d_l
        if real_only:
            out = real_positions(out, real)  # (N, D)
        logits = self.lm_head(self.drop(out))  # (B, T, V), or (N, V)
        attentions = None
        if need_weights and weights is not None:
            attentions = (LayerAttention(None, weights[:, None]),)  # (B, 1, T, S)
        return ModelOutput(logits, attentions)

    def _decode_steps(
        self, y: Tensor, state: State, source: dict[str, Tensor], tgt_mask: Tensor | None
    ) -> tuple[Tensor, State, Tensor | None]:
        """The decoder one step at a time (eq. 4-8): y (B, T, D) -> top states (B, T, D), final
        (h, c) each (L, B, D), and alpha (B, T, S) when attending."""
        h, c = state
        outs, alphas = [], []
        for step in range(y.size(1)):
            x = y[:, step]  # (B, D) embedding of y_{l-1}
            if self.attention != "none":
                context, alpha = attention_step(
                    h[-1],
                    source["features"],
                    source["keys"],
                    source["mask"],
                    self.score,
                    self.points,
                )  # (B, D), (B, S)
                x = torch.cat([x, context], dim=-1)  # (B, 2D) = [y_{l-1}; v_l]
                assert alpha is not None  # an attention step always returns alpha_l
                alphas.append(alpha)
            _, (h_new, c_new) = self.decoder(x[:, None], (h, c))  # each (L, B, D)
            if tgt_mask is None:
                h, c = h_new, c_new
            else:
                keep = tgt_mask[None, :, step, None]  # (1, B, 1)
                h, c = torch.where(keep, h_new, h), torch.where(keep, c_new, c)
            outs.append(h[-1])
        weights = torch.stack(alphas, dim=1) if alphas else None  # (B, T, S)
        return torch.stack(outs, dim=1), (h, c), weights  # (B, T, D)

    def new_cache(
        self, encoded: Encoded, max_len: int | None = None, dtype: str | None = None
    ) -> RecurrentCache:
        """Decoding state for ``encoded``: (h^d_0, c^d_0) and the per-source tensors (mask,
        features, projected keys), reordered together by ``reorder``. ``max_len`` is unused;
        ``dtype`` must be None (no KV cache)."""
        refuse_cache_dtype("lstm_seq2seq", dtype)
        source, state = self._prepare_source(encoded)
        return RecurrentCache(state, source)

    def _cached(self, cache: RecurrentCache) -> tuple[dict[str, Tensor], tuple[Tensor, Tensor]]:
        if not isinstance(cache, RecurrentCache) or len(cache.state) != 2:
            raise TypeError(
                f"LSTMSeq2Seq needs the cache from its own new_cache(), got {type(cache).__name__}"
            )
        h, c = cache.state
        expected = (self.cfg.decoder_layers, h.size(1), self.cfg.d_model)
        if h.shape != expected or c.shape != expected:
            raise ValueError(
                f"cache holds decoder states {tuple(h.shape)}, {tuple(c.shape)} but "
                f"this decoder needs {expected} (L, B, D); use this model's "
                "new_cache()"
            )
        return cache.source, (h, c)
