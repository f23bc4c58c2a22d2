"""The token-by-token loop of greedy decoding and sampling, shared by LMs, seq2seq and streaming.

    for t = 1 .. max_new_tokens:
        z_t = logits of the next token (R, V)        one model call (``steppers.py``)
        w_t = argmax z_t  or  w_t ~ softmax(f(z_t))  processors + choice (``sampling.py``)
        a row whose w_t is a stop token, or whose text now contains a stop string, is finished;
        finished rows keep producing ``pad`` (their outputs are masked out) until all are done.

Per step the work is the model call, the sampler, and a few (R,)-sized tensor ops; text is decoded
only when stop strings or a text stream ask for it, and finished rows are masked only once there
are some. :meth:`DecodeLoop.step` runs under ``torch.inference_mode`` itself, so a stream that
yields between steps never leaves the caller in inference mode; :meth:`DecodeLoop.run` enters it
once for the whole loop.

Shapes: R rows, N max new tokens, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnlab.generate.beam import beam_search
from attnlab.generate.config import GenerationConfig, GenerationResult, SpecialIds
from attnlab.generate.prompts import PromptBatch
from attnlab.generate.sampling import (
    check_finite_logits,
    choose_next,
    fresh_seed,
    make_generator,
    seen_tokens,
)
from attnlab.generate.steppers import Stepper
from attnlab.generate.text import TextRow, decode_after, row_contexts


@dataclass(frozen=True)
class Prepared:
    """A stepper over a checked, padded batch of prompts (or sources), ready to decode: what
    ``generate``, ``generate_seq2seq`` and ``stream`` share once the model kind is handled."""

    stepper: Stepper
    batch: PromptBatch
    specials: SpecialIds
    config: GenerationConfig  # seq2seq may cap max_new_tokens at the decoder's window
    vocab_size: int  # of the model's outputs (the target vocabulary of a seq2seq model)

    def loop(
        self, tokenizer: Any | None = None, *, keep_logits: bool = False, text_rows: bool = False
    ) -> DecodeLoop:
        """A ready :class:`DecodeLoop` over the batch (nothing run yet)."""
        return DecodeLoop(
            self.stepper,
            self.config,
            self.specials,
            vocab_size=self.vocab_size,
            tokenizer=tokenizer,
            keep_logits=keep_logits,
            text_rows=text_rows,
        )

    def decode(
        self, tokenizer: Any | None = None, *, keep_logits: bool = False
    ) -> GenerationResult:
        """Run to the end: beam search when ``config.num_beams > 1``, else greedy/sampling."""
        if self.config.num_beams > 1:
            return beam_search(
                self.stepper,
                self.config,
                vocab_size=self.vocab_size,
                specials=self.specials,
                prompts=self.batch.prompts,
                tokenizer=tokenizer,
            )
        loop = self.loop(tokenizer, keep_logits=keep_logits)
        loop.run()
        return loop.result(self.batch.prompts, tokenizer)


class DecodeLoop:
    """State of one greedy/sampling run over the rows of a stepper (ready, nothing run yet)."""

    def __init__(
        self,
        stepper: Stepper,
        config: GenerationConfig,
        specials: SpecialIds,
        *,
        vocab_size: int,
        tokenizer: Any | None = None,
        keep_logits: bool = False,
        text_rows: bool = False,
    ):
        pad_id, stop_ids = specials.pad, specials.stop
        self.stepper, self.config, self.pad_id = stepper, config, pad_id
        rows, n = stepper.rows, config.max_new_tokens
        device = stepper.ids.device
        self.out = torch.full((rows, n), pad_id, dtype=torch.long, device=device)  # (R, N)
        self.done = torch.zeros(rows, dtype=torch.bool, device=device)  # (R,)
        self.kept_len: list[int | None] = [None] * rows  # tokens kept by each finished row
        self.n_done = 0
        self.every_row = torch.ones(rows, dtype=torch.bool, device=device)  # `kept` while none done
        self.reasons = ["length"] * rows
        self.stop = torch.tensor(stop_ids, dtype=torch.long, device=device) if stop_ids else None
        self.seed: int | None = None  # sampling without a seed draws a fresh one: result.seed
        self.generator: torch.Generator | None = None
        if config.sampling:
            self.seed = config.seed if config.seed is not None else fresh_seed()
            self.generator = make_generator(self.seed, device)
        self.seen: Tensor | None = None
        if config.repetition_penalty != 1.0:
            self.seen = seen_tokens(*stepper.history(), vocab_size)  # (R, V)
        # per row: the tokens its text is decoded after (the prompt's last few)
        self.contexts = row_contexts(tokenizer, stepper.history()) if tokenizer else []
        self.rows_text: list[TextRow] | None = None
        if config.stop_strings or text_rows:
            if tokenizer is None:
                raise ValueError("stop strings and text streaming need a tokenizer to decode")
            self.rows_text = [
                TextRow(tokenizer, config.stop_strings, self.contexts[r]) for r in range(rows)
            ]
        self.logits: list[Tensor] | None = [] if keep_logits else None
        self.steps = 0
        self.finished = False
        self._next_logits: Tensor | None = None

    def step(self) -> tuple[Tensor, Tensor] | None:
        """One new token per row: (tokens (R,), kept (R,) bool), or None when generation is over."""
        with torch.inference_mode():
            return self._step()

    def run(self) -> None:
        with torch.inference_mode():  # entered once, not per token
            while self._step() is not None:
                pass

    def _step(self) -> tuple[Tensor, Tensor] | None:
        if self.finished:
            return None
        if self.steps == 0:
            logits = check_finite_logits(self.stepper.start())  # (R, V)
        else:
            assert self._next_logits is not None  # each step leaves the logits of the next
            logits = self._next_logits
        if self.logits is not None:
            self.logits.append(logits.float().clone())  # (R, V) raw model logits
        nxt = choose_next(logits, self.config, self.seen, self.generator)  # (R,)
        nxt, kept = self._stop_rows(nxt)
        self.out[:, self.steps] = nxt
        if self.seen is not None:
            self.seen[torch.arange(nxt.size(0)), nxt] = True
        self.steps += 1
        if self.steps == self.config.max_new_tokens or self.n_done == len(self.reasons):
            self._finish()
        else:
            self._next_logits = self.stepper.advance(nxt)
        return nxt, kept

    def _stop_rows(self, nxt: Tensor) -> tuple[Tensor, Tensor]:
        """Finished rows emit pad; a stop token finishes its row (not kept), a completed stop
        string finishes it after its last token (kept). Returns (tokens (R,), kept (R,)).

        Which rows are done is also tracked in Python, so until one is, a step costs no masking
        and, with stop tokens, one ``isin`` and one host read.
        """
        kept = self.every_row
        if self.n_done:
            nxt = nxt.masked_fill(self.done, self.pad_id)
            kept = ~self.done
        if self.stop is not None:
            hit = torch.isin(nxt, self.stop)
            if bool(hit.any()):
                hit &= kept
                for r in hit.nonzero().flatten().tolist():
                    self._end_row(r, "stop_token", kept_tokens=self.steps)
                kept = kept & ~hit
        if self.rows_text is not None:
            for r in kept.nonzero().flatten().tolist():
                if self.rows_text[r].push(int(nxt[r])):
                    self._end_row(r, "stop_string", kept_tokens=self.steps + 1)
        return nxt, kept

    def _end_row(self, r: int, reason: str, kept_tokens: int) -> None:
        self.reasons[r], self.kept_len[r] = reason, kept_tokens
        self.done[r] = True
        self.n_done += 1

    def _finish(self) -> None:
        self.finished = True
        if self.rows_text is not None:
            for r, row in enumerate(self.rows_text):
                row.finish()  # pending text of a partial character may complete a stop string
                if row.stopped and self.reasons[r] == "length":
                    self.reasons[r] = "stop_string"

    # Results -------------------------------------------------------------------------------
    def tokens(self) -> list[list[int]]:
        counts = [self.steps if n is None else n for n in self.kept_len]
        return [row[:c] for row, c in zip(self.out.tolist(), counts, strict=True)]

    def result(self, prompts: list[list[int]], tokenizer: Any | None) -> GenerationResult:
        tokens = self.tokens()
        texts = None
        if self.rows_text is not None:
            texts = [row.text for row in self.rows_text]
        elif tokenizer is not None:
            contexts = self.contexts or [[] for _ in tokens]  # a tokenizer given only now
            texts = [decode_after(tokenizer, c, t) for c, t in zip(contexts, tokens, strict=True)]
        return GenerationResult(
            tokens, texts, list(self.reasons), prompts, logits=self.logits, seed=self.seed
        )
