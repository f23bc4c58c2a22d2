"""BERT's masked language model (Devlin et al. 2019, §3.1 "Masked LM"; 003 "Encoder-only Models").

Some input tokens are replaced by [MASK]; the encoder sees the whole sequence (no future mask)
and predicts the original token at every position:

    h_{1:n} = TransformerEncoder(w_{1:n}),
    p(w_i | w_{\\i}) = softmax(LN(a(W_t h_i + b_t)) E^T + b)          (BERT's prediction head)

with a = the model's activation (GELU in BERT's configs; ``cfg.activation``) and E the input
embedding matrix (tied, Press & Wolf 2017). It is what most BERT
checkpoints on disk are (``BertForMaskedLM``/``BertForPreTraining``) and what ``attnlab generate``
uses to fill in [MASK] tokens (``attnlab.generate.fill_mask``).

Shapes: B batch, T length, D d_model, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.models.base import ModelOutput
from attnlab.models.encoder import TransformerEncoder
from attnlab.nn.feedforward import ACTIVATIONS
from attnlab.nn.norms import LayerNorm


class MaskedLMHead(nn.Module):
    """logits = LN(a(W_t h + b_t)) E^T + b: (B, T, D) -> (B, T, V). ``decoder`` holds E (tied by
    the model), ``bias`` the per-token output bias b."""

    def __init__(self, d_model: int, vocab_size: int, activation: str, eps: float):
        super().__init__()
        self.activation = activation
        self.transform = nn.Linear(d_model, d_model)  # W_t, b_t
        self.norm = LayerNorm(d_model, eps)
        self.decoder = nn.Linear(d_model, vocab_size, bias=False)  # E
        self.bias = nn.Parameter(torch.zeros(vocab_size))  # b

    def forward(self, h: Tensor) -> Tensor:
        z = self.norm(ACTIVATIONS[self.activation](self.transform(h)))  # (B, T, D)
        return self.decoder(z) + self.bias  # (B, T, V)


class MaskedLM(nn.Module):
    """Encoder + masked-token prediction head: logits (B, T, V) at every position."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.vocab_size, self.max_len = cfg.vocab_size, cfg.max_len
        self.encoder = TransformerEncoder(cfg)
        self.mlm = MaskedLMHead(cfg.d_model, cfg.vocab_size, cfg.activation, cfg.norm_eps)
        nn.init.normal_(self.mlm.transform.weight, 0.0, 0.02)
        nn.init.zeros_(self.mlm.transform.bias)
        if cfg.tie_embeddings:
            self.mlm.decoder.weight = self.encoder.embed.tok_emb.weight
        else:
            nn.init.normal_(self.mlm.decoder.weight, 0.0, 0.02)

    def forward(self, ids: Tensor, **inputs) -> ModelOutput:
        """ids (B, T) -> logits (B, T, V); the keywords (``key_padding_mask`` (B, T) True = real
        token, ``token_types`` (B, T) BERT's sentence A = 0 / B = 1, ``need_weights``) go to
        :meth:`TransformerEncoder.forward` unchanged."""
        hidden, attentions = self.encoder(ids, **inputs)
        return ModelOutput(self.mlm(hidden), attentions)
