"""What the model predicts, for the explorer: the next-token distribution under the sampling
controls, a classifier's classes, a masked LM's [MASK] fillers, and a continuation streamed token
by token that stops within one decode step when cancelled (beam search included).

003 "Decoding": p(w_t | w_<t) = softmax(z / tau), then top-k / top-p; greedy takes the argmax and
beam search keeps the best prefixes (attnlab.generate, whose own code these views call). Heads
switched off stay off for the whole request (``Session.ablated``).

Shapes: V vocabulary (or C classes).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from attnlab.errors import ExploreError
from attnlab.explore import fields
from attnlab.generate import GenerationConfig, generate, generate_seq2seq, stream
from attnlab.generate.sampling import process_logits
from attnlab.models.base import LanguageModel, Seq2SeqModel

if TYPE_CHECKING:
    from attnlab.explore.probes import Recorded
    from attnlab.explore.session import Head

TOP = 20  # next-token candidates shown


class Predictions:
    """The prediction views of :class:`attnlab.explore.session.Session` (a mixin: it uses the
    session's model, tokenizer, lock, ``_inputs``, ``parse_heads``, ``ablated``, ``_forward``)."""

    # What the session provides (attnlab.explore.session.Session), for the type checker.
    model: nn.Module
    tokenizer: Any
    labels: Any
    lock: threading.RLock

    if TYPE_CHECKING:

        @property
        def seq2seq(self) -> bool: ...
        @property
        def generative(self) -> bool: ...
        @property
        def output(self) -> str | None: ...
        def _inputs(self, text: Any, source: Any) -> dict[str, list[int]]: ...
        def parse_heads(self, ablate: Any) -> list[Head]: ...
        def ablated(self, heads: list[Head]) -> AbstractContextManager[None]: ...
        def token_label(self, i: int) -> str: ...
        def _forward(
            self, inputs: dict[str, list[int]]
        ) -> tuple[Tensor | None, dict[str, Recorded], Mapping[str, Tensor]]: ...

    def next_token(
        self,
        text: Any = None,
        source: Any = None,
        *,
        temperature: Any = 1.0,
        top_k: Any = 0,
        top_p: Any = 1.0,
        ablate: Any = None,
    ) -> dict[str, Any]:
        """The 20 most likely next tokens: p = softmax(z) and the sampling distribution after
        temperature, top-k and top-p (attnlab.generate.sampling, the generator's own code).
        For a classifier: p(c | x) = softmax(z) over its classes (p_sample = p). For a masked
        LM: p(w_i | text) = softmax(logits_i) at every [MASK] position i (``masks``), as
        attnlab.generate.fill_mask computes it."""
        if self.output is None:
            raise ExploreError("This model outputs vectors, not tokens or labels: nothing to show.")

        config = generation_config(temperature=temperature, top_k=top_k, top_p=top_p)
        with self.lock:
            inputs, heads = self._inputs(text, source), self.parse_heads(ablate)
            masks = self._mask_positions(inputs["target"]) if self.output == "masks" else []
            with self.ablated(heads), torch.inference_mode():
                logits, _, _ = self._forward(inputs)
        assert logits is not None  # every model with an output (checked above) gives logits
        ablated = [h.__dict__ for h in heads]
        if self.output == "masks":  # logits (T, V): every masked position at once
            p = logits[masks].float().softmax(dim=-1)  # (M, V)
            found = [{"position": i, "candidates": self._top(q, q)} for i, q in zip(masks, p)]
            return {"candidates": found[0]["candidates"], "masks": found, "ablated": ablated}
        logits = logits.float()  # (V,)
        p = logits.softmax(dim=-1)  # (V,)
        if self.output == "labels":
            q = p
        elif config.sampling:
            q = process_logits(logits[None], config, None)[0].softmax(dim=-1)  # (V,)
        else:  # greedy: all mass on the argmax
            q = torch.zeros_like(p).scatter_(0, logits.argmax()[None], 1.0)
        if not (torch.isfinite(p).all() and torch.isfinite(q).all()):
            raise ExploreError(
                "The model's probabilities are not finite for this input (NaN or infinite "
                "weights?); check the model with `attnlab evaluate`."
            )
        return {"candidates": self._top(p, q), "ablated": ablated}

    def _top(self, p: torch.Tensor, q: torch.Tensor) -> list[dict[str, Any]]:
        """The TOP most likely entries of p (V,), with q (V,) beside them."""
        top = torch.topk(p, min(TOP, p.numel()))
        return [
            {
                "id": int(i),
                "token": self._output_label(int(i)),
                "p": round(float(p[i]), 7),
                "p_sample": round(float(q[i]), 7),
            }
            for i in top.indices
        ]

    def _mask_positions(self, ids: list[int]) -> list[int]:
        mask_id = getattr(self.tokenizer, "mask_id", None)
        if mask_id is None:
            raise ExploreError("The tokenizer has no mask token, so there is nothing to fill in.")
        positions = [i for i, t in enumerate(ids) if t == mask_id]
        if not positions:
            mask = self.tokenizer.token_to_str(mask_id)
            raise ExploreError(
                f"The text has no {mask} to fill in: write {mask} where a word is missing, "
                f"e.g. 'the cat sat on the {mask}.'"
            )
        return positions

    def _output_label(self, i: int) -> str:
        if self.output in ("tokens", "masks"):
            return self.token_label(i)
        return self.labels.names[i] if self.labels is not None else f"class {i}"

    def continuation(
        self,
        text: Any = None,
        source: Any = None,
        *,
        strategy: Any = "greedy",
        max_new_tokens: Any = 20,
        temperature: Any = 1.0,
        top_k: Any = 0,
        top_p: Any = 1.0,
        beams: Any = 4,
        seed: Any = 0,
        ablate: Any = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Events {"type": "token", "id", "token"} one per new token, then {"type": "done"}
        (or {"type": "stopped"} once ``cancel`` is set: the next decode step raises, so beam
        search stops too, and the lock is released at once).

        Greedy and sampling stream as the tokens are made (attnlab.generate.stream); beam search
        knows its best sequence only at the end, so its tokens follow once it has finished.
        """
        if not self.generative:
            raise ExploreError("This model predicts labels, not tokens: nothing to continue.")
        if strategy not in ("greedy", "sample", "beam"):
            raise ExploreError(
                f"strategy must be greedy, sample or beam, not {fields.shown(strategy)}"
            )
        kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "seed": seed}
        kwargs["cache_dtype"] = getattr(self, "cache_dtype", None)
        if strategy == "greedy":
            kwargs["temperature"] = 0.0
        elif strategy == "sample":
            kwargs.update(temperature=temperature, top_k=top_k, top_p=top_p)
        else:
            kwargs.update(temperature=0.0, num_beams=beams)
        config = generation_config(**kwargs)
        cancel = cancel or threading.Event()
        ids: list[int] = []
        with self.lock:
            inputs, heads = self._inputs(text, source), self.parse_heads(ablate)
            prompt = inputs["source"] if self.seq2seq else inputs["target"]
            try:
                with self.ablated(heads), stops_on(self.model, cancel):
                    for token in self._generate(prompt, config):
                        if cancel.is_set():
                            raise Cancelled
                        ids.append(token)
                        label = self.token_label(token)
                        yield {"type": "token", "id": token, "token": label}
            except Cancelled:
                stopped = True
            else:
                stopped = False
        if stopped:
            yield {"type": "stopped", "ids": ids}
            return
        try:
            text = self.tokenizer.decode(ids)
        except (ValueError, IndexError, KeyError):  # ids past the tokenizer (padded rows)
            text = "".join(self.token_label(i) for i in ids)
        yield {"type": "done", "text": text, "ids": ids}

    def _generate(self, prompt: list[int], config: GenerationConfig) -> Iterator[int]:
        model = self.model
        assert isinstance(model, (LanguageModel, Seq2SeqModel))  # continuation checked generative
        if config.num_beams == 1:
            for token in stream(model, prompt, config, tokenizer=self.tokenizer):
                assert isinstance(token, int)  # text=False: token ids
                yield token
            return
        if isinstance(model, Seq2SeqModel):
            yield from generate_seq2seq(model, [prompt], config, tokenizer=self.tokenizer).tokens[0]
        else:
            yield from generate(model, [prompt], config, tokenizer=self.tokenizer).tokens[0]


class Cancelled(Exception):
    """Raised inside a decode step once the request is cancelled (see :func:`stops_on`)."""


@contextmanager
def stops_on(model: nn.Module, cancel: threading.Event) -> Iterator[None]:
    """While inside, every forward call of the model's embeddings (each decode step starts
    there, in every strategy and model kind) raises :class:`Cancelled` once ``cancel`` is set."""

    def check(_module, _args):
        if cancel.is_set():
            raise Cancelled

    targets: list[nn.Module] = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    targets = targets or [model]
    handles = [m.register_forward_pre_hook(check) for m in targets]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def generation_config(**values: Any) -> GenerationConfig:
    """A GenerationConfig from request values, each checked strictly (fields.py)."""
    checks = {
        "max_new_tokens": lambda v: fields.whole("max_new_tokens", v, 1, 512),
        "top_k": lambda v: fields.whole("top_k", v, 0, 1 << 24),
        "num_beams": lambda v: fields.whole("beams", v, 1, 16),
        "seed": lambda v: fields.whole("seed", v, 0, (1 << 63) - 1),
        "temperature": fields.temperature,
        "top_p": lambda v: fields.number("top_p", v, 0.0, 1.0),
    }
    values = {k: checks[k](v) if k in checks else v for k, v in values.items()}
    if values.get("top_p", 1.0) <= 0:
        raise ExploreError("top_p must be above 0 (1 = off).")
    try:
        return GenerationConfig(**values)
    except (TypeError, ValueError) as err:
        message = re.sub(r" \(--[\w-]+\)", "", str(err))  # the page has fields, not flags
    raise ExploreError(f"Bad generation setting: {message}")
