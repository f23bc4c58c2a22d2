"""The explorer's model side: every number the page and the widget show comes from here.

A :class:`Session` holds one model and its tokenizer and answers in plain JSON-ready values:
tokens, attention maps per site x layer x head, the one-head walkthrough, the position signal,
the next-token distribution and a streamed continuation (predictions.py), each optionally with
heads switched off.
Calls are serialised by a lock (hooks and generation must not interleave). Bad input raises
:class:`ExploreError` with one readable sentence that the page shows as is.

Text conventions: a language model reads ``text`` (the prompt); a sequence-to-sequence model reads
``source`` and the target prefix ``text`` (its decoder input is <bos> + text); an encoder or a
classifier reads ``text``.

Shapes: T target/query tokens, S source/key tokens, H heads, V vocabulary.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnlab import inspect
from attnlab.errors import ExploreError
from attnlab.explore import probes
from attnlab.explore.predictions import Predictions
from attnlab.explore.probes import matrix
from attnlab.explore.walkthrough import bahdanau_steps, positions_view, walkthrough_steps
from attnlab.models.base import Classifier, LanguageModel, Seq2SeqModel

MAX_TOKENS = 256  # longest input the explorer draws (GPT-2's 1024 would be 12 x 12 x 1M cells)
# The recurrent attention's named activations (attnlab.inspect; 004 eq. 2, 5-8).
RECURRENT_NAMES = ("h_enc", "f", "keys", "e", "alpha", "v_l", "h_dec")
SITE_LABELS = {
    "encoder": "self-attention (encoder)",
    "decoder": "masked self-attention",
    "cross": "cross-attention",
    "alignment": "Bahdanau alignment",
}


@dataclass(frozen=True)
class Head:
    """One attention head: ``site`` (encoder / decoder / cross), ``layer``, ``head``."""

    site: str
    layer: int
    head: int


class Session(Predictions):
    """One model + tokenizer, explored through JSON-ready answers."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        name: str = "model",
        labels: Any = None,
        cache_dtype: str | None = None,
    ):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.cache_dtype = cache_dtype  # the KV cache's dtype in continuations (None: compute)
        self.labels = labels  # a classifier's class names (attnlab.data.LabelSet), if known
        self.cfg = getattr(model, "cfg", None)
        self.sites = probes.attention_sites(model)
        self.lock = threading.RLock()
        self.recurrent_alignment = not self.sites and isinstance(model, Seq2SeqModel)
        self.recurrent_alignment &= getattr(model, "attention", "none") != "none"

    # -- what the model is ----------------------------------------------------------------
    @property
    def seq2seq(self) -> bool:
        return isinstance(self.model, Seq2SeqModel)

    @property
    def generative(self) -> bool:
        return isinstance(self.model, (LanguageModel, Seq2SeqModel))

    @property
    def output(self) -> str | None:
        """What the model predicts: "tokens", "labels" (a classifier) or None (an encoder)."""
        if self.generative:
            return "tokens"
        return "labels" if isinstance(self.model, Classifier) else None

    def info(self) -> dict[str, Any]:
        sites = [
            {
                "name": s.name,
                "label": SITE_LABELS[s.name],
                "layers": len(s.modules),
                "heads": s.modules[0][1].n_heads,
            }
            for s in self.sites
        ]
        if self.recurrent_alignment:
            sites.append(
                {"name": "alignment", "label": SITE_LABELS["alignment"], "layers": 1, "heads": 1}
            )
        cfg = self.cfg
        return {
            "name": self.name,
            "kind": cfg.kind if cfg is not None else type(self.model).__name__,
            "seq2seq": self.seq2seq,
            "generative": self.generative,
            "output": self.output,
            "sites": sites,
            "positional": getattr(cfg, "positional", None),
            "max_len": min(getattr(self.model, "max_len", None) or MAX_TOKENS, MAX_TOKENS),
            "vocab_size": getattr(self.model, "vocab_size", None),
            "d_model": getattr(cfg, "d_model", None),
        }

    # -- input ----------------------------------------------------------------------------
    def _encode(self, text: Any, what: str, allow_empty: bool = False) -> list[int]:
        text = "" if text is None else text
        if not isinstance(text, str):
            raise ExploreError(f"the {what} must be text, got {type(text).__name__}")
        if not text and not allow_empty:
            raise ExploreError(f"The {what} is empty: type some text to see its attention.")
        try:
            ids = list(self.tokenizer.encode(text))
        except ValueError as err:
            raise ExploreError(f"The tokenizer cannot read the {what}: {err}") from None
        limit = getattr(self.model, "max_len", None)
        n = len(ids) + (1 if what == "target" else 0)
        if limit is not None and n > limit:
            raise ExploreError(
                f"The {what} is {n} tokens long but the model accepts at most {limit}; shorten it."
            )
        if n > MAX_TOKENS:
            raise ExploreError(
                f"The {what} is {n} tokens long; the explorer draws at most {MAX_TOKENS}. "
                "Shorten it."
            )
        if not ids and not allow_empty:
            raise ExploreError(f"The {what} has no tokens: type some text.")
        return ids

    def _inputs(self, text: Any, source: Any) -> dict[str, list[int]]:
        """Token ids of the request: {"target": ids} plus {"source": ids} for seq2seq."""
        if self.seq2seq:
            if source is None:
                raise ExploreError("This is a sequence-to-sequence model: give a source text.")
            bos = getattr(self.tokenizer, "bos_id", None)
            if bos is None:
                raise ExploreError("The tokenizer has no <bos> token to start the target with.")
            target = [bos] + self._encode(text or "", "target", allow_empty=True)
            return {"source": self._encode(source, "source"), "target": target}
        ids = self._encode(text, "input")
        if isinstance(self.model, Classifier) and getattr(self.cfg, "pooling", "") == "cls":
            ids = [self.tokenizer.bos_id] + ids  # the class token sits at position 0
        return {"target": ids}

    def _labels(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.token_to_str(i) for i in ids]

    def tokens(self, text: Any = None, source: Any = None) -> dict[str, Any]:
        """The tokens as the tokenizer cut them (with their ids)."""
        inputs = self._inputs(text, source)  # the tokenizer only: no lock needed
        return {k: {"ids": v, "tokens": self._labels(v)} for k, v in inputs.items()}

    def parse_heads(self, ablate: Any) -> list[Head]:
        """[{"site", "layer", "head"}, ...] or [[site, layer, head], ...] -> checked heads."""
        if ablate in (None, ""):
            return []
        if not isinstance(ablate, list):
            raise ExploreError("ablate must be a list of heads like {site, layer, head}")
        heads = []
        for item in ablate:
            try:
                site, layer, head = (
                    (item["site"], item["layer"], item["head"]) if isinstance(item, dict) else item
                )
                layer, head = int(layer), int(head)
            except (KeyError, TypeError, ValueError):
                message = f"cannot read head {item!r}: give site, layer and head"
                raise ExploreError(message) from None
            heads.append(self._check_head(str(site), layer, head))
        return heads

    def _check_head(self, site: str, layer: int, head: int) -> Head:
        found = {s.name: s for s in self.sites}
        if site not in found:
            names = ", ".join(found) or "none (this model has no attention heads)"
            raise ExploreError(f"Unknown attention site {site!r}; this model has: {names}.")
        n_layers, n_heads = len(found[site].modules), found[site].modules[0][1].n_heads
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ExploreError(
                f"Unknown head: {site} layer {layer} head {head}; the model has layers "
                f"0-{n_layers - 1} and heads 0-{n_heads - 1}."
            )
        return Head(site, layer, head)

    # -- forward passes -------------------------------------------------------------------
    @contextmanager
    def ablated(self, heads: list[Head]) -> Iterator[None]:
        """Heads switched off: head_h = 0 in the concatenation before W^O (004 eq. 13), through
        ``attnlab.inspect.ablate_heads``."""
        with ExitStack() as stack:
            for site in self.sites:
                chosen = [(h.layer, h.head) for h in heads if h.site == site.name]
                if not chosen:
                    continue
                where, part = ("cross", None) if site.name == "cross" else ("self", site.name)
                if sum(s.name != "cross" for s in self.sites) == 1:
                    part = None  # one self-attention stack: nothing to choose
                stack.enter_context(inspect.ablate_heads(self.model, chosen, site=where, part=part))
            yield

    def _forward(
        self,
        inputs: dict[str, list[int]],
        modules: list[tuple[str, nn.Module]] | None = None,
        steps: tuple[str, ...] = probes.STEP_NAMES,
        recurrent: bool = False,
    ):
        """One forward pass: (last-position logits or None, the inputs each attention module of
        ``modules`` received, the attnlab.inspect cache of their ``steps``, or with
        ``recurrent`` the recurrent attention's f, keys, e, alpha, v_l, ... of the LSTM model)."""
        model, device = self.model, _device(self.model)
        target = torch.tensor([inputs["target"]], device=device)  # (1, T)
        modules = modules or []
        names: tuple[str, ...] = ()
        if recurrent:
            names = RECURRENT_NAMES
        elif modules:
            names = tuple(n for path, m in modules for n in probes.step_names(path, m, steps))
        with (
            probes.record_inputs(modules) as seen,
            inspect.capture(model, list(names)) if names else nullcontext({}) as cache,
            torch.inference_mode(),
        ):
            if self.seq2seq:
                src = torch.tensor([inputs["source"]], device=device)  # (1, S)
                logits = model.decode(target, model.encode(src)).logits[0, -1]
            else:
                out = model(target)
                logits = None
                if isinstance(model, LanguageModel):
                    logits = out.logits[0, -1]  # (V,) the next token
                elif isinstance(model, Classifier):
                    logits = out.logits[0]  # (C,) the classes
        if recurrent:
            return logits, dict(seen), {n: cache[n][0] for n in names}  # batch of one
        return logits, dict(seen), cache

    # -- views ----------------------------------------------------------------------------
    def attention(self, text: Any = None, source: Any = None, ablate: Any = None) -> dict[str, Any]:
        """A (H, T, S) of every layer of every site, with row (query) and column (key) tokens."""
        with self.lock:
            inputs, heads = self._inputs(text, source), self.parse_heads(ablate)
            with self.ablated(heads), torch.inference_mode():
                modules = [pm for site in self.sites for pm in site.modules]
                _, seen, cache = self._forward(
                    inputs, modules, steps=("A",), recurrent=self.recurrent_alignment
                )
                alignment = cache if self.recurrent_alignment else None
                sites = {}
                for site in self.sites:
                    layers = [cache[f"{path}.A"][0] for path, _ in site.modules]  # (H, T, S)
                    sites[site.name] = {"layers": [matrix(a) for a in layers]}
                    sites[site.name].update(self._axes(site.name, inputs))
        if alignment:  # alpha_l of every target step over the source (004 eq. 7)
            sites["alignment"] = {"layers": [[matrix(alignment["alpha"])]]}
            sites["alignment"].update(self._axes("cross", inputs))
        return {"sites": sites, "ablated": [h.__dict__ for h in heads]}

    def _axes(self, site: str, inputs: dict[str, list[int]]) -> dict[str, list[str]]:
        rows = inputs["source"] if site == "encoder" and self.seq2seq else inputs["target"]
        cols = inputs["source"] if site in ("encoder", "cross") and self.seq2seq else rows
        return {"rows": self._labels(rows), "cols": self._labels(cols)}

    def walkthrough(
        self, text: Any = None, source: Any = None, site: Any = None, layer: Any = 0, head: Any = 0
    ) -> dict[str, Any]:
        """The chosen head's equation step by step with its actual numbers (walkthrough.py)."""
        with self.lock:
            if self.recurrent_alignment:
                return self._bahdanau_walkthrough(text, source)
            if not self.sites:
                raise ExploreError("This model has no attention to walk through.")
            site = site or self.sites[0].name
            try:
                chosen = self._check_head(str(site), int(layer), int(head))
            except (TypeError, ValueError):
                raise ExploreError("layer and head must be whole numbers") from None
            inputs = self._inputs(text, source)
            with torch.inference_mode():
                path, module = {s.name: s for s in self.sites}[chosen.site].modules[chosen.layer]
                _, seen, cache = self._forward(inputs, [(path, module)])
                steps = probes.cached_steps(module, path, seen[path], cache)
        axes = self._axes(chosen.site, inputs)
        return {
            "head": chosen.__dict__,
            "module": path,
            "steps": walkthrough_steps(steps, module, chosen, axes, self.cfg),
        }

    def _bahdanau_walkthrough(self, text: Any, source: Any) -> dict[str, Any]:
        inputs = self._inputs(text, source)
        _, _, recurrent = self._forward(inputs, recurrent=True)
        axes = self._axes("cross", inputs)
        head = Head("alignment", 0, 0)
        steps = bahdanau_steps(recurrent, axes, self.model.attention)
        return {"head": head.__dict__, "module": "", "steps": steps}

    def positions(self, text: Any = None, source: Any = None) -> dict[str, Any]:
        """The position signal each embedding adds for these tokens (walkthrough.py). Reads
        parameters only, so it needs no lock."""
        inputs = self._inputs(text, source)
        return positions_view(self.model, self.cfg, inputs, self._labels)


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")
