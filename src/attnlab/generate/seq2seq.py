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

from attnlab.generate.config import GenerationConfig, GenerationResult, special_ids
from attnlab.generate.loop import DecodeLoop, decode
from attnlab.generate.prompts import PromptBatch, as_id_lists, prepare_sources
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
    config = config if config is not None else GenerationConfig()
    check_model(model, Seq2SeqModel, "generate_seq2seq")
    with eval_mode(model):
        stepper, batch, specials, config = seq2seq_stepper(model, sources, config, tokenizer)
        return decode(
            stepper,
            batch.prompts,
            config,
            specials,
            vocab_size=model.tgt_vocab_size,
            tokenizer=tokenizer,
            keep_logits=return_logits,
        )


def seq2seq_stepper(
    model: Seq2SeqModel, sources: SourceInput, config: GenerationConfig, tokenizer: Any | None
):
    """(Seq2SeqStepper, source PromptBatch, SpecialIds, config with a capped max_new_tokens)."""
    specials = special_ids(config, tokenizer)
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
    stepper = Seq2SeqStepper(
        model,
        batch.ids,
        batch.mask,
        specials.bos,
        config.max_new_tokens,
        use_cache=config.use_cache,
        compile=config.compile,
        pad_id=specials.pad,
        cache_dtype=config.cache_dtype,
    )
    return stepper, batch, specials, config


def seq2seq_loop(
    model: Seq2SeqModel,
    sources: SourceInput,
    config: GenerationConfig,
    tokenizer: Any | None,
    *,
    keep_logits: bool = False,
    text_rows: bool = False,
) -> tuple[DecodeLoop, PromptBatch]:
    """A ready :class:`DecodeLoop` over the sources (nothing decoded yet), and the source batch."""
    stepper, batch, specials, config = seq2seq_stepper(model, sources, config, tokenizer)
    loop = DecodeLoop(
        stepper,
        config,
        specials,
        vocab_size=model.tgt_vocab_size,
        tokenizer=tokenizer,
        keep_logits=keep_logits,
        text_rows=text_rows,
    )
    return loop, batch
