"""What the decoder-only Hugging Face families (GPT-2, Llama-like, Gemma) share beyond their
:class:`~attnlab.interop.family.Family` tables: writing config.json with the token ids, and
copying a ``...ForCausalLM`` state dict into a :class:`DecoderLM` and back, or a
``...ForSequenceClassification`` one into a :class:`DecoderClassifier`.

A :class:`CausalLM` names, as data, the families that share one file layout (Llama, Qwen2 and
Qwen3 do; so do Gemma 1, 2 and 3), the embedding tensor a tied output head equals, and the
family's config reader. The two heads are the same in every one of them (:func:`head_rows`):

    logits = LN_f(x_N) W_head,   W_head = E (tied) or lm_head.weight (untied)    language model
    logits = W_score LN_f(x_N)[last],   W_score = score.weight (no bias)         classifier

config.json's ``architectures`` says which (:func:`architecture_key`), and a classifier's
``id2label`` its classes. A tied file may store the LM head (it must then equal the embedding) or
leave it out; export always writes it, as the same tensor as the embedding (as ``transformers``
does). Hugging Face's classifiers find the last real token from ``pad_token_id``, so export
always writes one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.interop.family import (
    PROBLEM_TYPE,
    Family,
    Key,
    closest_family,
    label_key,
    label_maps,
    label_problems,
)
from attnlab.interop.weights_map import (
    Mapped,
    export_mapped,
    load_mapped,
    model_to_load,
    tied_head,
)
from attnlab.models.build import build_model
from attnlab.models.decoder_classifier import DecoderClassifier
from attnlab.models.lm import DecoderLM

HEAD = "lm_head.weight"
SCORE = "score.weight"
CLASSIFIER_SUFFIX = "ForSequenceClassification"
DecoderModel = DecoderLM | DecoderClassifier


def is_sequence_classifier(data: Mapping[str, Any]) -> bool:
    """Whether config.json's ``architectures`` names a ``...ForSequenceClassification``."""
    return str((data.get("architectures") or [""])[0]).endswith(CLASSIFIER_SUFFIX)


def _kind(value: Any, data: dict[str, Any]) -> str:
    return "decoder_classifier" if is_sequence_classifier(data) else "decoder_lm"


def architecture_key(
    lm: Callable[[ModelConfig], str], classifier: Callable[[ModelConfig], str]
) -> Key:
    """config.json's ``architectures`` <-> ``kind``: the family's LM class (``lm(cfg)``, e.g.
    LlamaForCausalLM) for a decoder_lm, its ``classifier(cfg)`` (LlamaForSequenceClassification)
    for a decoder_classifier; a config without the key is a language model."""

    def write(cfg: ModelConfig) -> list[str]:
        return [classifier(cfg) if cfg.kind == "decoder_classifier" else lm(cfg)]

    return Key("architectures", "kind", write, _kind, default=None)


# The keys of a decoder classifier's config.json beside the architecture: its classes.
CLASSIFIER_KEYS = (label_key(is_sequence_classifier), PROBLEM_TYPE)


# The heads every decoder family holds, for the importers' "attnlab supports ..." line.
HEADS = "a language-model head or a single-label ...ForSequenceClassification head (2+ classes)"


def classifier_problems(data: Mapping[str, Any]) -> list[str]:
    """For an importer's problem list: what a ``...ForSequenceClassification`` config asks that
    attnlab's classifiers cannot do (nothing for a language model)."""
    return label_problems(data) if is_sequence_classifier(data) else []


def head_rows(cfg: ModelConfig) -> list[Mapped]:
    """The output head's row of a decoder family's tensor table: ``score`` (the classifier's
    W_score), or the LM head when it is not tied to the embedding (none when tied)."""
    if cfg.kind == "decoder_classifier":
        return [Mapped.one(SCORE, "head.weight")]
    return [] if cfg.tie_embeddings else [Mapped.one(HEAD, HEAD)]


class CausalLM(NamedTuple):
    """Decoder-only families that share one file layout, and how their files are read."""

    families: tuple[Family, ...]  # the first names them in errors before one is chosen
    embedding: str  # the token embedding E that a tied head equals: "model.embed_tokens.weight"
    convert: Callable[[Any], ModelConfig]  # a transformers config / config.json dict -> ours
    loader: str  # the public loader's name, for its errors: "load_gpt2_state_dict"
    ignored: re.Pattern | None = None  # buffers that files store beside the weights

    def family(self, cfg: ModelConfig) -> Family:
        """The family whose round trip keeps ``cfg`` (ConfigError naming what it cannot hold)."""
        return closest_family(cfg, self.families)

    def config_json(
        self, cfg: ModelConfig, ids: Mapping[str, int | None], labels: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """The config.json dict of ``cfg`` with the tokenizer's special ``ids`` (``bos_id``,
        ``eos_id``, ``pad_id``: each may be None or absent) and a classifier's ``labels`` (names
        in id order); ConfigError, before anything is written, when no family holds ``cfg``."""
        out = self.family(cfg).write(cfg)
        out.update(bos_token_id=ids.get("bos_id"), eos_token_id=ids.get("eos_id"))
        if ids.get("pad_id") is not None:
            out["pad_token_id"] = ids["pad_id"]
        if cfg.kind == "decoder_classifier":
            out.update(label_maps(cfg.n_classes or 0, labels))
        return out

    def load(
        self, model: DecoderModel | None, state_dict: Mapping[str, Tensor], config: Any = None
    ) -> DecoderModel:
        """Copy a Hugging Face state dict into ``model``, or into a new DecoderLM (or
        DecoderClassifier, by ``architectures``) built from ``config`` (an attnlab ModelConfig, a
        transformers config, or config.json's dict). Every tensor is shape-checked; missing and
        unexpected keys are errors. Eval mode."""
        start: nn.Module | None = model  # build_model may make either kind
        loaded = model_to_load(
            start,
            config,
            loader=self.loader,
            convert=self.convert,
            check=self.family,
            build=build_model,
            family=self.families[0].name,
            cls=(DecoderLM, DecoderClassifier),
        )
        if not isinstance(loaded, DecoderLM | DecoderClassifier):  # model_to_load checked it
            raise TypeError(
                f"{self.loader} loads into a DecoderLM or DecoderClassifier, got "
                f"{type(loaded).__name__}"
            )
        family = self.family(loaded.cfg)
        tensors = dict(state_dict)
        if isinstance(loaded, DecoderLM):
            tied_head(tensors, HEAD, self.embedding, loaded.cfg.tie_embeddings, family.name)
        table = family.table(loaded.cfg)
        return load_mapped(loaded, tensors, table, family.name, ignored=self.ignored)

    def export(self, model: DecoderModel) -> dict[str, Tensor]:
        """The Hugging Face state dict of ``model`` (fresh tensors; with tied embeddings the LM
        head is the same tensor as the embedding)."""
        if not isinstance(model, DecoderLM | DecoderClassifier):
            name = self.families[0].name
            raise TypeError(
                f"only a DecoderLM or DecoderClassifier exports to {name}, got "
                f"{type(model).__name__}"
            )
        family = self.family(model.cfg)
        out = export_mapped(model, family.table(model.cfg), family.name)
        if isinstance(model, DecoderLM) and model.cfg.tie_embeddings:
            out[HEAD] = out[self.embedding]
        return out
