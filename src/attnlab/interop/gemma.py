"""Hugging Face Gemma 3 text decoders (``Gemma3ForCausalLM``, model_type "gemma3_text") <->
DecoderLM, and their classifier (``Gemma3TextForSequenceClassification``) <-> DecoderClassifier.

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

from typing import Any

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.interop.causal_lm import (
    CLASSIFIER_KEYS,
    CLASSIFIER_SUFFIX,
    HEADS,
    CausalLM,
    architecture_key,
    classifier_problems,
)
from attnlab.interop.family import Family, Key, register, tie_key
from attnlab.interop.llama import (
    DECODER_KINDS,
    ROPE_FIELDS,
    ROTARY_RMSNORM,
    SHAPE_KEYS,
    decoder_table,
    read_rope,
    rope_parameters,
)
from attnlab.interop.weights_map import Mapped, config_dict, problems_message

MODEL_TYPE = "gemma3_text"
ARCHITECTURE = "Gemma3ForCausalLM"
CLASSIFIER = "Gemma3Text" + CLASSIFIER_SUFFIX
_ACT_IN = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}
_ACT_OUT = {"gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}
SUPPORTED = (
    "Gemma 3 text decoders with GeGLU (gelu_pytorch_tanh or gelu), query_pre_attn_scalar = "
    "head_dim, no logit soft-capping, rotary scaling none/linear/llama3, one kind of layer "
    "(all sliding or all full), and " + HEADS
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
    architecture_key(lambda c: ARCHITECTURE, lambda c: CLASSIFIER),
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
    tie_key(default=True),
    *CLASSIFIER_KEYS,
)
# A Gemma 3 block: sandwich RMSNorms, rotary, GeGLU, query/key norms, sqrt(D)-scaled embeddings.
FIXED = {
    **ROTARY_RMSNORM,
    "norm_placement": "sandwich",
    "ffn": "geglu",
    "final_norm": True,
    "embed_scale": True,
    "qk_norm": True,
}


# A Gemma 3 layer's RMSNorms (HF module, attnlab module); each gain is stored as g - 1.
_NORMS = (
    ("input_layernorm", "self_attn_norm"),
    ("post_attention_layernorm", "post_attn_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffn_norm"),
    ("self_attn.q_norm", "self_attn.q_norm"),
    ("self_attn.k_norm", "self_attn.k_norm"),
)


def _gemma_layer(cfg: ModelConfig, h: str, b: str) -> list[Mapped]:
    """A Gemma 3 layer's tensors besides q/k/v: W^O, the GeGLU, the six RMSNorms (g - 1)."""
    pairs = [("self_attn.o_proj.weight", "self_attn.out_proj.weight")]
    if cfg.attention_bias:
        pairs.append(("self_attn.o_proj.bias", "self_attn.out_proj.bias"))
    pairs += [(f"mlp.{p}_proj.weight", f"ffn.{p}.weight") for p in ("gate", "up", "down")]
    table = [Mapped.one(h + hf, b + ours) for hf, ours in pairs]
    return table + [Mapped.one(f"{h}{hf}.weight", f"{b}{o}.weight", offset=1.0) for hf, o in _NORMS]


def gemma_table(cfg: ModelConfig) -> list[Mapped]:
    """Hugging Face name(s) -> attnlab name for every tensor of a Gemma 3 model of ``cfg``; every
    RMSNorm gain is stored as g - 1 (``offset=1``)."""
    return decoder_table(cfg, _gemma_layer, offset=1.0)


GEMMA3 = register(
    Family(
        name="Gemma 3",
        export_name="gemma3",
        keys=KEYS,
        fixed=FIXED,
        table=gemma_table,
        kinds=DECODER_KINDS,
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
    problems += classifier_problems(data)
    rope = _rope_of_layers(data)
    rope_type = (rope.get("rope_parameters") or rope.get("rope_scaling") or {}).get("rope_type")
    if rope_type not in (None, "default", "linear", "llama3"):
        problems.append(f"rope scaling {rope_type!r} (attnlab has default, linear and llama3)")
    if problems:
        raise ConfigError(problems_message("Gemma 3", problems, SUPPORTED))
    return GEMMA3.read(data)


# The file around the table: the head tied to embed_tokens, the reader.
GEMMA3_LM = CausalLM(
    families=(GEMMA3,),
    embedding="model.embed_tokens.weight",
    convert=gemma_config_to_model_config,
    loader="GEMMA3_LM.load",
)
