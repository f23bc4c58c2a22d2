"""Hugging Face Gemma 1, 2 and 3 text decoders (``GemmaForCausalLM``, model_type "gemma";
``Gemma2ForCausalLM``, "gemma2"; ``Gemma3ForCausalLM``, "gemma3_text") <-> DecoderLM, and the
classifiers of Gemma 1 and 3 (``GemmaForSequenceClassification``,
``Gemma3TextForSequenceClassification``) <-> DecoderClassifier.

A Gemma block is the sandwich block (``norm_placement="sandwich"``, ``attnlab.nn.sandwich``) with
Llama's other parts and GeGLU:

    x_0 = sqrt(D) E w                                    embed_tokens (embed_scale)
    h   = x + RMSNorm_pa(W^O GQA(RMSNorm_in(x)))          input_layernorm, self_attn.*,
                                                         post_attention_layernorm
    x'  = h + RMSNorm_pf(W2 (gelu_tanh(W_g u) * W1 u)),  u = RMSNorm_pre(h)
                                                         pre_/post_feedforward_layernorm, mlp.*
    logits = RMSNorm_f(x_N) E^T                          model.norm, tied head

with rotary positions and every RMSNorm computing ``x / rms(x) * (1 + w)``: the file stores w,
attnlab the gain g = 1 + w (a table ``offset``; 1 + w is the same float either way). Attention
logits are scaled by 1/sqrt(``query_pre_attn_scalar``), which must equal ``head_dim`` here.

Gemma 1 (Team Gemma 2024a) is the plain pre-norm block with the same parts: x' = x +
W^O GQA(RMSNorm_in(x)), x'' = x' + W2 (gelu_tanh(W_g u) * W1 u), u = RMSNorm_post(x')
(``input_layernorm``, ``post_attention_layernorm``: our ``self_attn_norm``, ``ffn_norm``), no
query/key norms, optional biases on q, k, v and W^O (``attention_bias``); its released configs
say ``hidden_act="gelu"``, which transformers reads as the tanh approximation, and so does attnlab.
Gemma 2 (Team Gemma 2024b) adds logit soft-capping, cap(s) = c tanh(s / c): on the attention
logits before the mask (``attn_logit_softcapping`` = our ``attn_logit_softcap``, 50 in the
released models) and on the output logits (``final_logit_softcapping`` = ``final_logit_softcap``,
30); and alternates sliding-window and full layers (``layer_types``: layer i slides when i is
even), attnlab's ``attn_window`` with ``full_attn_every=2``.
Gemma 3 drops the caps, RMS-normalises q and k per head before the rotation (``qk_norm``), and
interleaves sliding-window and full layers 5:1 with a different rotary base for each kind.

Deviations: attnlab's layers share one rotary base, so a Gemma 3 config whose ``layer_types`` mix
kinds is refused (a random-weight model, or a fine-tune exported here, writes all layers the same
kind); a Gemma 2 config's ``layer_types`` must be "every k-th layer full" (the released models'
pattern and transformers' default).

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
    ROPE_FIELDS,
    ROPE_KEYS,
    ROPE_TYPES,
    ROTARY_RMSNORM,
    SHAPE_KEYS,
    decoder_family,
    decoder_table,
    read_rope,
    rope_parameters,
    rope_type,
)
from attnlab.interop.weights_map import Mapped, config_dict, problems_message

MODEL_TYPE = "gemma3_text"
ARCHITECTURE = "Gemma3ForCausalLM"
GEMMA2_TYPE, GEMMA2_ARCHITECTURE = "gemma2", "Gemma2ForCausalLM"
GEMMA1_TYPE, GEMMA1_NAME = "gemma", "Gemma"  # GemmaForCausalLM, GemmaForSequenceClassification
MODEL_TYPES = (MODEL_TYPE, GEMMA2_TYPE, GEMMA1_TYPE)
CLASSIFIER = "Gemma3Text" + CLASSIFIER_SUFFIX
_ACT_IN = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}
_ACT_OUT = {"gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}
SUPPORTED = (
    "Gemma 3 text decoders with GeGLU (gelu_pytorch_tanh or gelu), query_pre_attn_scalar = "
    "head_dim, no logit soft-capping, rotary scaling none/linear/llama3, one kind of layer "
    "(all sliding or all full), and " + HEADS
)
SUPPORTED_2 = (
    "Gemma 2 decoders with GeGLU (gelu_pytorch_tanh or gelu), query_pre_attn_scalar = head_dim, "
    "any logit soft-caps, rotary scaling none/linear/llama3, and layer_types with every k-th "
    "layer full and the others sliding (the default alternation is k = 2)"
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


# The keys every Gemma config ends with: causal attention, one bias switch, a tied head.
CAUSAL_BIAS_TIED = (
    Key("use_bidirectional_attention", (), lambda c: False, default=None),
    Key("attention_bias", "attn_bias", lambda c: c.attention_bias, _attention_bias, default=False),
    tie_key(default=True),
)
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
    *CAUSAL_BIAS_TIED,
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


# A Gemma layer's RMSNorms (HF module, attnlab module); each gain is stored as g - 1.
_NORMS = (
    ("input_layernorm", "self_attn_norm"),
    ("post_attention_layernorm", "post_attn_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffn_norm"),
)
_QK_NORMS = (("self_attn.q_norm", "self_attn.q_norm"), ("self_attn.k_norm", "self_attn.k_norm"))


def _gemma_layer(cfg: ModelConfig, h: str, b: str) -> list[Mapped]:
    """A Gemma layer's tensors besides q/k/v: W^O, the GeGLU, the four sandwich RMSNorms and
    (Gemma 3) the query/key norms, each norm's gain stored as g - 1."""
    pairs = [("self_attn.o_proj.weight", "self_attn.out_proj.weight")]
    if cfg.attention_bias:
        pairs.append(("self_attn.o_proj.bias", "self_attn.out_proj.bias"))
    pairs += [(f"mlp.{p}_proj.weight", f"ffn.{p}.weight") for p in ("gate", "up", "down")]
    table = [Mapped.one(h + hf, b + ours) for hf, ours in pairs]
    norms = _NORMS + (_QK_NORMS if cfg.qk_norm else ())
    return table + [Mapped.one(f"{h}{hf}.weight", f"{b}{o}.weight", offset=1.0) for hf, o in norms]


