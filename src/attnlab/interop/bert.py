"""Hugging Face BERT (``BertModel``, ``BertForSequenceClassification``, ``BertForMaskedLM``) <->
attnlab's encoder, classifier and masked-LM kinds.

BERT (Devlin et al. 2019) is the post-norm Transformer encoder of 000/003 with three additions:

    x_0 = LN_emb(E w + P_pos + T_type)       embeddings.{word,position,token_type}_embeddings,
                                             embeddings.LayerNorm -> embed.{tok_emb,pos_enc,
                                             type_emb,norm}
    h   = LN_1(x + W^O MultiHead(x))         attention.self.{query,key,value}, attention.output
    x'  = LN_2(h + W_2 GELU(W_1 h))          intermediate.dense, output.dense, output.LayerNorm
    pooled = tanh(W_p x_N[CLS] + b_p)        pooler.dense -> encoder.pooler (classifier input)
    MLM logits = LN(GELU(W_t x_N)) E^T + b   cls.predictions.* (masked-token filling)

``BertForSequenceClassification`` -> kind "classifier" (pooling "cls" through the pooler), its
``classifier`` -> ``head``. ``BertForMaskedLM`` (and the pre-training checkpoints most BERT
directories hold) -> kind "masked_lm"; the next-sentence head ``cls.seq_relationship`` has no
attnlab counterpart and is skipped (named in :data:`SKIPPED`).

Shapes: D hidden_size, H heads, F intermediate_size, V vocab, N max_position_embeddings, Y types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.interop.family import (
    OMIT,
    PAD_ID,
    PROBLEM_TYPE,
    Family,
    Key,
    as_float,
    check_exportable,
    label_key,
    label_maps,
    label_problems,
    register,
)
from attnlab.interop.gpt2 import ALL_BIASES, LEARNED_LAYERNORM
from attnlab.interop.weights_map import (
    Mapped,
    config_dict,
    export_mapped,
    load_mapped,
    model_to_load,
    problems_message,
)
from attnlab.models.base import config_of
from attnlab.models.build import build_model

# Buffers (not parameters) and the next-sentence-prediction head: present in files, not mapped.
SKIPPED = re.compile(r"(embeddings\.position_ids|embeddings\.token_type_ids|cls\.seq_relationship)")
ARCHITECTURES = {
    "encoder": "BertModel",
    "classifier": "BertForSequenceClassification",
    "masked_lm": "BertForMaskedLM",
}
PRETRAINING = "BertForPreTraining"  # a masked LM with the pooler (its NSP head is skipped)
_ACT = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
_ACT_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
SUPPORTED = (
    "BERT encoders with absolute positions, activations " + ", ".join(sorted(_ACT)) + ", and "
    "the BertModel, BertForSequenceClassification (single-label) and BertForMaskedLM heads"
)


def bert_kind(data: dict[str, Any]) -> str:
    """The attnlab kind for a config's ``architectures`` (default: the bare encoder)."""
    arch = (data.get("architectures") or ["BertModel"])[0]
    if arch in ("BertForMaskedLM", PRETRAINING):
        return "masked_lm"
    if arch == "BertForSequenceClassification":
        return "classifier"
    if arch == "BertModel":
        return "encoder"
    raise ConfigError(
        f"BERT architecture {arch!r} is not supported; attnlab imports "
        f"{sorted(set(ARCHITECTURES.values()) | {PRETRAINING})}"
    )


def _architecture(cfg: ModelConfig) -> list[str]:
    if cfg.kind == "masked_lm" and cfg.pooler:
        return [PRETRAINING]
    return [ARCHITECTURES.get(cfg.kind, "BertModel")]


def _kind_and_pooler(value: Any, data: dict[str, Any]) -> tuple[str, bool]:
    """BertModel and ...ForSequenceClassification pool; a masked LM only as BertForPreTraining."""
    kind = bert_kind(data)
    return kind, kind != "masked_lm" or (value or [""])[0] == PRETRAINING


def _is_classifier(data: dict[str, Any]) -> bool:
    return bert_kind(data) == "classifier"


