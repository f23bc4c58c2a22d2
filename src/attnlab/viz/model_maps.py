"""Collect a model's attention weights for one input, and turn them into figures.

Models return weights only when asked (``need_weights=True``) as ``ModelOutput.attentions``: one
``LayerAttention(self_attn, cross_attn)`` per layer, each (B, H, T, S) or None. This module stacks
them per kind for one batch row. It talks to models only through the three interfaces of
``attnlab.models.base``; the one extra, an encoder-decoder's encoder self-attention, is read from
its ``encoder`` when that is a :class:`TransformerEncoder`.

Shapes: B batch, L layers, H heads, T target/query length, S source length.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from matplotlib.figure import Figure
from torch import Tensor

from attnlab.errors import ConfigValueError
from attnlab.generate.config import GenerationConfig
from attnlab.generate.seq2seq import generate_seq2seq
from attnlab.models.base import Classifier, LanguageModel, LayerAttention, Seq2SeqModel
from attnlab.models.encoder import TransformerEncoder
from attnlab.models.masked_lm import MaskedLM
from attnlab.viz.attention import plot_alignment, plot_attention


class AttentionMaps(NamedTuple):
    """Attention weights of one example, stacked over layers; None where the model has none."""

    self_attn: Tensor | None  # (L, H, T, T) LM / classifier / decoder self-attention
    cross_attn: Tensor | None  # (L, H, T, S) decoder queries over source keys
    encoder_attn: Tensor | None  # (L, H, S, S) encoder self-attention of an encoder-decoder


def _as_ids(ids: Any, device: torch.device, name: str) -> Tensor:
    ids = torch.as_tensor(ids, dtype=torch.long, device=device)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)  # (1, T)
    if ids.dim() != 2:
        raise ValueError(f"{name} must be (T,) or (B, T) token ids, got shape {tuple(ids.shape)}")
    return ids


def _stack(layers: tuple[LayerAttention, ...] | None, field: str, row: int) -> Tensor | None:
    found = [getattr(la, field) for la in layers or ()]
    found = [w[row] for w in found if w is not None]  # (H, T, S) each
    return torch.stack(found).float().cpu() if found else None  # (L, H, T, S)


@torch.no_grad()
def attention_maps(model: Any, ids: Any, *, target: Any = None, row: int = 0) -> AttentionMaps:
    """Run ``model`` once with ``need_weights=True`` and return the weights of batch row ``row``.

    ids: (T,) or (B, T) token ids (the source, for a seq2seq model). target: the decoder input
    (B, T) starting with <bos>, required for seq2seq models and rejected for the others.
    The model runs in eval mode (no dropout) and its training flag is restored afterwards.
    """
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    ids = _as_ids(ids, device, "ids")
    if not 0 <= row < ids.size(0):
        raise ValueError(f"row={row} is outside the batch of {ids.size(0)}")
    was_training = model.training
    model.eval()
    try:
        encoder_layers = None
        if isinstance(model, Seq2SeqModel):
            if target is None:
                raise ValueError(
                    "a sequence-to-sequence model needs target ids: the decoder "
                    "input, starting with <bos>"
                )
            encoded = model.encode(ids)
            out = model.decode(_as_ids(target, device, "target"), encoded, need_weights=True)
            encoder = getattr(model, "encoder", None)
            if isinstance(encoder, TransformerEncoder):
                encoder_layers = encoder(
                    ids, key_padding_mask=encoded.src_mask, need_weights=True
                ).attentions
        elif isinstance(model, (LanguageModel, Classifier, TransformerEncoder, MaskedLM)):
            if target is not None:
                raise ValueError(f"target ids apply to seq2seq models, not {type(model).__name__}")
            out = model(ids, need_weights=True)
        else:
            raise TypeError(
                f"cannot collect attention from a {type(model).__name__}; expected "
                "an attnlab language model, seq2seq model or classifier"
            )
    finally:
        model.train(was_training)
    maps = AttentionMaps(
        _stack(out.attentions, "self_attn", row),
        _stack(out.attentions, "cross_attn", row),
        _stack(encoder_layers, "self_attn", row),
    )
    if all(m is None for m in maps):
        raise ValueError(
            f"{type(model).__name__} computes no attention weights to plot "
            "(a recurrent model without attention has none)"
        )
    return maps


def model_attention_figures(
    model: Any, tokenizer: Any, text: str, target: str | None = None
) -> dict[str, Figure]:
    """Attention figures for one input text, keyed by the file name to save them under.

    Language models and classifiers: ``self_attention.png``. Seq2seq models: ``cross_attention
    .png`` (rows labelled with the token each decoder step predicts, y_1..y_L <eos>), plus
    ``decoder_self_attention.png``, ``encoder_self_attention.png`` and, for one-head attention
    such as Bahdanau's, ``alignment.png``. Without ``target`` a seq2seq model decodes greedily.
    Texts are encoded without <bos>/<eos> for the source, as ``attnlab.data.encode_pairs`` does.
    """
    ids = tokenizer.encode(text)
    if not ids:
        raise ConfigValueError(
            "the input text encodes to no tokens; give a non-empty text", fields=("text",)
        )
    limit = getattr(model, "max_len", None)
    if limit is not None and len(ids) > limit:
        raise ValueError(
            f"the input has {len(ids)} tokens but the model's window is "
            f"max_len={limit}; shorten the text"
        )
    label = [tokenizer.token_to_str(i) for i in ids]
    if not isinstance(model, Seq2SeqModel):
        if target is not None:
            raise ValueError(f"a target text applies to seq2seq models, not {type(model).__name__}")
        maps = attention_maps(model, ids)
        title = f"{type(model).__name__} self-attention"
        return {"self_attention.png": plot_attention(maps.self_attn, label, label, title)}
    tgt = tokenizer.encode(target) if target is not None else _greedy(model, tokenizer, ids)
    tgt_in, tgt_out = [tokenizer.bos_id, *tgt], [*tgt, tokenizer.eos_id]
    maps = attention_maps(model, ids, target=tgt_in)
    ins = [tokenizer.token_to_str(i) for i in tgt_in]
    outs = [tokenizer.token_to_str(i) for i in tgt_out]
    figures = {}
    if maps.cross_attn is not None:
        figures["cross_attention.png"] = plot_attention(
            maps.cross_attn, outs, label, "cross-attention: target step over source"
        )
        if maps.cross_attn.shape[:2] == (1, 1):
            figures["alignment.png"] = plot_alignment(maps.cross_attn[0, 0], label, outs)
    if maps.self_attn is not None:
        figures["decoder_self_attention.png"] = plot_attention(
            maps.self_attn, ins, ins, "decoder self-attention (causal)"
        )
    if maps.encoder_attn is not None:
        figures["encoder_self_attention.png"] = plot_attention(
            maps.encoder_attn, label, label, "encoder self-attention"
        )
    return figures


def _greedy(model: Seq2SeqModel, tokenizer: Any, ids: list[int]) -> list[int]:
    """The greedy output of ``model`` for one source (attnlab.generate, temperature 0)."""
    window = model.max_len if model.max_len is not None else 128
    config = GenerationConfig(max_new_tokens=max(1, min(window - 1, 128)), temperature=0.0)
    return list(generate_seq2seq(model, [ids], config, tokenizer=tokenizer).tokens[0])