def gemma_table(cfg: ModelConfig) -> list[Mapped]:
    """Hugging Face name(s) -> attnlab name for every tensor of a Gemma 2 or 3 model of ``cfg``;
    every RMSNorm gain is stored as g - 1 (``offset=1``)."""
    return decoder_table(cfg, _gemma_layer, offset=1.0)


GEMMA3 = decoder_family("Gemma 3", "gemma3", KEYS, FIXED, gemma_table)


# Gemma 2 -----------------------------------------------------------------------------------


def _gemma2_layer_types(cfg: ModelConfig) -> list[str]:
    """Layer i is full where ``cfg.layer_window(i)`` is None (every layer without a window)."""
    return [FULL if cfg.layer_window(i) is None else SLIDING for i in range(cfg.n_layers)]


def _every_kth_full(types: list[str]) -> int | None:
    """k when layers k-1, 2k-1, ... are full and the others slide (1: all full); None when no
    layer is full; -1 when ``types`` follow no such pattern."""
    full = [i for i, t in enumerate(types) if t == FULL]
    if not full:
        return None
    k = full[0] + 1
    return k if types == [FULL if (i + 1) % k == 0 else SLIDING for i in range(len(types))] else -1


def _gemma2_types(data: dict[str, Any]) -> list[str]:
    """config.json's ``layer_types``, or transformers' default (layer i slides when i is even)."""
    n = data["num_hidden_layers"]
    return data.get("layer_types") or [SLIDING if (i + 1) % 2 else FULL for i in range(n)]


def _read_layer_windows(value: Any, data: dict[str, Any]) -> tuple[int | None, int | None]:
    """(attn_window, full_attn_every) of a Gemma 2 config."""
    window, k = data.get("sliding_window"), _every_kth_full(_gemma2_types(data))
    if window is None or k == 1:
        return None, None  # no layer slides
    return window, k


def _cap(value: Any, data: dict[str, Any]) -> float | None:
    return None if value is None else float(value)