def _hidden_act(cfg: ModelConfig) -> str:
    return _ACT_OUT.get(cfg.activation, "gelu")


def _activation(value: Any, data: dict[str, Any]) -> str:
    return _ACT[value]


# config.json <-> ModelConfig, both directions (attnlab.interop.family).
KEYS = (
    Key("model_type", (), lambda c: "bert", default=None),
    Key("architectures", ("kind", "pooler"), _architecture, _kind_and_pooler, default=None),
    Key("vocab_size", "vocab_size"),
    Key("hidden_size", "d_model"),
    Key("num_hidden_layers", "n_layers"),
    Key("num_attention_heads", "n_heads"),
    Key("intermediate_size", "d_ff", lambda c: c.ff_dim),
    Key("hidden_act", "activation", _hidden_act, _activation, default="gelu"),
    Key("hidden_dropout_prob", "dropout", read=as_float, default=0.0),
    Key("attention_probs_dropout_prob", (), lambda c: c.dropout, default=None),
    Key("max_position_embeddings", "max_len", default=512),
    # BERT always has segment embeddings: a model without them is refused (it reads back as 2).
    Key("type_vocab_size", "n_token_types", lambda c: c.n_token_types or OMIT, default=2),
    Key("layer_norm_eps", "norm_eps", read=as_float, default=1e-12),
    Key("position_embedding_type", (), lambda c: "absolute", default=None),
    PAD_ID,
    # transformers ties BERT's masked-LM decoder to the word embeddings whatever config.json says
    # (measured with 5.24: an untied export loaded tied), so an untied masked LM is refused.
    Key("tie_word_embeddings", "tie_embeddings", lambda c: OMIT, default=True),
    label_key(_is_classifier),
    PROBLEM_TYPE,
)
# BERT's encoder: post-norm LayerNorm blocks, a norm on the embeddings, no final norm.
FIXED = {
    **LEARNED_LAYERNORM,
    "norm_placement": "post",
    "final_norm": False,
    "embed_norm": True,
    "pooling": "cls",
}


def bert_config_to_model_config(hf_config: Any, kind: str | None = None) -> ModelConfig:
    """A BertConfig (or config.json's dict) -> ModelConfig of ``kind`` (default: from
    ``architectures``). Raises ConfigError listing every setting that does not map."""
    data = config_dict(hf_config, "BertConfig")
    if data.get("model_type", "bert") != "bert":
        raise ConfigError(f"model_type={data['model_type']!r} is not BERT")
    if kind is not None:
        data["architectures"] = [ARCHITECTURES[kind]]
    kind = bert_kind(data)
    problems = []
    act = data.get("hidden_act", "gelu")
    if act not in _ACT:
        problems.append(f"hidden_act={act!r}")
    pos = data.get("position_embedding_type", "absolute")
    if pos != "absolute":
        problems.append(f"position_embedding_type={pos!r} (attnlab has absolute positions)")
    if data.get("is_decoder") or data.get("add_cross_attention"):
        problems.append("is_decoder / add_cross_attention (attnlab imports BERT as an encoder)")
    if kind == "classifier":
        problems += label_problems(data)
    if problems:
        raise ConfigError(problems_message("BERT", problems, SUPPORTED))
    return BERT.read(data)


def check_bert_compatible(cfg: ModelConfig) -> None:
    """Raise ConfigError naming every setting of ``cfg`` that does not survive the round trip
    through BERT's config, and the family that would hold it."""
    check_exportable(BERT, cfg)


def model_config_to_bert_config(cfg: ModelConfig, labels: list[str] | None = None) -> dict:
    """The config.json dict ``transformers.BertConfig`` reads for ``cfg``."""
    check_exportable(BERT, cfg)
    out = BERT.write(cfg)
    if cfg.kind == "classifier":
        out.update(label_maps(cfg.n_classes or 0, labels))
    return out


def _pairs(*names: tuple[str, str]) -> list[Mapped]:
    """Weight and bias rows for (HF module, attnlab module) pairs (BERT always has the bias)."""
    return [
        Mapped.one(f"{h}.{p}", f"{o}.{p}", zero=p == "bias")
        for h, o in names
        for p in ("weight", "bias")
    ]


