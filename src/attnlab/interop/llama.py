"""Hugging Face Llama-family decoders (``LlamaForCausalLM``, ``MistralForCausalLM``) <-> DecoderLM.

A Llama block is attnlab's pre-norm causal block with today's parts switched on:

    x' = x + W^O GQA(RMSNorm_1(x))          input_layernorm, self_attn.{q,k,v,o}_proj
    x''= x' + W2 (SiLU(W_g h) * W1 h),  h = RMSNorm_2(x')    post_attention_layernorm, mlp.*
    logits = RMSNorm_f(x_N) W_head           model.norm, lm_head (untied unless configured)

with rotary positions on q and k (``rope_theta`` = our ``rope_base``; "linear" and "llama3"
frequency scaling), grouped-query attention (``num_key_value_heads`` = our ``n_kv_heads``) and no
biases (``attention_bias``/``mlp_bias`` map to ``attn_bias``/``ffn_bias``). Mistral is the same
network with a sliding attention window (``sliding_window`` = our ``attn_window``).

Weight layout: both sides store ``nn.Linear`` weights (out, in). attnlab's fused ``qkv_proj`` is
[W_q; W_k; W_v] stacked by rows; Hugging Face's q/k/v rows are already in the rotate-half order
that ``attnlab.nn.positional.RotaryPositions`` uses, so no permutation is needed.

Shapes: D hidden_size, H heads, G key/value heads, Dh head_dim, F intermediate_size, V vocab.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnlab.config import ModelConfig
from attnlab.errors import CheckpointError, ConfigError
from attnlab.interop.weights_map import (
    Mapped,
    config_dict,
    export_mapped,
    load_mapped,
    mismatches,
    model_to_load,
    problems_message,
)
from attnlab.models.lm import DecoderLM

MODEL_TYPES = ("llama", "mistral")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
SUPPORTED = (
    "Llama/Mistral decoders with SiLU, rotary positions (scaling none, linear or llama3), "
    "pretraining_tp=1, and any number of key/value heads"
)
_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
)


def _rope(data: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(theta, scaling dict) from ``rope_parameters`` (transformers >= 5) or the older
    ``rope_theta`` + ``rope_scaling`` keys."""
    params = data.get("rope_parameters") or {}
    scaling = dict(data.get("rope_scaling") or {})
    scaling.update({k: v for k, v in params.items() if k != "rope_theta"})
    theta = params.get("rope_theta", data.get("rope_theta", 10000.0))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    scaling["rope_type"] = kind
    return float(theta), scaling


