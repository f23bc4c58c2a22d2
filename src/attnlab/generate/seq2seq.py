"""Generation from a sequence-to-sequence model: y_l ~ p(y_l | y_{<l}, x)   (004 eq. 1; 003).

The source x is encoded once, h^(x) = Encoder(x); the decoder starts from [BOS] and adds one token
per step until it emits EOS (or another stop token) or reaches ``max_new_tokens``. An encoder-
decoder Transformer computes the cross-attention keys/values K h^(x), V h^(x) once, on the first
decode call, and keeps them in its cache; a recurrent seq2seq model keeps its hidden state there.
Rows that have finished keep emitting ``pad`` (masked out of the results) until all rows are done.

Sources are right-padded as in training. A target cannot outgrow the decoder's window: with
learned positions, more than ``max_len`` decoder inputs has no position to use, so
``max_new_tokens`` is capped at ``max_len`` (with a warning) rather than slid.

Shapes: B sources, S longest source, V target vocabulary.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import Tensor

from attnlab.generate.config import (
    GenerationConfig,
    GenerationResult,
    as_config,
    check_special_ids,
    special_ids,
)
from attnlab.generate.loop import DecodeLoop, Prepared
from attnlab.generate.prompts import as_id_lists, prepare_sources
from attnlab.generate.steppers import Seq2SeqStepper, check_model, eval_mode
from attnlab.models.base import Seq2SeqModel

SourceInput = Any  # str | list[int] | Tensor | list[str | list[int]]


def generate_seq2seq(
    model: Seq2SeqModel,
    sources: SourceInput,
    config: GenerationConfig | None = None,
    *,
    tokenizer: Any | None = None,
    return_logits: bool = False,
) -> GenerationResult:
    """Translate/transform each source; one output per source (the best beam with beams).

    ``tokenizer`` encodes text sources and decodes outputs (attnlab checkpoints store one
    tokenizer for both sides); with separate vocabularies, pass source ids and the target tokenizer.
    """
    config = as_config(config)
    check_model(model, Seq2SeqModel, "generate_seq2seq")
    with eval_mode(model):
        return prepare_seq2seq(model, sources, config, tokenizer).decode(
            tokenizer, keep_logits=return_logits
        )


def generate_seq2seq_padded(
    model: Seq2SeqModel, src: Tensor, src_mask: Tensor, config: GenerationConfig
) -> GenerationResult:
    """:func:`generate_seq2seq` (greedy or sampling) on a batch of sources already padded as in
    training -- src, src_mask (B, S), True = real token -- decoded as it is, not re-padded:
    evaluation decodes its validation batches this way. The special ids come from ``config``
    (``bos_token_id``, ``stop_token_ids``, ``pad_token_id``)."""
    config = as_config(config)
    check_model(model, Seq2SeqModel, "generate_seq2seq_padded")
    specials = special_ids(config, None)
    check_special_ids(specials, model.tgt_vocab_size)
    if specials.bos is None:
        raise ValueError("seq2seq decoding starts from a BOS token; set bos_token_id")
    stepper = Seq2SeqStepper(model, src, src_mask, specials.bos, config, specials.pad)
    loop = DecodeLoop(stepper, config, specials, vocab_size=model.tgt_vocab_size)
    with eval_mode(model):
        loop.run()
    sources = [row[:n] for row, n in zip(src.tolist(), src_mask.sum(dim=1).tolist())]
    return loop.result(sources, None)


def prepare_seq2seq(
    model: Seq2SeqModel, sources: SourceInput, config: GenerationConfig, tokenizer: Any | None
) -> Prepared:
    """Checked, right-padded sources and a :class:`Seq2SeqStepper` over them, ready to decode;
    ``max_new_tokens`` capped at the decoder's window."""
    specials = special_ids(config, tokenizer)
    check_special_ids(specials, model.tgt_vocab_size)
    if specials.bos is None:
        raise ValueError(
            "seq2seq decoding starts from a BOS token, and none is known; pass the tokenizer "
            "or GenerationConfig(bos_token_id=...)"
        )
    window = getattr(model, "max_len", None)
    if window is not None and config.max_new_tokens > window:
        warnings.warn(
            f"max_new_tokens={config.max_new_tokens} exceeds the decoder's window "
            f"max_len={window}; generating at most {window} tokens",
            stacklevel=3,
        )
        config = config.replace(max_new_tokens=window)
    ids = as_id_lists(sources, tokenizer, "source")
    batch = prepare_sources(ids, vocab_size=model.vocab_size, window=window, pad_id=specials.pad)
    assert batch.mask is not None  # prepared sources always carry their (B, S) mask
    stepper = Seq2SeqStepper(model, batch.ids, batch.mask, specials.bos, config, specials.pad)
    return Prepared(stepper, batch, specials, config, model.tgt_vocab_size)
