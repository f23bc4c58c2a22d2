"""The explorer's model side: every number the page and the widget show comes from here.

A :class:`Session` holds one model and its tokenizer and answers in plain JSON-ready values:
tokens, attention maps per site x layer x head, the one-head walkthrough, the position signal,
the next-token distribution and a streamed continuation (predictions.py), each optionally with
heads switched off.
Long inputs (up to 1,024 tokens) stay light: :meth:`Session.overview` sends every head as a small
thumbnail, :meth:`Session.head` one head's full map packed as float32/float16 (probes.pack), and a
head or walkthrough request runs only its own attention module again on the inputs recorded by
the last forward pass (one pass kept, for the newest input and ablation: nothing accumulates).
Calls are serialised by a lock (hooks and generation must not interleave). Bad input raises
:class:`ExploreError` with one readable sentence that the page shows as is; fields are read
strictly (fields.py).

Text conventions: a language model reads ``text`` (the prompt); a sequence-to-sequence model reads
``source`` and the target prefix ``text`` (its decoder input is <bos> + text); an encoder or a
classifier reads ``text``.

Shapes: T target/query tokens, S source/key tokens, H heads, V vocabulary.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import inspect
from attnlab.data.unknown import unknown_characters
from attnlab.errors import ExploreError
from attnlab.explore import fields, probes
from attnlab.explore.predictions import Predictions
from attnlab.explore.probes import matrix, pack, pack_scaled, per_query_head
from attnlab.explore.walkthrough import (
    bahdanau_steps,
    position_bias,
    positions_view,
    scaled_equation,
    walkthrough_steps,
)
from attnlab.models.base import Classifier, LanguageModel, Seq2SeqModel
from attnlab.models.lstm_seq2seq import LSTMSeq2Seq
from attnlab.models.masked_lm import MaskedLM
from attnlab.nn.attention import scale_factor
from attnlab.nn.multihead import MultiHeadBase

log = logging.getLogger("attnlab.explore")
MAX_TOKENS = 1024  # longest input the explorer draws (GPT-2's context)
THUMB = 48  # model-view thumbnails: at most THUMB x THUMB block averages per head
ALL_HEADS_LIMIT = 2_000_000  # values /api/attention sends at once (all heads as JSON lists)
EXAMPLES = (
    "the cat sat on the mat because it was tired.",
    "attention is all you need",
    "hello world",
)
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


class Pass(NamedTuple):
    """What :meth:`Session._record` keeps of one forward pass."""

    key: tuple  # (target ids, source ids, switched-off heads)
    seen: dict[str, probes.Recorded]  # module path -> the inputs it received
    thumbs: dict[str, torch.Tensor]  # module path -> (H, t, s) block averages of A
    layer: dict[str, torch.Tensor]  # the last module a head request ran -> its A (H, T, S)


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
        example: str | None = None,
    ):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.given_example = example  # an input from the run's own data, tried first
        self.cache_dtype = cache_dtype  # the KV cache's dtype in continuations (None: compute)
        self.labels = labels  # a classifier's class names (attnlab.data.LabelSet), if known
        self.cfg = getattr(model, "cfg", None)
        self.sites = probes.attention_sites(model)
        self.lock = threading.RLock()
        self._recorded: Pass | None = None  # the last forward pass (_record)
        self._example: dict[str, str] | None = None
        self.recurrent_alignment = not self.sites and isinstance(model, Seq2SeqModel)
        self.recurrent_alignment &= getattr(model, "attention", "none") != "none"

    @classmethod
    def from_loaded(cls, loaded: Any, cache_dtype: str | None = None) -> Session:
        """A session of what :func:`attnlab.explore.loading.load` opened."""
        return cls(
            loaded.model,
            loaded.tokenizer,
            name=loaded.name,
            labels=loaded.labels,
            cache_dtype=cache_dtype,
            example=loaded.example,
        )

    # -- what the model is ----------------------------------------------------------------
    @property
    def seq2seq(self) -> bool:
        return isinstance(self.model, Seq2SeqModel)

    @property
    def generative(self) -> bool:
        return isinstance(self.model, (LanguageModel, Seq2SeqModel))

    @property
    def output(self) -> str | None:
        """What the model predicts: "tokens", "labels" (a classifier), "masks" (a masked LM
        fills its [MASK] tokens) or None (an encoder)."""
        if self.generative:
            return "tokens"
        if isinstance(self.model, MaskedLM):
            return "masks"
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
            "example": self.example(),
        }

    def example(self) -> dict[str, str]:
        """A first input that shows something: a sentence the tokenizer reads (a masked LM gets a
        [MASK] to fill); for seq2seq a source and, as target prefix, the model's own greedy
        output for it, so cross-attention has rows to show. Computed once."""
        if self._example is None:
            with self.lock:
                self._example = self._make_example()
        return self._example

    def _make_example(self) -> dict[str, str]:
        limit = min(getattr(self.model, "max_len", None) or 64, 64) - 3
        tried = ([self.given_example] if self.given_example else []) + list(EXAMPLES)
        text = next((t for t in tried if self._readable(t, limit)), None)
        if text is None:  # a small vocabulary (a char tokenizer): some of its own tokens
            specials = set(getattr(self.tokenizer, "specials", ()))
            n = min(self.tokenizer.vocab_size, 4096)
            ids = [i for i in range(n) if self.tokenizer.token_to_str(i) not in specials]
            text = self.tokenizer.decode(ids[: max(limit // 2, 1)]).strip()
        note = ""
        if self.output == "masks" and getattr(self.tokenizer, "mask_id", None) is not None:
            mask = self.tokenizer.token_to_str(self.tokenizer.mask_id)
            words = text.split()
            text = " ".join(words[:-1] + [mask]) if len(words) > 1 else f"{text} {mask}"
            note = f"{mask} marks the word the model fills in."
        if not self.seq2seq:
            return {"text": text, "source": "", "note": note}
        try:
            events = list(self.continuation(text="", source=text, max_new_tokens=min(limit, 20)))
            target = events[-1].get("text", "") if events else ""
            target = target if self._readable(target, limit) else ""
        except Exception:  # noqa: BLE001 - no example target is better than no page
            log.exception("explorer: the example's greedy output failed")
            target = ""
        note = (
            "Target prefix: the model's own greedy output for this source, so cross-attention "
            "shows which source tokens each output token looked at."
        )
        return {"text": target, "source": text, "note": note}

    def _readable(self, text: str, limit: int) -> bool:
        """Whether the tokenizer reads ``text`` in at most ``limit`` tokens, none unknown."""
        try:
            ids = self.tokenizer.encode(text)
        except (ValueError, KeyError, TypeError):
            return False
        unk = getattr(self.tokenizer, "unk_id", None)
        return bool(text) and len(ids) <= limit and (unk is None or unk not in ids)

    # -- input ----------------------------------------------------------------------------
    def _encode(
        self, text: Any, what: str, allow_empty: bool = False, first: int | None = None
    ) -> list[int]:
        """``text``'s token ids, with ``first`` put at position 0 unless the tokenizer already
        put it there (the target's <bos>, a classifier's class token), checked against the
        model's context with that token counted."""
        text = fields.text("source" if what == "source" else "text", text, default="")
        if not text and not allow_empty:
            raise ExploreError(f"The {what} is empty: type some text to see its attention.")
        if len(text) > 64 * MAX_TOKENS:  # no tokenizer makes fewer than 1 token per 64 chars
            raise ExploreError(
                f"The {what} is {len(text)} characters long; the explorer draws at most "
                f"{MAX_TOKENS} tokens. Shorten it."
            )
        ids: list[int] = []
        problem: str | None = None
        try:
            ids = list(self.tokenizer.encode(text))
        except ValueError as err:
            problem = str(err)  # raised below, outside the handler: nothing of it is kept
        if problem is not None:
            raise ExploreError(f"The tokenizer cannot read the {what}: {problem[:300]}")
        if not ids and not allow_empty:
            raise ExploreError(f"The {what} has no tokens: type some text.")
        if first is not None and ids[:1] != [first]:
            ids = [first] + ids
        limit = getattr(self.model, "max_len", None)
        n = len(ids)
        if limit is not None and n > limit:
            raise ExploreError(
                f"The {what} is {n} tokens long but the model accepts at most {limit}; shorten it."
            )
        if n > MAX_TOKENS:
            raise ExploreError(
                f"The {what} is {n} tokens long; the explorer draws at most {MAX_TOKENS}. "
                "Shorten it."
            )
        return ids

    def _inputs(self, text: Any, source: Any) -> dict[str, list[int]]:
        """Token ids of the request: {"target": ids} plus {"source": ids} for seq2seq."""
        if self.seq2seq:
            if source is None:
                raise ExploreError("This is a sequence-to-sequence model: give a source text.")
            bos = getattr(self.tokenizer, "bos_id", None)
            if bos is None:
                raise ExploreError("The tokenizer has no <bos> token to start the target with.")
            target = self._encode(text or "", "target", allow_empty=True, first=bos)
            return {"source": self._encode(source, "source"), "target": target}
        # Classifiers read position 0 (cls pooling) or see the text after <bos> as in training
        # (a decoder classifier reads its last token); BERT's tokenizer frames it with [CLS].
        first = None
        if isinstance(self.model, Classifier) and getattr(self.model, "pooling", "") in (
            "cls",
            "last",
        ):
            first = self._class_token()
        return {"target": self._encode(text, "input", first=first)}

    def _class_token(self) -> int:
        """The token a "cls"-pooling classifier reads its class from: <bos> for attnlab's own
        tokenizers, [CLS] for a pretrained (BERT) tokenizer."""
        tok = self.tokenizer
        if getattr(tok, "bos_id", None) is not None:
            return tok.bos_id
        cls = getattr(tok, "special_tokens", {}).get("cls")
        if cls is not None and hasattr(tok, "hf"):
            return tok.hf.token_to_id(cls)
        raise ExploreError("The tokenizer has no class token (<bos> or [CLS]) for this classifier.")

    def _labels(self, ids: list[int]) -> list[str]:
        return [self.token_label(i) for i in ids]

    def token_label(self, i: int) -> str:
        """A token's printable text; an id past the tokenizer's vocabulary (a model's padded
        embedding rows, e.g. a vocabulary rounded up) is shown as <unused i>."""
        try:
            return self.tokenizer.token_to_str(i)
        except (ValueError, IndexError, KeyError):
            return f"<unused {i}>"

    def tokens(self, text: Any = None, source: Any = None) -> dict[str, Any]:
        """The tokens as the tokenizer cut them (with their ids)."""
        inputs = self._inputs(text, source)  # the tokenizer only: no lock needed
        given = {"target": text, "source": source}
        return {
            k: {"ids": v, "tokens": self._labels(v), "unknown": self._unknown(given[k], v)}
            for k, v in inputs.items()
        }

    def _unknown(self, text: Any, ids: list[int]) -> list[str]:
        """The characters of ``text`` read as <unk>, so the page can say so (none unless its ids
        hold <unk>: the usual case costs no encoding)."""
        if getattr(self.tokenizer, "unk_id", None) not in ids or not isinstance(text, str):
            return []
        return unknown_characters(self.tokenizer, text)

    def parse_heads(self, ablate: Any) -> list[Head]:
        """[{"site", "layer", "head"}, ...] or [[site, layer, head], ...] -> checked heads."""
        if ablate in (None, ""):
            return []
        if not isinstance(ablate, list):
            raise ExploreError("ablate must be a list of heads like {site, layer, head}.")
        if len(ablate) > 10_000:
            raise ExploreError(f"ablate lists {len(ablate)} heads; a model has fewer.")
        heads = []
        for item in ablate:
            if isinstance(item, dict) and {"site", "layer", "head"} <= item.keys():
                site, layer, head = item["site"], item["layer"], item["head"]
            elif isinstance(item, list) and len(item) == 3:
                site, layer, head = item
            else:
                message = f"cannot read head {fields.shown(item)}: give site, layer and head."
                raise ExploreError(message)
            heads.append(self._check_head(site, layer, head))
        return sorted(set(heads), key=lambda x: (x.site, x.layer, x.head))

    def _check_head(self, site: Any, layer: Any, head: Any) -> Head:
        found = {s.name: s for s in self.sites}
        if not isinstance(site, str) or site not in found:
            names = ", ".join(found) or "none (this model has no attention heads)"
            raise ExploreError(
                f"Unknown attention site {fields.shown(site)}; this model has: {names}."
            )
        layer, head = (
            fields.whole("layer", layer, 0, 1 << 20),
            fields.whole("head", head, 0, 1 << 20),
        )
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
        modules: list[tuple[str, MultiHeadBase]] | None = None,
        steps: tuple[str, ...] = probes.STEP_NAMES,
        recurrent: bool = False,
    ) -> tuple[Tensor | None, dict[str, probes.Recorded], Mapping[str, Tensor]]:
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
        capturing: AbstractContextManager[Mapping[str, Tensor]] = (
            inspect.capture(model, list(names)) if names else nullcontext({})
        )
        with (
            probes.record_inputs(modules) as seen,
            capturing as cache,
            probes.last_position_only(model) if self.generative else nullcontext(),
            torch.inference_mode(),
        ):
            if isinstance(model, Seq2SeqModel):
                src = torch.tensor([inputs["source"]], device=device)  # (1, S)
                logits = model.decode(target, model.encode(src)).logits[0, -1]
            else:
                out = model(target)
                logits = None
                if isinstance(model, LanguageModel):
                    logits = out.logits[0, -1]  # (V,) the next token
                elif isinstance(model, Classifier):
                    logits = out.logits[0]  # (C,) the classes
                elif isinstance(model, MaskedLM):
                    logits = out.logits[0]  # (T, V) every position's token
        if recurrent:
            return logits, dict(seen), {n: cache[n][0] for n in names}  # batch of one
        return logits, dict(seen), cache

    # -- views ----------------------------------------------------------------------------
    def attention(self, text: Any = None, source: Any = None, ablate: Any = None) -> dict[str, Any]:
        """A (H, T, S) of every layer of every site as JSON lists, with row (query) and column
        (key) tokens. For long inputs use :meth:`overview` and :meth:`head` (the page does)."""
        with self.lock:
            inputs, heads = self._inputs(text, source), self.parse_heads(ablate)
            t, s = len(inputs["target"]), len(inputs.get("source", inputs["target"]))
            n = sum(len(x.modules) * x.modules[0][1].n_heads for x in self.sites) * t * max(t, s)
            if n > ALL_HEADS_LIMIT:
                raise ExploreError(
                    f"All heads of this input are {n:,} numbers; ask for one head at a time "
                    "(the head request) or thumbnails (the overview request), or shorten the text."
                )
            with self.ablated(heads), torch.inference_mode():
                modules = [pm for site in self.sites for pm in site.modules]
                _, seen, cache = self._forward(
                    inputs, modules, steps=("A",), recurrent=self.recurrent_alignment
                )
                alignment = cache if self.recurrent_alignment else None
                sites: dict[str, dict[str, Any]] = {}
                for site in self.sites:
                    layers = [cache[f"{path}.A"][0] for path, _ in site.modules]  # (H, T, S)
                    sites[site.name] = {"layers": [matrix(a) for a in layers]}
                    sites[site.name].update(self._axes(site.name, inputs))
        if alignment:  # alpha_l of every target step over the source (004 eq. 7)
            sites["alignment"] = {"layers": [[matrix(alignment["alpha"])]]}
            sites["alignment"].update(self._axes("cross", inputs))
        return {"sites": sites, "ablated": [h.__dict__ for h in heads]}

    def overview(self, text: Any = None, source: Any = None, ablate: Any = None) -> dict[str, Any]:
        """The model view: every head's A as a thumbnail of at most THUMB x THUMB block averages,
        uint8 scaled by its own maximum (probes.pack_scaled; "scales" holds each maximum).
        The forward pass's attention inputs are kept for :meth:`head` and :meth:`walkthrough`
        (and reused here when one of them came first)."""
        with self.lock:
            inputs, heads = self._inputs(text, source), self.parse_heads(ablate)
            sites: dict[str, Any] = {}
            if self.recurrent_alignment:
                _, _, rec = self._forward(inputs, recurrent=True)
                alpha = rec["alpha"][None, None].float()  # (1, 1, T, S)
                t, s = alpha.shape[-2:]
                thumb = F.adaptive_avg_pool2d(alpha[0], (min(t, THUMB), min(s, THUMB)))
                sites["alignment"] = {"thumbs": pack_scaled(thumb), **self._axes("cross", inputs)}
            elif self.sites:
                pooled = self._record(inputs, heads).thumbs  # made by the pass itself
                for site in self.sites:
                    maps = torch.cat([pooled[path] for path, _ in site.modules])  # (L*H, t, s)
                    sites[site.name] = {
                        "thumbs": pack_scaled(maps),
                        **self._axes(site.name, inputs),
                    }
        return {
            "sites": sites,
            "ablated": [h.__dict__ for h in heads],
            "tokens": {k: len(v) for k, v in inputs.items()},
        }

    def head(
        self,
        text: Any = None,
        source: Any = None,
        site: Any = None,
        layer: Any = 0,
        head: Any = 0,
        ablate: Any = None,
    ) -> dict[str, Any]:
        """One head's A (T, S), packed (probes.pack: float32 up to 512 x 512, else float16),
        with its row and column tokens. Only that head's module runs (on recorded inputs)."""
        with self.lock:
            inputs, heads = self._inputs(text, source), self.parse_heads(ablate)
            if self.recurrent_alignment:
                fields.whole("layer", layer, 0, 0), fields.whole("head", head, 0, 0)
                _, _, rec = self._forward(inputs, recurrent=True)
                chosen, weights = Head("alignment", 0, 0), rec["alpha"]  # (T, S)
                axes = self._axes("cross", inputs)
            else:
                chosen = self._chosen(site, layer, head)
                path, module = self._module(chosen)
                record = self._record(inputs, heads)
                if path not in record.layer:  # the module's A for all its heads, kept for the
                    with self.ablated(heads):  # next head of the same layer
                        cache = probes.replay(
                            self.model, path, module, record.seen[path], [f"{path}.A"]
                        )
                    record.layer.clear()
                    record.layer[path] = cache[f"{path}.A"][0]  # (H, T, S)
                weights = record.layer[path][chosen.head]  # (T, S)
                axes = self._axes(chosen.site, inputs)
        return {
            "head": chosen.__dict__,
            "weights": pack(weights),
            **axes,
            "ablated": [h.__dict__ for h in heads],
        }

    def neuron(
        self,
        text: Any = None,
        source: Any = None,
        site: Any = None,
        layer: Any = 0,
        head: Any = 0,
        query: Any = 0,
        key: Any = 0,
        ablate: Any = None,
    ) -> dict[str, Any]:
        """bertviz's neuron view of one weight A_ij: the query vector q_i, the key vector k_j,
        their elementwise product (which sums to the score q_i · k_j, 001; 004 eq. 9), the
        scaled score and the weight after the row's softmax. With RoPE, q and k are rotated."""
        with self.lock:
            inputs, heads = self._inputs(text, source), self.parse_heads(ablate)
            if self.recurrent_alignment or not self.sites:
                raise ExploreError("The neuron view needs a Transformer head (q_i · k_j).")
            chosen = self._chosen(site, layer, head)
            axes = self._axes(chosen.site, inputs)
            i = fields.whole("query", query, 0, len(axes["rows"]) - 1)
            j = fields.whole("key", key, 0, len(axes["cols"]) - 1)
            path, module, _, cache = self._replay(
                chosen, inputs, heads, ("Q", "K", "scores", "scaled", "A")
            )
        rotary = f"{path}.Q_rot" in cache
        h = chosen.head
        q = cache[f"{path}.Q_rot" if rotary else f"{path}.Q"][0, h, i]  # (Dk,)
        keys = cache[f"{path}.K_rot" if rotary else f"{path}.K"][0]  # (H_kv, S, Dk)
        k = per_query_head(keys, module.n_heads)[h, j]  # (Dk,): head h's key/value head
        factor = float(scale_factor(module.scale, q.size(-1)))
        bias = position_bias(module)[0]  # ALiBi's term of the logits, '' for other schemes
        return {
            "head": chosen.__dict__,
            "query": i,
            "key": j,
            "query_token": axes["rows"][i],
            "key_token": axes["cols"][j],
            "rotated": rotary,
            "q": matrix(q),
            "k": matrix(k),
            "product": matrix(q * k),  # q_i ∘ k_j; its sum is the score
            "score": matrix(cache[f"{path}.scores"][0, h, i, j]),
            "scaled": matrix(cache[f"{path}.scaled"][0, h, i, j]),
            "weight": matrix(cache[f"{path}.A"][0, h, i, j]),
            "factor": factor,
            # how scaled follows from the score: the walkthrough's equation, in numbers
            "scaled_equation": scaled_equation(module, factor, q.size(-1), bias),
        }

    def _chosen(self, site: Any, layer: Any, head: Any) -> Head:
        if not self.sites:
            raise ExploreError("This model has no attention heads to show.")
        return self._check_head(self.sites[0].name if site is None else site, layer, head)

    def _module(self, head: Head) -> tuple[str, MultiHeadBase]:
        return {s.name: s for s in self.sites}[head.site].modules[head.layer]

    def _replay(
        self,
        chosen: Head,
        inputs: dict[str, list[int]],
        heads: list[Head],
        steps: tuple[str, ...],
    ) -> tuple[str, MultiHeadBase, probes.Recorded, inspect.ActivationCache]:
        """``chosen``'s attention module run again alone on what it received in the recorded
        pass of ``inputs`` (``heads`` switched off), capturing its ``steps``: the module's path,
        the module, its recorded inputs and the cache."""
        path, module = self._module(chosen)
        rec = self._record(inputs, heads).seen[path]
        with self.ablated(heads):
            cache = probes.replay(
                self.model, path, module, rec, probes.step_names(path, module, steps)
            )
        return path, module, rec, cache

    def _record(self, inputs: dict[str, list[int]], heads: list[Head]) -> Pass:
        """One forward pass of ``inputs`` with ``heads`` switched off, up to the last attention
        module: what every attention module received, and every head's A block-averaged to
        thumbnails as it is made. The last pass is kept and reused when a request asks for the
        same input and ablation (one pass kept: nothing accumulates)."""
        key = (tuple(inputs["target"]), tuple(inputs.get("source", ())), tuple(heads))
        if self._recorded is None or self._recorded.key != key:
            self._recorded = None  # free the old pass before making the new one
            modules = [pm for site in self.sites for pm in site.modules]
            device = _device(self.model)
            target = torch.tensor([inputs["target"]], device=device)  # (1, T)
            src = torch.tensor([inputs["source"]], device=device) if self.seq2seq else None
            with (
                self.ablated(heads),
                torch.inference_mode(),
                probes.record_inputs(modules) as seen,
                probes.pooled_weights(modules, THUMB) as pooled,
                probes.stop_after(modules),  # nothing after the last attention is needed
            ):
                try:
                    if isinstance(self.model, Seq2SeqModel) and src is not None:
                        self.model.decode(target, self.model.encode(src))
                    else:
                        self.model(target)
                except probes.Enough:
                    pass
            self._recorded = Pass(key, dict(seen), dict(pooled), {})
        return self._recorded

    def _axes(self, site: str, inputs: dict[str, list[int]]) -> dict[str, list[str]]:
        rows = inputs["source"] if site == "encoder" and self.seq2seq else inputs["target"]
        cols = inputs["source"] if site in ("encoder", "cross") and self.seq2seq else rows
        return {"rows": self._labels(rows), "cols": self._labels(cols)}

    def walkthrough(
        self,
        text: Any = None,
        source: Any = None,
        site: Any = None,
        layer: Any = 0,
        head: Any = 0,
        ablate: Any = None,
        compact: Any = False,
    ) -> dict[str, Any]:
        """The chosen head's equation step by step with its actual numbers (walkthrough.py),
        with ``ablate``'s heads switched off as in every other view. ``compact``: values packed
        (probes.pack) instead of JSON lists."""
        if not isinstance(compact, bool):
            raise ExploreError(f"compact must be true or false, got {fields.shown(compact)}.")
        with self.lock:
            inputs, heads = self._inputs(text, source), self.parse_heads(ablate)
            if self.recurrent_alignment:
                return self._values(self._bahdanau_walkthrough(inputs, heads), compact)
            if not self.sites:
                raise ExploreError("This model has no attention to walk through.")
            chosen = self._chosen(site, layer, head)
            path, module, rec, cache = self._replay(chosen, inputs, heads, probes.STEP_NAMES)
            steps = probes.cached_steps(module, path, rec, cache)
            axes = self._axes(chosen.site, inputs)
            result = {
                "head": chosen.__dict__,
                "module": path,
                "steps": walkthrough_steps(
                    steps, module, chosen, axes, self.cfg, switched_off=chosen in heads
                ),
                "ablated": [h.__dict__ for h in heads],
            }
        return self._values(result, compact)

    @staticmethod
    def _values(result: dict[str, Any], compact: bool) -> dict[str, Any]:
        """The steps' tensors as JSON lists, or packed (``compact``)."""
        for step in result["steps"]:
            v = step["values"]
            if isinstance(v, torch.Tensor):
                v = v.to(torch.float64) if v.dtype == torch.bool and not compact else v
                step["values"] = pack(v) if compact else matrix(v)
        return result

    def _bahdanau_walkthrough(self, inputs, heads) -> dict[str, Any]:
        with self.ablated(heads):
            _, _, recurrent = self._forward(inputs, recurrent=True)
        axes = self._axes("cross", inputs)
        head = Head("alignment", 0, 0)
        assert isinstance(self.model, LSTMSeq2Seq)  # the one recurrent attention (Bahdanau's)
        steps = bahdanau_steps(recurrent, axes, self.model.attention)
        return {"head": head.__dict__, "module": "", "steps": steps, "ablated": []}

    def positions(self, text: Any = None, source: Any = None) -> dict[str, Any]:
        """The position signal each embedding adds for these tokens (walkthrough.py). Reads
        parameters only, so it needs no lock."""
        inputs = self._inputs(text, source)
        result = positions_view(self.model, self.cfg, inputs, self._labels)
        for view in result["views"]:  # a view built with walkthrough._step holds a tensor
            if isinstance(view.get("values"), torch.Tensor):
                view["values"] = matrix(view["values"].to(torch.float64))
        return result


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")
