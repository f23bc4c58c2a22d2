"""Fast Transformer models: the plain models of ``attnlab.models`` with packed teacher forcing.

On a padded batch everything in a Transformer except attention acts on each position alone
(projections, feed-forward nets, norms, residual adds, the vocabulary head), so on padding it
only wastes work. The fast encoder and the fast encoder-decoder pack the real tokens of a
right-padded batch into one (N, D) matrix for those layers, and attention runs on groups of
rows of similar length (``attnlab.fast.packing``, ``attnlab.fast.attention``). Outputs at real
positions are the plain model's (tested in value and gradient); at padding positions they are 0.

A forward that the packed form does not cover runs the plain one: attention weights asked for,
a hook point active (``attnlab.inspect`` sees the plain values), a decoding cache, a batch that
cannot be grouped (see :func:`row_groups`), or value heads of another width than key heads.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.fast.attention import packed
from attnlab.fast.packing import Packing, length_groups, make_packing, pack, row_major, unpack
from attnlab.fast.replay import ReplayingStep
from attnlab.fast.switches import PATHS
from attnlab.models.base import ModelOutput
from attnlab.models.encoder import EncoderOutput, TransformerEncoder
from attnlab.models.lm import DecoderLM
from attnlab.models.transformer_seq2seq import TransformerEncoderDecoder
from attnlab.nn.hooks import HookPoint
from attnlab.nn.masks import padding_mask
from attnlab.nn.positional import SCHEMES, default_positions


def hooks_active(model: nn.Module) -> bool:
    """True while any hook point of the model has a hook registered."""
    return any(m.active for m in model.modules() if isinstance(m, HookPoint))


def row_groups(
    model: TransformerEncoder | TransformerEncoderDecoder, mask: Tensor | None, *others: Tensor
) -> list[Packing] | None:
    """The packings of (B, T) masks (True = real token) in shared row groups, or None where the
    plain forward runs (see the module docstring)."""
    cfg = model.cfg
    biased = SCHEMES[cfg.positional].biases  # a logit bias (ALiBi): the packed groups have none
    plain_only = cfg.kv_heads != cfg.n_heads or biased or cfg.attn_window
    if not PATHS["packing"] or mask is None or cfg.value_dim != cfg.head_dim or plain_only:
        return None
    if hooks_active(model):
        return None
    groups = length_groups(mask, *others)
    if groups is None:
        return None
    return [make_packing(m, groups) for m in (mask, *others)]


class FastDecoderLM(DecoderLM):
    """The decoder-only LM on the fast modules (its windows are unpadded: nothing to pack)."""

    decode_step = ReplayingStep  # generate(compile=True): the compiled step, replayed


class FastTransformerEncoder(TransformerEncoder):
    """The Transformer encoder with packed right-padded batches."""

    def forward(self, ids: Tensor, **inputs) -> EncoderOutput:
        """:meth:`TransformerEncoder.forward` (the same keywords), on packed rows."""
        key_padding_mask = inputs.get("key_padding_mask")
        packings = None if inputs.get("need_weights") else row_groups(self, key_padding_mask)
        if packings is None or set(inputs) - {"key_padding_mask", "need_weights", "token_types"}:
            return super().forward(ids, **inputs)  # the plain form; it names unknown keywords
        (packing,) = packings
        self.check_input(ids, key_padding_mask)
        x = pack(self.embed(ids, token_types=inputs.get("token_types")), packing)  # (N, D)
        with packed(packing):
            hidden = self.stack(x, padding_mask(key_padding_mask)).hidden  # (N, D)
        return EncoderOutput(unpack(hidden, packing), None)  # (B, T, D), zeros at padding


class FastTransformerEncoderDecoder(TransformerEncoderDecoder):
    """The encoder-decoder with packed teacher forcing (a fast encoder, a packed decoder)."""

    decode_step = ReplayingStep  # generate_seq2seq(compile=True): the compiled step, replayed

    def decode(
        self,
        tgt_in: Tensor,
        encoded,
        *,
        tgt_mask: Tensor | None = None,
        cache=None,
        need_weights: bool = False,
        real_only: bool = False,
    ) -> ModelOutput:
        packings = None
        if cache is None and not need_weights:
            real = tgt_mask if tgt_mask is not None else torch.ones_like(tgt_in, dtype=torch.bool)
            packings = row_groups(self, real, encoded.src_mask)
        if packings is None:
            return super().decode(
                tgt_in,
                encoded,
                tgt_mask=tgt_mask,
                cache=cache,
                need_weights=need_weights,
                real_only=real_only,
            )
        packing, memory_packing = packings
        self.check_target(tgt_in, tgt_mask, 0)
        positions = default_positions(tgt_in.size(1), 0, tgt_in.device)  # (T,)
        x = pack(self.tgt_embed(tgt_in, positions), packing)  # (N, D)
        memory = pack(encoded.memory, memory_packing)  # (N_src, D)
        masks = dict(self_mask=padding_mask(tgt_mask), cross_mask=padding_mask(encoded.src_mask))
        with packed(packing, memory_packing):
            for block in self.blocks:
                x = block(x, memory, positions=positions, **masks).x  # (N, D)
        h = self.final_norm(x)  # (N, D)
        if real_only:
            return ModelOutput(self.lm_head(row_major(h, packing)), None)  # (N, V), x[mask] order
        return ModelOutput(unpack(self.lm_head(h), packing), None)  # (B, T, V), 0 at padding


FAST_CLASSES: dict[type, type] = {
    DecoderLM: FastDecoderLM,
    TransformerEncoder: FastTransformerEncoder,
    TransformerEncoderDecoder: FastTransformerEncoderDecoder,
}
