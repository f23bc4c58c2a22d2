"""What the model predicts, for the explorer: the next-token distribution under the sampling
controls, a classifier's classes, and a continuation streamed token by token.

003 "Decoding": p(w_t | w_<t) = softmax(z / tau), then top-k / top-p; greedy takes the argmax and
beam search keeps the best prefixes (attnlab.generate, whose own code these views call). Heads
switched off stay off for the whole request (``Session.ablated``).

Shapes: V vocabulary (or C classes).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import torch

from attnlab.errors import ExploreError

TOP = 20  # next-token candidates shown


class Predictions:
    """The prediction views of :class:`attnlab.explore.session.Session` (a mixin: it uses the
    session's model, tokenizer, lock, ``_inputs``, ``parse_heads``, ``ablated``, ``_forward``)."""

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
        For a classifier: p(c | x) = softmax(z) over its classes (p_sample = p)."""
        if self.output is None:
            raise ExploreError("This model outputs vectors, not tokens or labels: nothing to show.")
        from attnlab.generate.sampling import process_logits

        config = generation_config(temperature=temperature, top_k=top_k, top_p=top_p)
        with self.lock:
            inputs, heads = self._inputs(text, source), self.parse_heads(ablate)
            with self.ablated(heads), torch.inference_mode():
                logits, _, _ = self._forward(inputs)
        logits = logits.float()  # (V,)
        p = logits.softmax(dim=-1)  # (V,)
        if self.output == "labels":
            q = p
        elif config.sampling:
            q = process_logits(logits[None], config, None)[0].softmax(dim=-1)  # (V,)
        else:  # greedy: all mass on the argmax
            q = torch.zeros_like(p).scatter_(0, logits.argmax()[None], 1.0)
        top = torch.topk(p, min(TOP, p.numel()))
        return {
            "candidates": [
                {
                    "id": int(i),
                    "token": self._output_label(int(i)),
                    "p": round(float(p[i]), 7),
                    "p_sample": round(float(q[i]), 7),
                }
                for i in top.indices
            ],
            "ablated": [h.__dict__ for h in heads],
        }

    def _output_label(self, i: int) -> str:
        if self.output == "tokens":
            return self.tokenizer.token_to_str(i)
        return self.labels.names[i] if self.labels is not None else f"class {i}"

    def continuation(
        self,
        text: Any = None,
        source: Any = None,
        *,
        strategy: str = "greedy",
        max_new_tokens: Any = 20,
        temperature: Any = 1.0,
        top_k: Any = 0,
        top_p: Any = 1.0,
        beams: Any = 4,
        seed: Any = 0,
        ablate: Any = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Events {"type": "token", "id", "token"} one per new token, then {"type": "done"}.

        Greedy and sampling stream as the tokens are made (attnlab.generate.stream); beam search
        knows its best sequence only at the end, so its tokens follow once it has finished.
        """
        if not self.generative:
            raise ExploreError("This model predicts labels, not tokens: nothing to continue.")
        if strategy not in ("greedy", "sample", "beam"):
            raise ExploreError(f"strategy must be greedy, sample or beam, not {strategy!r}")
        kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "seed": seed}
        kwargs["cache_dtype"] = getattr(self, "cache_dtype", None)
        if strategy == "greedy":
            kwargs["temperature"] = 0.0
        elif strategy == "sample":
            kwargs.update(temperature=temperature, top_k=top_k, top_p=top_p)
        else:
            kwargs.update(temperature=0.0, num_beams=beams)
        config = generation_config(**kwargs)
        with self.lock:
            inputs, heads = self._inputs(text, source), self.parse_heads(ablate)
            prompt = inputs["source"] if self.seq2seq else inputs["target"]
            ids: list[int] = []
            with self.ablated(heads):
                for token in self._generate(prompt, config):
                    if cancel is not None and cancel.is_set():
                        return
                    ids.append(token)
                    label = self.tokenizer.token_to_str(token)
                    yield {"type": "token", "id": token, "token": label}
        yield {"type": "done", "text": self.tokenizer.decode(ids), "ids": ids}

    def _generate(self, prompt: list[int], config) -> Iterator[int]:
        from attnlab.generate import generate, generate_seq2seq, stream

        if config.num_beams == 1:
            yield from stream(self.model, prompt, config, tokenizer=self.tokenizer)
            return
        run = generate_seq2seq if self.seq2seq else generate
        yield from run(self.model, [prompt], config, tokenizer=self.tokenizer).tokens[0]


def generation_config(**fields: Any):
    """A GenerationConfig from request values, with their errors as ExploreError."""
    from attnlab.generate import GenerationConfig

    try:
        for name in ("max_new_tokens", "top_k", "num_beams", "seed"):
            if name in fields:
                fields[name] = int(fields[name])
        for name in ("temperature", "top_p"):
            if name in fields:
                fields[name] = float(fields[name])
        if not 1 <= fields.get("max_new_tokens", 1) <= 512:
            raise ValueError("max_new_tokens must be between 1 and 512")
        if fields.get("num_beams", 1) > 16:
            raise ValueError("use at most 16 beams")
        return GenerationConfig(**fields)
    except (TypeError, ValueError) as err:
        raise ExploreError(f"Bad generation setting: {err}") from None