def bert_table(cfg: ModelConfig) -> list[Mapped]:
    """Hugging Face name(s) -> attnlab name for every tensor of a BERT model of ``cfg``."""
    hf = "bert." if cfg.kind != "encoder" else ""
    ours = "encoder." if cfg.kind != "encoder" else ""
    e, d = f"{hf}embeddings.", cfg.d_model
    table = [
        Mapped.one(e + "word_embeddings.weight", ours + "embed.tok_emb.weight"),
        Mapped.one(e + "position_embeddings.weight", ours + "embed.pos_enc.table.weight"),
        Mapped.one(e + "token_type_embeddings.weight", ours + "embed.type_emb.weight"),
        *_pairs((e + "LayerNorm", ours + "embed.norm")),
    ]
    for i in range(cfg.n_layers):
        h, b = f"{hf}encoder.layer.{i}.", f"{ours}stack.blocks.{i}."
        for p in ("weight", "bias"):
            qkv = tuple(f"{h}attention.self.{n}.{p}" for n in ("query", "key", "value"))
            table.append(Mapped(qkv, f"{b}self_attn.qkv_proj.{p}", (d, d, d), zero=p == "bias"))
        table += _pairs(
            (h + "attention.output.dense", b + "self_attn.out_proj"),
            (h + "attention.output.LayerNorm", b + "self_attn_norm"),
            (h + "intermediate.dense", b + "ffn.up"),
            (h + "output.dense", b + "ffn.down"),
            (h + "output.LayerNorm", b + "ffn_norm"),
        )
    if cfg.pooler:
        table += _pairs((f"{hf}pooler.dense", ours + "pooler"))
    if cfg.kind == "classifier":
        table += _pairs(("classifier", "head"))
    if cfg.kind == "masked_lm":
        p = "cls.predictions."
        table += _pairs(
            (p + "transform.dense", "mlm.transform"), (p + "transform.LayerNorm", "mlm.norm")
        )
        table.append(Mapped.one(p + "bias", "mlm.bias"))
        if not cfg.tie_embeddings:
            table.append(Mapped.one(p + "decoder.weight", "mlm.decoder.weight"))
    return table


BERT = register(
    Family(
        name="BERT",
        export_name="bert",
        kinds=tuple(ARCHITECTURES),
        keys=KEYS,
        fixed=FIXED,
        table=bert_table,
        widens=ALL_BIASES,
    )
)


def load_bert_state_dict(
    model: nn.Module | None, state_dict: Mapping[str, Tensor], config: Any = None
) -> nn.Module:
    """Copy BERT weights into ``model`` or a new model built from ``config`` (a ModelConfig, a
    BertConfig or config.json's dict). Eval mode."""
    model = model_to_load(
        model,
        config,
        loader="load_bert_state_dict",
        convert=bert_config_to_model_config,
        check=check_bert_compatible,
        build=build_model,
        family="BERT",
    )
    cfg = config_of(model)
    tensors = dict(state_dict)
    if cfg.kind == "masked_lm":
        # Tied decoder weight (= the word embeddings) and its bias alias are stored or not.
        tensors.pop("cls.predictions.decoder.bias", None)
        if cfg.tie_embeddings:
            tensors.pop("cls.predictions.decoder.weight", None)
        if not cfg.pooler:
            tensors = {k: v for k, v in tensors.items() if not k.startswith("bert.pooler.")}
    return load_mapped(model, tensors, bert_table(cfg), "BERT", ignored=SKIPPED)


def to_bert_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The Hugging Face state dict (BertModel / ...ForSequenceClassification / ...ForMaskedLM)."""
    cfg = config_of(model)
    check_exportable(BERT, cfg)
    out = export_mapped(model, bert_table(cfg), "BERT")
    if cfg.kind == "masked_lm" and cfg.tie_embeddings:
        out["cls.predictions.decoder.weight"] = out["bert.embeddings.word_embeddings.weight"]
    return out
