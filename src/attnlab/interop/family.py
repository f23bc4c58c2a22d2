"""A Hugging Face model family as one declarative table, and export by round trip.

A :class:`Family` says, as data, how a ``config.json`` and an attnlab :class:`ModelConfig` map
onto each other (one :class:`Key` row per ``config.json`` key, both directions), which
ModelConfig settings the architecture fixes (``fixed``), and which Hugging Face tensor holds each
attnlab tensor (``table``: rows of :class:`~attnlab.interop.weights_map.Mapped`).

The rule that decides export (one truth, no hand-kept list of fields to compare):

    cfg is exportable to family F  <=>  from_F(to_F(cfg)) == cfg   over ALL ModelConfig fields

compared in :func:`canonical` form, which writes derived sizes one way (``d_ff`` explicit,
``n_kv_heads = None`` for one key/value head per query head, ...) and resets the settings that
change nothing about the network (the rotary base of a model without rotary positions, the
hard-attention gradient of a softmax model, the engine choice ``fast``). ``widens`` names the
settings a family stores in a more general form: GPT-2 and BERT always store every bias, so a
bias-free model is written with zero biases and reads back as ``bias=True``, the same function.

Export refuses everything else BEFORE writing, with one message that names every field the
family cannot hold and the families that would hold it (:func:`check_exportable`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from attnlab.config import CLASSIFIER_KINDS, TRANSFORMER_KINDS, ModelConfig
from attnlab.errors import ConfigError
from attnlab.interop.weights_map import Mapped

OMIT = object()  # a Key.write result: leave the key out of config.json
_DEFAULTS = ModelConfig().to_dict()


class Key(NamedTuple):
    """One ``config.json`` key <-> the ModelConfig field(s) it carries.

    ``write(cfg)`` gives the value written (default: the field itself; :data:`OMIT` leaves the key
    out); ``read(value, data)`` gives the field value, or a tuple of values for several ``ours``
    fields (default: the value itself). ``default`` is what a config.json without the key means
    (Hugging Face's default); a key without one is required on import.
    """

    hf: str
    ours: str | tuple[str, ...]
    write: Callable[[ModelConfig], Any] | None = None
    read: Callable[[Any, dict[str, Any]], Any] | None = None
    default: Any = OMIT

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.ours,) if isinstance(self.ours, str) else self.ours


@dataclasses.dataclass(frozen=True)
class Family:
    """A Hugging Face family: its config keys, the settings it fixes, and its tensor table."""

    name: str  # as people write it: "GPT-2"
    export_name: str  # what users choose to export to, and the REGISTRY key: "gpt2"
    keys: Sequence[Key]  # config.json <-> ModelConfig, both directions
    fixed: Mapping[str, Any]  # ModelConfig fields the architecture pins
    table: Callable[[ModelConfig], list[Mapped]]  # HF tensor name(s) <-> attnlab tensor
    kinds: tuple[str, ...] = ("decoder_lm",)  # the attnlab kinds it holds
    widens: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # stored more generally

    def write(self, cfg: ModelConfig) -> dict[str, Any]:
        """to_F: the config.json dict of ``cfg`` (total: writes what the family can hold)."""
        out: dict[str, Any] = {}
        for key in self.keys:
            if key.write is not None:
                value = key.write(cfg)
            else:  # a key carrying several fields writes them with its own ``write``
                (field,) = key.fields
                value = getattr(cfg, field)
            if value is not OMIT:
                out[key.hf] = value
        return out

    def read_fields(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """from_F without validation: the ModelConfig fields that ``data`` (config.json) gives."""
        data = dict(data)
        required = [k.hf for k in self.keys if k.default is OMIT]
        missing = [k for k in required if k not in data]
        if missing:
            raise ConfigError(
                f"the {self.name} config is missing {missing}; expected keys {required}"
            )
        fields: dict[str, Any] = dict(self.fixed)
        for key in self.keys:
            if not key.fields:
                continue  # written only (a second dropout rate, the model_type, ...)
            value = data.get(key.hf, key.default)
            got = key.read(value, data) if key.read is not None else value
            fields.update(zip(key.fields, got if len(key.fields) > 1 else (got,), strict=True))
        return fields

    def read(self, data: Mapping[str, Any]) -> ModelConfig:
        """from_F: the ModelConfig of config.json's dict (ConfigError when it is not valid)."""
        try:
            return ModelConfig(**self.read_fields(data))
        except (TypeError, ValueError) as err:
            raise ConfigError(
                f"the {self.name} config does not make a valid attnlab model: {err}"
            ) from None

    def round_trip(self, cfg: ModelConfig) -> tuple[dict[str, Any], dict[str, Any]]:
        """(canonical ``cfg`` as this family would store it, canonical ``read(write(cfg))``)."""
        want = {**canonical(cfg), **self.widens}
        fields = {**_DEFAULTS, **self.read_fields(self.write(cfg))}
        try:
            return want, canonical(ModelConfig(**fields))
        except (TypeError, ValueError):  # an invalid combination: compare the raw fields
            return want, fields

    def lost_fields(self, cfg: ModelConfig) -> dict[str, Any]:
        """{field: value it comes back as} for every field of ``cfg`` (canonical form) that the
        round trip ``read(write(cfg))`` does not return (empty: exportable)."""
        if cfg.kind not in self.kinds:
            return {"kind": self.kinds[0]}
        want, back = self.round_trip(cfg)
        return {name: back[name] for name in want if back[name] != want[name]}


def as_float(value: Any, data: dict[str, Any]) -> float:
    """A Key reader: the value as a float (JSON writes 0.0 as 0)."""
    return float(value)


def as_bool(value: Any, data: dict[str, Any]) -> bool:
    """A Key reader: the value as a bool."""
    return bool(value)


def pad_token(value: Any, data: dict[str, Any]) -> int:
    """A Key reader: config.json's pad_token_id as attnlab's pad_id (0 when absent or outside
    the vocabulary)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < data["vocab_size"]
    return value if ok else 0


# The keys that several families spell the same way.
PAD_ID = Key("pad_token_id", "pad_id", read=pad_token, default=None)


def tie_key(default: bool) -> Key:
    """The ``tie_word_embeddings`` key; ``default`` is the family's (GPT-2 ties, Llama does not)."""
    return Key("tie_word_embeddings", "tie_embeddings", read=as_bool, default=default)


# A classifier's config.json keys (BERT's and the decoders' ...ForSequenceClassification).
def label_key(is_classifier: Callable[[dict[str, Any]], bool]) -> Key:
    """``id2label`` <-> ``n_classes``: written as placeholder names (export replaces them with
    the labels, :func:`label_maps`), read as the number of labels when ``is_classifier(data)``
    says config.json describes a classifier (None otherwise: every config has an id2label)."""

    def read(value: Any, data: dict[str, Any]) -> int | None:
        if not is_classifier(data):
            return None
        return len(value or {}) or data.get("num_labels")

    return Key("id2label", "n_classes", _placeholder_labels, read, default=None)


def _placeholder_labels(cfg: ModelConfig) -> Any:
    if cfg.kind not in CLASSIFIER_KINDS:
        return OMIT
    return {str(i): f"LABEL_{i}" for i in range(cfg.n_classes or 0)}


PROBLEM_TYPE = Key(
    "problem_type",
    (),
    lambda c: "single_label_classification" if c.kind in CLASSIFIER_KINDS else OMIT,
    default=None,
)


def label_maps(n_classes: int, labels: Sequence[str] | None) -> dict[str, Any]:
    """config.json's ``id2label`` and ``label2id`` for ``labels`` (names in id order; default
    LABEL_0, LABEL_1, ...)."""
    names = list(labels or [f"LABEL_{i}" for i in range(n_classes)])
    return {
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }


def label_problems(data: Mapping[str, Any]) -> list[str]:
    """What a classifier's config.json asks that attnlab's classifiers cannot do (for the
    importers' problem lists): several labels per example, or fewer than two classes."""
    problems = []
    if data.get("problem_type") not in (None, "single_label_classification"):
        problems.append(f"problem_type={data['problem_type']!r} (single-label only)")
    n_classes = len(data.get("id2label") or {}) or data.get("num_labels")
    if not n_classes or n_classes < 2:
        problems.append(f"num_labels={n_classes} (a classifier needs at least 2)")
    return problems


REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add ``family`` to :data:`REGISTRY` (each family module registers its table on import)."""
    REGISTRY[family.export_name] = family
    return family


def canonical(cfg: ModelConfig) -> dict[str, Any]:
    """``cfg``'s fields with derived sizes written one way and inert settings at their defaults.

    Two configs with equal canonical forms build the same network (same tensors, same function).
    """
    d = cfg.to_dict()

    def reset(*names: str) -> None:
        d.update({name: _DEFAULTS[name] for name in names})

    reset("fast")  # the engine, not the network
    if cfg.kind not in TRANSFORMER_KINDS:
        return d
    reset("rnn_attention", "reverse_source", "bidirectional", "d_attn", "ffn_mult")
    d["d_ff"] = cfg.ff_dim
    d["d_head"] = None if cfg.head_dim * cfg.n_heads == cfg.d_model else cfg.head_dim
    d["d_v"] = None if cfg.value_dim == cfg.head_dim else cfg.value_dim
    d["n_kv_heads"] = None if cfg.kv_heads == cfg.n_heads else cfg.kv_heads
    if cfg.norm == "rmsnorm":  # ``bias`` then only sets the defaults of attn_bias and ffn_bias
        d["bias"] = False
    d["attn_bias"] = None if cfg.attention_bias == d["bias"] else cfg.attention_bias
    d["ffn_bias"] = None if cfg.feedforward_bias == d["bias"] else cfg.feedforward_bias
    out_bias = cfg.attention_out_bias
    d["attn_out_bias"] = None if out_bias == cfg.attention_bias or not cfg.out_proj else out_bias
    if cfg.full_attn_every is not None and cfg.full_attn_every > cfg.n_layers:
        reset("full_attn_every")  # no layer is a k-th one: every layer slides
    if cfg.kind != "encoder_decoder":
        reset("tgt_vocab_size", "n_decoder_layers")
    if cfg.kind not in CLASSIFIER_KINDS:
        reset("n_classes")
    if cfg.kind != "classifier":
        reset("pooling")  # a decoder_classifier always reads its last token
    if cfg.kind in ("encoder", *CLASSIFIER_KINDS):
        reset("tie_embeddings")  # no output head to tie
    if cfg.attention != "hardmax":
        reset("straight_through")
    rope_scaled = ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor")
    if cfg.positional != "rotary":
        reset("rope_base", "rope_scaling", *rope_scaled, "rope_original_max_len")
    elif cfg.rope_scaling == "none":
        reset(*rope_scaled, "rope_original_max_len")
    elif cfg.rope_scaling == "linear":
        reset(*rope_scaled[1:], "rope_original_max_len")
    return d


# What a field's non-default value is, in words, for the error ("GPT-2 has no grouped KV heads").
NOUNS = {
    "n_kv_heads": "grouped KV heads",
    "d_head": "head widths other than d_model / n_heads",
    "d_v": "value widths other than d_head",
    "ffn": "gated feed-forward layers",
    "attn_window": "sliding-window attention",
    "full_attn_every": "sliding-window layers mixed with full ones",
    "attn_logit_softcap": "attention logit soft-capping",
    "final_logit_softcap": "final logit soft-capping",
    "embed_norm": "norm on the embeddings",
    "embed_scale": "embedding scaling by sqrt(d_model)",
    "n_token_types": "token-type (segment) embeddings",
    "qk_norm": "query/key norms",
    "attention": "hard attention",
}


def check_exportable(family: Family, cfg: ModelConfig) -> None:
    """Raise ConfigError naming every field of ``cfg`` that ``family`` cannot hold, each with the
    families (in :data:`REGISTRY`) whose round trip keeps it; return None when it can."""
    lost = family.lost_fields(cfg)
    if not lost:
        return
    others = {f.export_name: f.lost_fields(cfg) for f in REGISTRY.values() if f is not family}
    others = {n: their_lost for n, their_lost in others.items() if "kind" not in their_lost}
    parts = []
    for name, back in lost.items():
        holders = [n for n, their_lost in others.items() if name not in their_lost]
        fits = [n for n in holders if not others[n]]
        value = cfg.kind if name == "kind" else family.round_trip(cfg)[0][name]
        part = f"{name}={value!r} ({family.name} needs {back!r})"
        if name in NOUNS and value != _DEFAULTS[name]:
            part += f": {family.name} has no {NOUNS[name]}"
        if fits:
            part += f", export to {fits[0]} instead"
        elif holders:
            part += f", {', '.join(holders)} can hold it"
        else:
            part += ", no Hugging Face family attnlab writes holds it"
        parts.append(part)
    raise ConfigError(
        f"this model cannot be written as {family.name} without changing it, so nothing was "
        f"written: " + "; ".join(parts) + " (the safetensors export holds every model)"
    )


def family_for(cfg: ModelConfig) -> Family:
    """The registered family that holds ``cfg`` exactly, else ConfigError naming, for the
    family closest to it (fewest lost fields), every field it cannot hold."""
    candidates = [f for f in REGISTRY.values() if cfg.kind in f.kinds]
    if not candidates:
        kinds = sorted({k for f in REGISTRY.values() for k in f.kinds})
        raise ConfigError(
            f"a {cfg.kind!r} model has no Hugging Face counterpart in attnlab (it writes "
            f"{kinds}); export it to safetensors instead"
        )
    return closest_family(cfg, candidates)


def closest_family(cfg: ModelConfig, families: Sequence[Family]) -> Family:
    """The one of ``families`` that holds ``cfg`` exactly (the first of equals), else ConfigError
    naming, for the closest of them (fewest lost fields), every field it cannot hold."""
    closest = min(families, key=lambda f: len(f.lost_fields(cfg)))
    check_exportable(closest, cfg)
    return closest
