"""Streaming: yield tokens (or text pieces) as they are produced, for one prompt or source.

``stream(model, prompt, config, tokenizer=...)`` runs exactly the loop of :func:`generate` (same
tokens for the same seed) but hands each new token to the caller as soon as it exists. With
``text=True`` it yields text pieces instead: complete characters only (a byte token that ends
mid-character waits for the rest), and never any part of a stop string (text that could begin one
is held back until it cannot). Joined, the pieces equal ``generate(...).texts[0]``.

The model is put in eval mode for the whole stream and restored when the stream ends or is closed;
each step runs under ``torch.inference_mode`` but the caller's code between items does not. Beam
search cannot stream (its best sequence is known only at the end).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from attnlab.errors import ConfigValueError
from attnlab.generate.config import GenerationConfig, as_config
from attnlab.generate.lm import prepare_lm
from attnlab.generate.prompts import as_id_lists
from attnlab.generate.seq2seq import prepare_seq2seq
from attnlab.generate.steppers import eval_mode
from attnlab.models.base import LanguageModel, Seq2SeqModel


def stream(
    model: LanguageModel | Seq2SeqModel,
    prompt: Any,
    config: GenerationConfig | None = None,
    *,
    tokenizer: Any | None = None,
    text: bool = False,
) -> Iterator[int] | Iterator[str]:
    """Yield the new token ids (or, with ``text=True``, text pieces) of one prompt/source."""
    config = as_config(config)
    if config.num_beams > 1:
        raise ConfigValueError(
            "beam search (num_beams > 1) cannot stream: the best beam is known only at the end; "
            "use generate()/generate_seq2seq() or num_beams=1",
            fields=("num_beams",),
        )
    if text and tokenizer is None:
        raise ValueError("stream(text=True) needs a tokenizer to turn tokens into text")
    what = "source" if isinstance(model, Seq2SeqModel) else "prompt"
    ids = as_id_lists(prompt, tokenizer, what)  # encoded once: one warning for unknown text
    if len(ids) != 1:
        raise ValueError(f"stream() takes one {what}; use generate() for a batch")
    if isinstance(model, LanguageModel):
        prepared = prepare_lm(model, ids, config, tokenizer)
    elif isinstance(model, Seq2SeqModel):
        prepared = prepare_seq2seq(model, ids, config, tokenizer)
    else:
        raise TypeError(
            f"stream() needs a language model or a seq2seq model, got {type(model).__name__}, "
            "which is not generative"
        )
    loop = prepared.loop(tokenizer, text_rows=text)
    return _pieces(model, loop, text)


def _pieces(model: Any, loop: Any, text: bool) -> Iterator[Any]:
    with eval_mode(model):
        while (step := loop.step()) is not None:
            tokens, kept = step
            if text:
                piece = loop.rows_text[0].take_visible()
                if piece:
                    yield piece
            elif bool(kept[0]):
                yield int(tokens[0])
        if text:
            piece = loop.rows_text[0].take_visible()
            if piece:
                yield piece