def llama_config_to_model_config(hf_config: Any) -> ModelConfig:
    """A LlamaConfig / MistralConfig (or config.json's dict) -> the equivalent ModelConfig.

    Raises ConfigError listing every setting that has no attnlab equivalent.
    """
    data = config_dict(hf_config, "LlamaConfig")
    model_type = data.get("model_type", "llama")
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            f"model_type={model_type!r} is not a Llama-family model; this importer reads "
            f"{list(MODEL_TYPES)}"
        )
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ConfigError(f"the {model_type} config lacks {missing}; expected {list(_REQUIRED)}")
    theta, scaling = _rope(data)
    problems = []
    if data.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={data['hidden_act']!r} (attnlab's SwiGLU gates with silu)")
    if data.get("pretraining_tp", 1) != 1:
        problems.append(f"pretraining_tp={data['pretraining_tp']} (only 1)")
    if scaling["rope_type"] not in ("default", "linear", "llama3"):
        problems.append(
            f"rope scaling {scaling['rope_type']!r} (attnlab has default, linear and llama3)"
        )
    window = data.get("sliding_window") if model_type == "mistral" else None
    if data.get("layer_types") and len(set(data["layer_types"])) > 1:
        problems.append(f"mixed layer_types {sorted(set(data['layer_types']))} (one kind only)")
    if problems:
        raise ConfigError(problems_message(model_type, problems, SUPPORTED))
    d_model, n_heads = data["hidden_size"], data["num_attention_heads"]
    n_kv = data.get("num_key_value_heads") or n_heads
    head_dim = data.get("head_dim") or d_model // n_heads
    rope_fields = {}
    if scaling["rope_type"] != "default":
        rope_fields = dict(
            rope_scaling=scaling["rope_type"],
            rope_factor=float(scaling["factor"]),
            rope_low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
            rope_high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
            rope_original_max_len=scaling.get("original_max_position_embeddings"),
        )
    try:
        return ModelConfig(
            kind="decoder_lm",
            vocab_size=data["vocab_size"],
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=None if n_kv == n_heads else n_kv,
            d_head=None if head_dim * n_heads == d_model else head_dim,
            n_layers=data["num_hidden_layers"],
            d_ff=data["intermediate_size"],
            max_len=data.get("max_position_embeddings", 2048),
            dropout=float(data.get("attention_dropout", 0.0)),
            positional="rotary",
            rope_base=theta,
            norm="rmsnorm",
            norm_placement="pre",
            norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            activation="silu",
            ffn="swiglu",
            bias=False,
            attn_bias=bool(data.get("attention_bias", False)) or None,
            ffn_bias=bool(data.get("mlp_bias", False)) or None,
            attn_window=window,
            tie_embeddings=bool(data.get("tie_word_embeddings", False)),
            final_norm=True,
            pad_id=_pad_id(data),
            **rope_fields,
        )
    except (TypeError, ValueError) as err:
        raise ConfigError(f"the {model_type} config does not make a valid model: {err}") from None


def _pad_id(data: dict[str, Any]) -> int:
    pad = data.get("pad_token_id")
    return pad if isinstance(pad, int) and 0 <= pad < data["vocab_size"] else 0


def check_llama_compatible(cfg: ModelConfig) -> None:
    """Raise ConfigError listing every setting of ``cfg`` that Llama's architecture cannot hold."""
    if cfg.kind != "decoder_lm":
        raise ConfigError(f"only decoder-only LMs map to Llama; this model is kind={cfg.kind!r}")
    wanted = {
        "positional": "rotary",
        "norm": "rmsnorm",
        "norm_placement": "pre",
        "ffn": "swiglu",
        "attention": "softmax",
        "final_norm": True,
        "qk_norm": False,
        "out_proj": True,
        "embed_scale": False,
        "scale_logits": True,
        "bias": False,
    }
    problems = mismatches(cfg, wanted, "Llama")
    if cfg.value_dim != cfg.head_dim:
        problems.append(f"d_v={cfg.value_dim} (Llama needs d_v = d_head = {cfg.head_dim})")
    if problems:
        raise ConfigError("this model cannot be expressed as Llama: " + "; ".join(problems))


def model_config_to_llama_config(
    cfg: ModelConfig,
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
    pad_id: int | None = None,
) -> dict[str, Any]:
    """The config.json dict that ``transformers.LlamaConfig`` (or MistralConfig) reads."""
    check_llama_compatible(cfg)
    model_type = "mistral" if cfg.attn_window is not None else "llama"
    rope: dict[str, Any] = {"rope_theta": cfg.rope_base, "rope_type": "default"}
    if cfg.rope_scaling != "none":
        rope.update(rope_type=cfg.rope_scaling, factor=cfg.rope_factor)
        if cfg.rope_scaling == "llama3":
            rope.update(
                low_freq_factor=cfg.rope_low_freq_factor,
                high_freq_factor=cfg.rope_high_freq_factor,
                original_max_position_embeddings=cfg.rope_original_max_len,
            )
    out = {
        "model_type": model_type,
        "architectures": [ARCHITECTURES[model_type]],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ff_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": rope,
        "rope_theta": cfg.rope_base,  # transformers < 5 reads these two
        "rope_scaling": None if cfg.rope_scaling == "none" else rope,
        "attention_bias": cfg.attention_bias,
        "mlp_bias": cfg.feedforward_bias,
        "attention_dropout": cfg.dropout,
        "pretraining_tp": 1,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "use_cache": True,
    }
    if model_type == "mistral":
        out["sliding_window"] = cfg.attn_window
    return out


def llama_table(cfg: ModelConfig) -> list[Mapped]:
    """Hugging Face name(s) -> attnlab name for every tensor of a Llama model of ``cfg``."""
    q_rows, kv_rows = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    table = [Mapped.one("model.embed_tokens.weight", "embed.tok_emb.weight")]
    for i in range(cfg.n_layers):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        qkv = tuple(f"{h}self_attn.{p}_proj" for p in "qkv")
        table.append(
            Mapped(
                tuple(p + ".weight" for p in qkv),
                b + "self_attn.qkv_proj.weight",
                (q_rows, kv_rows, kv_rows),
            )
        )
        if cfg.attention_bias:
            table.append(
                Mapped(
                    tuple(p + ".bias" for p in qkv),
                    b + "self_attn.qkv_proj.bias",
                    (q_rows, kv_rows, kv_rows),
                )
            )
        pairs = [
            ("input_layernorm.weight", "self_attn_norm.weight"),
            ("self_attn.o_proj.weight", "self_attn.out_proj.weight"),
            ("post_attention_layernorm.weight", "ffn_norm.weight"),
            ("mlp.gate_proj.weight", "ffn.gate.weight"),
            ("mlp.up_proj.weight", "ffn.up.weight"),
            ("mlp.down_proj.weight", "ffn.down.weight"),
        ]
        if cfg.attention_bias:
            pairs.append(("self_attn.o_proj.bias", "self_attn.out_proj.bias"))
        if cfg.feedforward_bias:
            pairs += [
                (f"mlp.{p}_proj.bias", f"ffn.{q}.bias")
                for p, q in (("gate", "gate"), ("up", "up"), ("down", "down"))
            ]
        table += [Mapped.one(h + hf, b + ours) for hf, ours in pairs]
    table.append(Mapped.one("model.norm.weight", "final_norm.weight"))
    if not cfg.tie_embeddings:
        table.append(Mapped.one("lm_head.weight", "lm_head.weight"))
    return table


def load_llama_state_dict(
    model: DecoderLM | None, state_dict: Mapping[str, Tensor], config: Any = None
) -> DecoderLM:
    """Copy Llama/Mistral weights into ``model`` or a new DecoderLM built from ``config`` (an
    attnlab ModelConfig, a transformers config, or config.json's dict). Eval mode."""
    model = model_to_load(
        model,
        config,
        loader="load_llama_state_dict",
        convert=llama_config_to_model_config,
        check=check_llama_compatible,
        build=DecoderLM,
        family="Llama",
        cls=DecoderLM,
    )
    tensors = dict(state_dict)
    if model.cfg.tie_embeddings:
        head = tensors.pop("lm_head.weight", None)
        emb = tensors.get("model.embed_tokens.weight")
        if head is not None and emb is not None and not torch.equal(head, emb):
            raise CheckpointError(
                "lm_head.weight differs from model.embed_tokens.weight but the config ties them "
                "(tie_word_embeddings=true); set it to false in config.json to keep the head"
            )
    family = "mistral" if model.cfg.attn_window is not None else "llama"
    return load_mapped(model, tensors, llama_table(model.cfg), family)


def to_llama_state_dict(model: DecoderLM) -> dict[str, Tensor]:
    """The ``LlamaForCausalLM`` state dict of ``model`` (lm_head included even when tied)."""
    if not isinstance(model, DecoderLM):
        raise TypeError(f"only a DecoderLM exports to Llama, got {type(model).__name__}")
    check_llama_compatible(model.cfg)
    out = export_mapped(model, llama_table(model.cfg))
    if model.cfg.tie_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out