GEMMA2_KEYS = (
    Key("model_type", (), lambda c: GEMMA2_TYPE, default=None),
    Key("architectures", (), lambda c: [GEMMA2_ARCHITECTURE], default=None),
    *SHAPE_KEYS,
    Key("hidden_activation", "activation", _hidden_activation, _activation, default=None),
    *ROPE_KEYS,
    Key("layer_types", ("attn_window", "full_attn_every"), _gemma2_layer_types,
        _read_layer_windows, default=None),
    Key("sliding_window", (), lambda c: c.attn_window or 4096, default=None),
    Key("query_pre_attn_scalar", (), lambda c: c.head_dim, default=None),
    # transformers' defaults are the released models' caps: a config.json without them has them
    Key("attn_logit_softcapping", "attn_logit_softcap", read=_cap, default=50.0),
    Key("final_logit_softcapping", "final_logit_softcap", read=_cap, default=30.0),
    *CAUSAL_BIAS_TIED,
)  # fmt: skip
# A Gemma 2 block: Gemma 3's without the query/key norms.
GEMMA2_FIXED = {**FIXED, "qk_norm": False}

GEMMA2 = register(
    Family(
        name="Gemma 2",
        export_name="gemma2",
        keys=GEMMA2_KEYS,
        fixed=GEMMA2_FIXED,
        table=gemma_table,
    )
)


# Gemma 1 ------------------------------------------------------------------------------------

# transformers' names for the tanh-approximated GELU
_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new")
SUPPORTED_1 = (
    "Gemma 1 decoders with GeGLU (hidden_act gelu_pytorch_tanh, or the releases' gelu, read as "
    "it), rotary scaling none/linear/llama3, causal attention, and " + HEADS
)


def _gemma1_layer(cfg: ModelConfig, h: str, b: str) -> list[Mapped]:
    """A Gemma 1 layer's tensors besides q/k/v: W^O, the GeGLU and the two pre-norm RMSNorms,
    each gain stored as g - 1."""
    pairs = [("self_attn.o_proj.weight", "self_attn.out_proj.weight")]
    if cfg.attention_bias:  # one switch for q, k, v and W^O
        pairs.append(("self_attn.o_proj.bias", "self_attn.out_proj.bias"))
    pairs += [(f"mlp.{p}_proj.weight", f"ffn.{p}.weight") for p in ("gate", "up", "down")]
    norms = (("input_layernorm", "self_attn_norm"), ("post_attention_layernorm", "ffn_norm"))
    table = [Mapped.one(h + hf, b + ours) for hf, ours in pairs]
    return table + [Mapped.one(f"{h}{hf}.weight", f"{b}{o}.weight", offset=1.0) for hf, o in norms]


def gemma1_table(cfg: ModelConfig) -> list[Mapped]:
    """Hugging Face name(s) -> attnlab name for every tensor of a Gemma 1 model of ``cfg``."""
    return decoder_table(cfg, _gemma1_layer, offset=1.0)


GEMMA1_KEYS = (
    Key("model_type", (), lambda c: GEMMA1_TYPE, default=None),
    architecture_key(
        lambda c: GEMMA1_NAME + "ForCausalLM", lambda c: GEMMA1_NAME + CLASSIFIER_SUFFIX
    ),
    *SHAPE_KEYS,
    Key("hidden_act", (), lambda c: "gelu_pytorch_tanh", default=None),
    *ROPE_KEYS,
    *CAUSAL_BIAS_TIED,
    *CLASSIFIER_KEYS,
)
# A Gemma 1 block: pre-norm, GeGLU with tanh GELU, sqrt(D)-scaled embeddings, (1 + w) gains.
GEMMA1_FIXED = {
    **ROTARY_RMSNORM,
    "norm_placement": "pre",
    "ffn": "geglu",
    "activation": "gelu_tanh",
    "final_norm": True,
    "embed_scale": True,
    "qk_norm": False,
}

GEMMA1 = decoder_family("Gemma 1", "gemma", GEMMA1_KEYS, GEMMA1_FIXED, gemma1_table)


