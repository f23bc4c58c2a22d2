"""A classifier on a decoder-only Transformer (GPT-2, Llama, Qwen, Gemma): the class is read from
the last real token, the one position whose causal attention has seen the whole text.

    h = CausalTransformer(w_{1:T})                  (B, T, D), after the final norm
    p(c | w_{1:T}) = softmax(W_score h_last),       last = the rightmost real token of each row

This is Hugging Face's ``...ForSequenceClassification`` for decoders
(``GPT2ForSequenceClassification``, ``LlamaForSequenceClassification``): a bias-free linear
``score`` on the final hidden state of the last non-padding token; attnlab names it ``head``.
The causal mask is kept, so a right-padded row's real tokens never see its padding, and the last
real token is found from the padding mask (Hugging Face finds it from ``pad_token_id``: the same
position unless a text's own last token is the pad id).

Shapes: B batch, T length, D d_model, C classes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.models.base import Classifier, check_not_all_padding
from attnlab.models.layers import init_weights
from attnlab.models.lm import CausalTransformer


class DecoderClassifier(CausalTransformer, Classifier):
    """Decoder-only classifier: logits (B, C) = W_score h_last (module docstring)."""

    pooling = "last"  # where the class is read (EncoderClassifier: "cls" or "mean")

    def __init__(self, cfg: ModelConfig):
        if cfg.n_classes is None:
            raise ValueError(
                f"a DecoderClassifier needs ModelConfig.n_classes >= 2 (kind="
                f"'decoder_classifier'), got kind={cfg.kind!r} with n_classes=None"
            )
        super().__init__(cfg)
        self.n_classes = cfg.n_classes
        self.head = nn.Linear(cfg.d_model, cfg.n_classes, bias=False)  # W_score
        init_weights(self, cfg.n_layers)

    def read_out(self, hidden: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """logits = W_score h_last: (B, T, D) -> (B, C); ``forward`` is the trunk's (ids (B, T),
        key_padding_mask (B, T) True = real token, default all real)."""
        b, t, _ = hidden.shape
        last = last_real_position(key_padding_mask, b, t, hidden.device)  # (B,)
        pooled = hidden[torch.arange(b, device=hidden.device), last]  # (B, D)
        return self.head(pooled)  # (B, C)


def last_real_position(
    key_padding_mask: Tensor | None, b: int, t: int, device: torch.device | None = None
) -> Tensor:
    """The index of the rightmost real token of each of ``b`` rows of length ``t``, (B,):
    argmax_i i * mask_i (the rule of Hugging Face's classifiers, so left and right padding both
    work); t - 1 without a mask."""
    if key_padding_mask is None:
        return torch.full((b,), t - 1, dtype=torch.long, device=device)
    check_not_all_padding(key_padding_mask)
    positions = torch.arange(t, device=key_padding_mask.device)  # (T,)
    return (positions * key_padding_mask).argmax(dim=-1)  # (B,)
