"""Hugging Face Gemma 3 text decoders (``Gemma3ForCausalLM``, model_type "gemma3_text") <->
DecoderLM.

A Gemma 3 block is the sandwich block (``norm_placement="sandwich"``,
``attnlab.nn.sandwich``) with Llama's other parts, GeGLU and query/key norms:

    x_0 = sqrt(D) E w                                    embed_tokens (embed_scale)
    h   = x + RMSNorm_pa(W^O GQA(RMSNorm_in(x)))          input_layernorm, self_attn.*,
                                                         post_attention_layernorm
    x'  = h + RMSNorm_pf(W2 (gelu_tanh(W_g u) * W1 u)),  u = RMSNorm_pre(h)
                                                         pre_/post_feedforward_layernorm, mlp.*
    logits = RMSNorm_f(x_N) E^T                          model.norm, tied head

with rotary positions, q and k RMS-normed per head before the rotation (``qk_norm``), and every
RMSNorm computing ``x / rms(x) * (1 + w)``: the file stores w, attnlab the gain g = 1 + w (a table
``offset``; 1 + w is the same float either way). Attention logits are scaled by
1/sqrt(``query_pre_attn_scalar``), which must equal ``head_dim`` here.

Deviations: Gemma 3 interleaves sliding-window and full layers (5:1) with a different rotary base
for each kind; attnlab holds one kind of layer, so a config whose ``layer_types`` mix them is
refused (a random-weight model, or a fine-tune exported here, writes all layers the same kind).
Gemma 2's logit soft-capping is not held (``attn_logit_softcapping``/``final_logit_softcapping``
must be null).

Shapes: D hidden_size, H heads, G key/value heads, Dh head_dim, F intermediate_size, V vocab.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.interop.family import (
    Family,
    Key,
    as_bool,
    check_exportable,
    register,
)
from attnlab.interop.llama import ROPE_FIELDS, SHAPE_KEYS, read_rope, rope_parameters
from attnlab.interop.weights_map import (
    Mapped,
    config_dict,
    export_mapped,
    load_mapped,
    model_to_load,
    problems_message,
    tied_head,
)
from attnlab.models.lm import DecoderLM

MODEL_TYPE = "gemma3_text"
ARCHITECTURE = "Gemma3ForCausalLM"
_ACT_IN = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}
_ACT_OUT = {"gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}
SUPPORTED = (
    "Gemma 3 text decoders with GeGLU (gelu_pytorch_tanh or gelu), query_pre_attn_scalar = "
    "head_dim, no logit soft-capping, rotary scaling none/linear/llama3, and one kind of layer "
    "(all sliding or all full)"
)
FULL, SLIDING = "full_attention", "sliding_attention"


def _layer_kind(data: dict[str, Any]) -> str:
    types = data.get("layer_types") or [FULL]
    return SLIDING if all(t == SLIDING for t in types) else FULL


def _rope_of_layers(data: dict[str, Any]) -> dict[str, Any]:
    """The rotary settings of the layers' one kind, from transformers 5's per-kind
    ``rope_parameters`` or the older ``rope_theta`` / ``rope_local_base_freq`` keys."""
    kind = _layer_kind(data)
    params = data.get("rope_parameters") or {}
    if kind in params:
        return {"rope_parameters": params[kind]}
    if kind == SLIDING:
        return {"rope_theta": data.get("rope_local_base_freq", 10000.0)}
    return {
        "rope_theta": data.get("rope_theta", 1000000.0),
        "rope_scaling": data.get("rope_scaling"),
    }


def _read_rope(value: Any, data: dict[str, Any]) -> tuple:
    return read_rope(None, _rope_of_layers(data))


def _rope_per_kind(cfg: ModelConfig) -> dict[str, Any]:
    """The same rotary settings for both kinds of layer (attnlab's layers are all one kind)."""
    return {FULL: rope_parameters(cfg), SLIDING: rope_parameters(cfg)}


def _layer_types(cfg: ModelConfig) -> list[str]:
    return [FULL if cfg.attn_window is None else SLIDING] * cfg.n_layers


def _window(value: Any, data: dict[str, Any]) -> int | None:
    return data.get("sliding_window") if _layer_kind(data) == SLIDING else None


def _activation(value: Any, data: dict[str, Any]) -> str:
    return _ACT_IN[value]


def _hidden_activation(cfg: ModelConfig) -> str:
    return _ACT_OUT.get(cfg.activation, "gelu_pytorch_tanh")


def _attention_bias(value: Any, data: dict[str, Any]) -> bool | None:
    return bool(value) or None


# config.json <-> ModelConfig, both directions (attnlab.interop.family).
KEYS = (
    Key("model_type", (), lambda c: MODEL_TYPE, default=None),
    Key("architectures", (), lambda c: [ARCHITECTURE], default=None),
    *SHAPE_KEYS,
    Key("hidden_activation", "activation", _hidden_activation, _activation, default=None),
    Key("rope_parameters", ROPE_FIELDS, _rope_per_kind, _read_rope, default=None),
    Key("layer_types", "attn_window", _layer_types, _window, default=None),
    Key("sliding_window", (), lambda c: c.attn_window or 4096, default=None),
    Key("query_pre_attn_scalar", (), lambda c: c.head_dim, default=None),
    Key("attn_logit_softcapping", (), lambda c: None, default=None),
    Key("final_logit_softcapping", (), lambda c: None, default=None),
    Key("use_bidirectional_attention", (), lambda c: False, default=None),
    Key("attention_bias", "attn_bias", lambda c: c.attention_bias, _attention_bias, default=False),
    Key("tie_word_embeddings", "tie_embeddings", read=as_bool, default=True),
)
# A Gemma 3 block: sandwich RMSNorms, rotary, GeGLU, query/key norms, sqrt(D)-scaled embeddings.
FIXED = dict(
    kind="decoder_lm",
    positional="rotary",
    norm="rmsnorm",
    norm_placement="sandwich",
    ffn="geglu",
    bias=False,
    attention="softmax",
    final_norm=True,
    embed_scale=True,
    qk_norm=True,
)


def gemma_table(cfg: ModelConfig) -> list[Mapped]:
    """Hugging Face name(s) -> attnlab name for every tensor of a Gemma 3 model of ``cfg``; every
    RMSNorm gain is stored as g - 1 (``offset=1``)."""
    q_rows, kv_rows = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    sizes = (q_rows, kv_rows, kv_rows)
    table = [Mapped.one("model.embed_tokens.weight", "embed.tok_emb.weight")]
    for i in range(cfg.n_layers):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        qkv = tuple(f"{h}self_attn.{p}_proj" for p in "qkv")
        table.append(
            Mapped(tuple(p + ".weight" for p in qkv), b + "self_attn.qkv_proj.weight", sizes)
        )
        pairs = [("self_attn.o_proj.weight", "self_attn.out_proj.weight")]
        if cfg.attention_bias:
            table.append(
                Mapped(tuple(p + ".bias" for p in qkv), b + "self_attn.qkv_proj.bias", sizes)
            )
            pairs.append(("self_attn.o_proj.bias", "self_attn.out_proj.bias"))
        pairs += [(f"mlp.{p}_proj.weight", f"ffn.{p}.weight") for p in ("gate", "up", "down")]
        table += [Mapped.one(h + hf, b + ours) for hf, ours in pairs]
        norms = [
            ("input_layernorm", "self_attn_norm"),
            ("post_attention_layernorm", "post_attn_norm"),
            ("pre_feedforward_layernorm", "ffn_norm"),
            ("post_feedforward_layernorm", "post_ffn_norm"),
            ("self_attn.q_norm", "self_attn.q_norm"),
            ("self_attn.k_norm", "self_attn.k_norm"),
        ]
        table += [Mapped.one(f"{h}{hf}.weight", f"{b}{o}.weight", offset=1.0) for hf, o in norms]
    table.append(Mapped.one("model.norm.weight", "final_norm.weight", offset=1.0))
    if not cfg.tie_embeddings:
        table.append(Mapped.one("lm_head.weight", "lm_head.weight"))
    return table


GEMMA3 = register(
    Family(
        name="Gemma 3",
        export_name="gemma3",
        kinds=("decoder_lm",),
        keys=KEYS,
        fixed=FIXED,
        table=gemma_table,
    )
)


def gemma_config_to_model_config(hf_config: Any) -> ModelConfig:
    """A Gemma3TextConfig (or config.json's dict) -> the equivalent ModelConfig. Raises
    ConfigError listing every setting that has no attnlab equivalent."""
    data = config_dict(hf_config, "Gemma3TextConfig")
    if data.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise ConfigError(f"model_type={data['model_type']!r} is not {MODEL_TYPE!r}")
    problems = []
    act = data.get("hidden_activation") or data.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in _ACT_IN:
        problems.append(f"hidden_activation={act!r} (attnlab's GeGLU gates with {sorted(_ACT_IN)})")
    data["hidden_activation"] = act
    types = set(data.get("layer_types") or [FULL])
    if len(types) > 1:
        problems.append(f"mixed layer_types {sorted(types)} (one kind only)")
    head_dim = data.get("head_dim") or data["hidden_size"] // data["num_attention_heads"]
    scalar = data.get("query_pre_attn_scalar", head_dim)
    if scalar != head_dim:
        problems.append(f"query_pre_attn_scalar={scalar} (attnlab scales by 1/sqrt(head_dim))")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if data.get(key) is not None:
            problems.append(f"{key}={data[key]} (attnlab has no logit soft-capping)")
    if data.get("use_bidirectional_attention"):
        problems.append("use_bidirectional_attention=true (attnlab's Gemma is causal)")
    rope = _rope_of_layers(data)
    rope_type = (rope.get("rope_parameters") or rope.get("rope_scaling") or {}).get("rope_type")
    if rope_type not in (None, "default", "linear", "llama3"):
        problems.append(f"rope scaling {rope_type!r} (attnlab has default, linear and llama3)")
    if problems:
        raise ConfigError(problems_message("Gemma 3", problems, SUPPORTED))
    return GEMMA3.read(data)


def check_gemma_compatible(cfg: ModelConfig) -> None:
    """Raise ConfigError naming every setting of ``cfg`` Gemma 3's config cannot hold."""
    check_exportable(GEMMA3, cfg)


def model_config_to_gemma_config(
    cfg: ModelConfig,
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
    pad_id: int | None = None,
) -> dict[str, Any]:
    """The config.json dict that ``transformers.Gemma3TextConfig`` reads."""
    check_exportable(GEMMA3, cfg)
    out = GEMMA3.write(cfg)
    out.update(bos_token_id=bos_id, eos_token_id=eos_id)
    if pad_id is not None:
        out["pad_token_id"] = pad_id
    return out


def load_gemma_state_dict(
    model: DecoderLM | None, state_dict: Mapping[str, Tensor], config: Any = None
) -> DecoderLM:
    """Copy Gemma 3 weights into ``model`` or a new DecoderLM built from ``config``. Eval mode."""
    model = model_to_load(
        model,
        config,
        loader="load_gemma_state_dict",
        convert=gemma_config_to_model_config,
        check=check_gemma_compatible,
        build=DecoderLM,
        family="Gemma 3",
        cls=DecoderLM,
    )
    tensors = dict(state_dict)
    tied = model.cfg.tie_embeddings
    tied_head(tensors, "lm_head.weight", "model.embed_tokens.weight", tied, "Gemma 3")
    return load_mapped(model, tensors, gemma_table(model.cfg), "Gemma 3")


def to_gemma_state_dict(model: DecoderLM) -> dict[str, Tensor]:
    """The ``Gemma3ForCausalLM`` state dict of ``model`` (lm_head included even when tied)."""
    if not isinstance(model, DecoderLM):
        raise TypeError(f"only a DecoderLM exports to Gemma 3, got {type(model).__name__}")
    check_exportable(GEMMA3, model.cfg)
    out = export_mapped(model, gemma_table(model.cfg), "Gemma 3")
    if model.cfg.tie_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out