def _gemma1_config(data: dict[str, Any]) -> ModelConfig:
    problems = []
    # transformers 4 ran ``hidden_activation`` when set (its "gelu" the exact GELU), else the
    # tanh GELU whatever hidden_act said; transformers 5 runs ``hidden_act``, reading the
    # releases' legacy "gelu" as the tanh GELU. Only where both agree on the tanh GELU is it read.
    for key, legacy in (("hidden_activation", ()), ("hidden_act", ("gelu",))):
        if data.get(key) not in (None, *_TANH_GELU, *legacy):
            problems.append(f"{key}={data[key]!r} (attnlab's Gemma 1 gates with the tanh GELU)")
    problems += _common_problems(data, data)
    if problems:
        raise ConfigError(problems_message("Gemma 1", problems, SUPPORTED_1))
    return GEMMA1.read(data)


def _activation_problems(data: dict[str, Any]) -> list[str]:
    """Gemma 2's and 3's activation, normalised into ``data["hidden_activation"]``."""
    act = data.get("hidden_activation") or data.get("hidden_act") or "gelu_pytorch_tanh"
    data["hidden_activation"] = act
    if act not in _ACT_IN:
        return [f"hidden_activation={act!r} (attnlab's GeGLU gates with {sorted(_ACT_IN)})"]
    return []


def _common_problems(data: dict[str, Any], rope: dict[str, Any]) -> list[str]:
    """What every Gemma config may hold and attnlab may not: the query scale, bidirectional
    attention, a classifier's labels, rotary scaling (``rope``: the keys of the layers' rotary
    settings)."""
    problems = []
    head_dim = data.get("head_dim") or data["hidden_size"] // data["num_attention_heads"]
    scalar = data.get("query_pre_attn_scalar", head_dim)
    if scalar != head_dim:
        problems.append(f"query_pre_attn_scalar={scalar} (attnlab scales by 1/sqrt(head_dim))")
    if data.get("use_bidirectional_attention"):
        problems.append("use_bidirectional_attention=true (attnlab's Gemma is causal)")
    problems += classifier_problems(data)
    if rope_type(rope) not in ROPE_TYPES:
        problems.append(f"rope scaling {rope_type(rope)!r} (attnlab has {', '.join(ROPE_TYPES)})")
    return problems


def gemma_config_to_model_config(hf_config: Any) -> ModelConfig:
    """A Gemma3TextConfig, Gemma2Config or GemmaConfig (or config.json's dict) -> the equivalent
    ModelConfig. Raises ConfigError listing every setting that has no attnlab equivalent."""
    data = config_dict(hf_config, "Gemma3TextConfig, Gemma2Config or GemmaConfig")
    model_type = data.get("model_type", MODEL_TYPE)
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"model_type={model_type!r} is not one of {list(MODEL_TYPES)}")
    readers = {GEMMA2_TYPE: _gemma2_config, GEMMA1_TYPE: _gemma1_config}
    return readers.get(model_type, _gemma3_config)(data)


def _gemma2_config(data: dict[str, Any]) -> ModelConfig:
    problems = _activation_problems(data) + _common_problems(data, data)
    types = _gemma2_types(data)
    if _every_kth_full(types) == -1:
        problems.append(
            f"layer_types {types} (attnlab's layers slide except every k-th, which is full)"
        )
    if problems:
        raise ConfigError(problems_message("Gemma 2", problems, SUPPORTED_2))
    return GEMMA2.read(data)


def _gemma3_config(data: dict[str, Any]) -> ModelConfig:
    problems = _activation_problems(data) + _common_problems(data, _rope_of_layers(data))
    kinds = set(data.get("layer_types") or [FULL])
    if len(kinds) > 1:
        problems.append(f"mixed layer_types {sorted(kinds)} (one kind only)")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if data.get(key) is not None:
            problems.append(f"{key}={data[key]} (attnlab reads logit soft-caps of Gemma 2 only)")
    if problems:
        raise ConfigError(problems_message("Gemma 3", problems, SUPPORTED))
    return GEMMA3.read(data)


# The file around the tables: the head tied to embed_tokens, one reader for the three types.
GEMMA_LM = CausalLM(
    families=(GEMMA3, GEMMA2, GEMMA1),
    embedding="model.embed_tokens.weight",
    convert=gemma_config_to_model_config,
    loader="GEMMA_LM.load",
)
