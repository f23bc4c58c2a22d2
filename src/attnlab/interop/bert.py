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
from attnlab.interop.weights_map import (
    Mapped,
    config_dict,
    export_mapped,
    load_mapped,
    mismatches,
    model_to_load,
    problems_message,
)
from attnlab.models.build import build_model

# Buffers (not parameters) and the next-sentence-prediction head: present in files, not mapped.
SKIPPED = re.compile(r"(embeddings\.position_ids|embeddings\.token_type_ids|cls\.seq_relationship)")
ARCHITECTURES = {
    "encoder": "BertModel",
    "classifier": "BertForSequenceClassification",
    "masked_lm": "BertForMaskedLM",
}
_ACT = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
_ACT_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
SUPPORTED = (
    "BERT encoders with absolute positions, activations " + ", ".join(sorted(_ACT)) + ", and "
    "the BertModel, BertForSequenceClassification (single-label) and BertForMaskedLM heads"
)


def bert_kind(data: dict[str, Any]) -> str:
    """The attnlab kind for a config's ``architectures`` (default: the bare encoder)."""
    arch = (data.get("architectures") or ["BertModel"])[0]
    if arch in ("BertForMaskedLM", "BertForPreTraining"):
        return "masked_lm"
    if arch == "BertForSequenceClassification":
        return "classifier"
    if arch == "BertModel":
        return "encoder"
    raise ConfigError(
        f"BERT architecture {arch!r} is not supported; attnlab imports "
        f"{sorted(set(ARCHITECTURES.values()) | {'BertForPreTraining'})}"
    )


def bert_config_to_model_config(hf_config: Any, kind: str | None = None) -> ModelConfig:
    """A BertConfig (or config.json's dict) -> ModelConfig of ``kind`` (default: from
    ``architectures``). Raises ConfigError listing every setting that does not map."""
    data = config_dict(hf_config, "BertConfig")
    if data.get("model_type", "bert") != "bert":
        raise ConfigError(f"model_type={data['model_type']!r} is not BERT")
    kind = kind or bert_kind(data)
    problems = []
    act = data.get("hidden_act", "gelu")
    if act not in _ACT:
        problems.append(f"hidden_act={act!r}")
    pos = data.get("position_embedding_type", "absolute")
    if pos != "absolute":
        problems.append(f"position_embedding_type={pos!r} (attnlab has absolute positions)")
    if data.get("is_decoder") or data.get("add_cross_attention"):
        problems.append("is_decoder / add_cross_attention (attnlab imports BERT as an encoder)")
    n_classes = len(data.get("id2label") or {}) or data.get("num_labels")
    if kind == "classifier":
        if data.get("problem_type") not in (None, "single_label_classification"):
            problems.append(f"problem_type={data['problem_type']!r} (single-label only)")
        if not n_classes or n_classes < 2:
            problems.append(f"num_labels={n_classes} (a classifier needs at least 2)")
    if problems:
        raise ConfigError(problems_message("BERT", problems, SUPPORTED))
    d_model = data["hidden_size"]
    try:
        return ModelConfig(
            kind=kind,
            vocab_size=data["vocab_size"],
            n_classes=n_classes if kind == "classifier" else None,
            d_model=d_model,
            n_heads=data["num_attention_heads"],
            n_layers=data["num_hidden_layers"],
            d_ff=data["intermediate_size"],
            max_len=data.get("max_position_embeddings", 512),
            dropout=float(data.get("hidden_dropout_prob", 0.0)),
            positional="learned",
            norm="layernorm",
            norm_placement="post",
            norm_eps=float(data.get("layer_norm_eps", 1e-12)),
            activation=_ACT[act],
            bias=True,
            final_norm=False,
            embed_norm=True,
            n_token_types=int(data.get("type_vocab_size", 2)),
            pooler=kind != "masked_lm" or _has_pooler(data),
            pooling="cls",
            tie_embeddings=bool(data.get("tie_word_embeddings", True)),
            pad_id=data.get("pad_token_id") or 0,
        )
    except KeyError as err:
        raise ConfigError(f"the BERT config lacks {err.args[0]!r}") from None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"the BERT config does not make a valid model: {err}") from None


def _has_pooler(data: dict[str, Any]) -> bool:
    return (data.get("architectures") or [""])[0] == "BertForPreTraining"


def check_bert_compatible(cfg: ModelConfig) -> None:
    """Raise ConfigError listing every setting of ``cfg`` BERT's architecture cannot hold."""
    if cfg.kind not in ARCHITECTURES:
        raise ConfigError(
            f"only {sorted(ARCHITECTURES)} models map to BERT; this one is kind={cfg.kind!r}"
        )
    wanted = {
        "positional": "learned",
        "norm": "layernorm",
        "norm_placement": "post",
        "ffn": "mlp",
        "attention": "softmax",
        "final_norm": False,
        "embed_norm": True,
        "qk_norm": False,
        "out_proj": True,
        "embed_scale": False,
        "scale_logits": True,
        "bias": True,
        "n_kv_heads": None,
        "attn_bias": None,
        "ffn_bias": None,
        "pooling": "cls",
    }
    problems = mismatches(cfg, wanted, "BERT")
    if cfg.activation not in _ACT_OUT:
        problems.append(f"activation={cfg.activation!r} (BERT has {sorted(_ACT_OUT)})")
    if cfg.head_dim * cfg.n_heads != cfg.d_model or cfg.value_dim != cfg.head_dim:
        problems.append(f"d_head={cfg.head_dim} (BERT needs d_model / n_heads)")
    if cfg.kind == "classifier" and not cfg.pooler:
        problems.append("pooler=False (BertForSequenceClassification classifies the pooled CLS)")
    if problems:
        raise ConfigError("this model cannot be expressed as BERT: " + "; ".join(problems))


def model_config_to_bert_config(cfg: ModelConfig, labels: list[str] | None = None) -> dict:
    """The config.json dict ``transformers.BertConfig`` reads for ``cfg``."""
    check_bert_compatible(cfg)
    out = {
        "model_type": "bert",
        "architectures": [ARCHITECTURES[cfg.kind]],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.ff_dim,
        "hidden_act": _ACT_OUT[cfg.activation],
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.dropout,
        "max_position_embeddings": cfg.max_len,
        "type_vocab_size": cfg.n_token_types,
        "layer_norm_eps": cfg.norm_eps,
        "position_embedding_type": "absolute",
        "pad_token_id": cfg.pad_id,
        "tie_word_embeddings": cfg.tie_embeddings,
    }
    if cfg.kind == "classifier":
        names = labels or [f"LABEL_{i}" for i in range(cfg.n_classes)]
        out["id2label"] = {str(i): name for i, name in enumerate(names)}
        out["label2id"] = {name: i for i, name in enumerate(names)}
        out["problem_type"] = "single_label_classification"
    return out


def _pairs(*names: tuple[str, str]) -> list[Mapped]:
    """Weight and bias rows for (HF module, attnlab module) pairs."""
    return [Mapped.one(f"{h}.{p}", f"{o}.{p}") for h, o in names for p in ("weight", "bias")]


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
            table.append(Mapped(qkv, f"{b}self_attn.qkv_proj.{p}", (d, d, d)))
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
    cfg = model.cfg
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
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"expected an attnlab model with .cfg, got {type(model).__name__}")
    check_bert_compatible(cfg)
    out = export_mapped(model, bert_table(cfg))
    if cfg.kind == "masked_lm" and cfg.tie_embeddings:
        out["cls.predictions.decoder.weight"] = out["bert.embeddings.word_embeddings.weight"]
    return out
