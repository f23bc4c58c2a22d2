"""Hugging Face Llama-like decoders <-> DecoderLM: Llama and Mistral (``LlamaForCausalLM``,
``MistralForCausalLM``), Qwen2 and Qwen3 (``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``); their
``...ForSequenceClassification`` <-> DecoderClassifier (``score`` -> ``head``).

A Llama block is attnlab's pre-norm causal block with today's parts switched on:

    x' = x + W^O GQA(RMSNorm_1(x))          input_layernorm, self_attn.{q,k,v,o}_proj
    x''= x' + W2 (SiLU(W_g h) * W1 h),  h = RMSNorm_2(x')    post_attention_layernorm, mlp.*
    logits = RMSNorm_f(x_N) W_head           model.norm, lm_head (untied unless configured)

with rotary positions on q and k (``rope_theta`` = our ``rope_base``; "linear" and "llama3"
frequency scaling), grouped-query attention (``num_key_value_heads`` = our ``n_kv_heads``) and no
biases (``attention_bias``/``mlp_bias`` map to ``attn_bias``/``ffn_bias``). Mistral is the same
network with a sliding attention window (``sliding_window`` = our ``attn_window``) and no biases.
Qwen2 biases W_q, W_k, W_v but not W^O (``attn_bias=True, attn_out_bias=False``); Qwen3 adds
RMS norms on each head's queries and keys before the rotation (``qk_norm``,
``q_norm``/``k_norm``, epsilon ``rms_norm_eps``). Both slide their window on the layers
``layer_types`` marks "sliding_attention"; attnlab holds one kind of layer (all or none).

Weight layout: both sides store ``nn.Linear`` weights (out, in). attnlab's fused ``qkv_proj`` is
[W_q; W_k; W_v] stacked by rows; Hugging Face's q/k/v rows are already in the rotate-half order
that ``attnlab.nn.positional.RotaryPositions`` uses, so no permutation is needed.

Shapes: D hidden_size, H heads, G key/value heads, Dh head_dim, F intermediate_size, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable
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
    head_rows,
)
from attnlab.interop.family import (
    OMIT,
    PAD_ID,
    Family,
    Key,
    as_float,
    register,
    tie_key,
)
from attnlab.interop.weights_map import Mapped, config_dict, problems_message

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
CLASS_PREFIX = {"llama": "Llama", "mistral": "Mistral"}  # + ForSequenceClassification
SUPPORTED = (
    "Llama/Mistral/Qwen2/Qwen3 decoders with SiLU, rotary positions (scaling none, linear or "
    "llama3), pretraining_tp=1, any number of key/value heads, one kind of layer (all "
    "sliding or none), and " + HEADS
)
ROPE_FIELDS = (
    "rope_base",
    "rope_scaling",
    "rope_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_len",
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


def rope_type(data: dict[str, Any]) -> str:
    """The rotary scaling a config.json asks for ("default", "linear", "llama3", "yarn", ...),
    from any transformers version's keys."""
    return str(_rope(data)[1]["rope_type"])


ROPE_TYPES = ("default", "linear", "llama3")  # the rotary scalings attnlab reads


def read_rope(_: Any, data: dict[str, Any]) -> tuple:
    """The six rope_* ModelConfig fields of a config.json (any transformers version's keys)."""
    theta, scaling = _rope(data)
    if scaling["rope_type"] == "default":
        return (theta, "none", 1.0, 1.0, 4.0, None)
    return (
        theta,
        scaling["rope_type"],
        float(scaling["factor"]),
        float(scaling.get("low_freq_factor", 1.0)),
        float(scaling.get("high_freq_factor", 4.0)),
        scaling.get("original_max_position_embeddings"),
    )


def rope_parameters(cfg: ModelConfig) -> dict[str, Any]:
    """transformers' ``rope_parameters`` of ``cfg``'s rotary positions."""
    rope: dict[str, Any] = {"rope_theta": cfg.rope_base, "rope_type": "default"}
    if cfg.rope_scaling != "none":
        rope.update(rope_type=cfg.rope_scaling, factor=cfg.rope_factor)
        if cfg.rope_scaling == "llama3":
            rope.update(
                low_freq_factor=cfg.rope_low_freq_factor,
                high_freq_factor=cfg.rope_high_freq_factor,
                original_max_position_embeddings=cfg.rope_original_max_len,
            )
    return rope


def _model_type(cfg: ModelConfig) -> str:
    return "mistral" if cfg.attn_window is not None else "llama"


def _kv_heads(value: Any, data: dict[str, Any]) -> int | None:
    n = value or data["num_attention_heads"]
    return None if n == data["num_attention_heads"] else n


def _head_dim(value: Any, data: dict[str, Any]) -> int | None:
    d_model, n_heads = data["hidden_size"], data["num_attention_heads"]
    head_dim = value or d_model // n_heads
    return None if head_dim * n_heads == d_model else head_dim


def rope_scaling(cfg: ModelConfig) -> dict[str, Any] | None:
    """transformers < 5's ``rope_scaling`` of ``cfg`` (None without scaling)."""
    return None if cfg.rope_scaling == "none" else rope_parameters(cfg)


def _llama_bias(value: Any, data: dict[str, Any]) -> bool | None:
    """A Llama bias switch; Mistral's layers have no biases, whatever its config says."""
    return (bool(value) or None) if data.get("model_type") != "mistral" else None


def _window(value: Any, data: dict[str, Any]) -> int | None:
    return value if data.get("model_type") == "mistral" else None


# config.json <-> ModelConfig, both directions (attnlab.interop.family). The sizes every
# Llama-like config (Gemma's too) spells the same way:
SHAPE_KEYS = (
    Key("vocab_size", "vocab_size"),
    Key("hidden_size", "d_model"),
    Key("num_hidden_layers", "n_layers"),
    Key("num_attention_heads", "n_heads"),
    Key("num_key_value_heads", "n_kv_heads", lambda c: c.kv_heads, _kv_heads, default=None),
    Key("head_dim", "d_head", lambda c: c.head_dim, _head_dim, default=None),
    Key("intermediate_size", "d_ff", lambda c: c.ff_dim),
    Key("max_position_embeddings", "max_len", default=2048),
    Key("attention_dropout", "dropout", read=as_float, default=0.0),
    Key("rms_norm_eps", "norm_eps", read=as_float, default=1e-6),
    PAD_ID,
    Key("use_cache", (), lambda c: True, default=None),
)
# The rotary keys of one rotary base for all layers, in transformers 5's and 4's spellings.
ROPE_KEYS = (
    Key("rope_parameters", ROPE_FIELDS, rope_parameters, read_rope, default=None),
    Key("rope_theta", (), lambda c: c.rope_base, default=None),  # transformers < 5 reads these
    Key("rope_scaling", (), rope_scaling, default=None),
)
DECODER_KEYS = (
    *SHAPE_KEYS,
    Key("hidden_act", (), lambda c: "silu", default=None),
    *ROPE_KEYS,
    tie_key(default=False),
    *CLASSIFIER_KEYS,
)
KEYS = (
    Key("model_type", (), _model_type, default=None),
    architecture_key(
        lambda c: ARCHITECTURES[_model_type(c)],
        lambda c: CLASS_PREFIX[_model_type(c)] + CLASSIFIER_SUFFIX,
    ),
    *DECODER_KEYS,
    Key("pretraining_tp", (), lambda c: 1, default=None),
    Key("attention_bias", "attn_bias", lambda c: c.attention_bias, _llama_bias, default=False),
    Key("mlp_bias", "ffn_bias", lambda c: c.feedforward_bias, _llama_bias, default=False),
    Key("sliding_window", "attn_window", lambda c: c.attn_window or OMIT, _window, default=None),
)
# What Llama-layout decoders (Llama's and Gemma's) pin: rotary positions, RMSNorm, no biases.
ROTARY_RMSNORM = dict(positional="rotary", norm="rmsnorm", bias=False, attention="softmax")
DECODER_KINDS = ("decoder_lm", "decoder_classifier")  # ...ForCausalLM, ...ForSequenceClassif.


def decoder_family(
    name: str,
    export_name: str,
    keys: tuple[Key, ...],
    fixed: dict[str, Any],
    table: Callable[[ModelConfig], list[Mapped]],
) -> Family:
    """Register the Family of a decoder with both heads (a language model and a classifier)."""
    return register(Family(name, export_name, keys, fixed, table, kinds=DECODER_KINDS))


# A Llama block: pre-norm, SwiGLU, a final norm.
FIXED = {
    **ROTARY_RMSNORM,
    "norm_placement": "pre",
    "activation": "silu",
    "ffn": "swiglu",
    "final_norm": True,
}


def _layer_types(cfg: ModelConfig) -> list[str]:
    kind = "full_attention" if cfg.attn_window is None else "sliding_attention"
    return [kind] * cfg.n_layers


def _qwen_window(value: Any, data: dict[str, Any]) -> int | None:
    """The window of a Qwen config whose layers all slide (None when none does)."""
    types = value
    if not types:  # configs before ``layer_types``: layers from max_window_layers on slide
        n = data["num_hidden_layers"]
        first = data.get("max_window_layers", n) if data.get("use_sliding_window") else n
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    slides = data.get("sliding_window") is not None and all(t == "sliding_attention" for t in types)
    return data["sliding_window"] if slides else None


def _qwen_keys(model_type: str, name: str) -> tuple[Key, ...]:
    return (
        Key("model_type", (), lambda c: model_type, default=None),
        architecture_key(lambda c: name + "ForCausalLM", lambda c: name + CLASSIFIER_SUFFIX),
        *DECODER_KEYS,
        Key("use_sliding_window", (), lambda c: c.attn_window is not None, default=None),
        Key("sliding_window", (), lambda c: c.attn_window, default=None),
        Key("max_window_layers", (), lambda c: 0 if c.attn_window else c.n_layers, default=None),
        Key("layer_types", "attn_window", _layer_types, _qwen_window, default=None),
    )


QWEN3_KEYS = (
    *_qwen_keys("qwen3", "Qwen3"),
    Key("attention_bias", "attn_bias", lambda c: c.attention_bias, _llama_bias, default=False),
)


def llama_config_to_model_config(hf_config: Any) -> ModelConfig:
    """A Llama / Mistral / Qwen2 / Qwen3 config (or config.json's dict) -> the equivalent
    ModelConfig. Raises ConfigError listing every setting that has no attnlab equivalent."""
    data = config_dict(hf_config, "LlamaConfig")
    model_type = data.get("model_type", "llama")
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            f"model_type={model_type!r} is not a Llama-like model; this importer reads "
            f"{list(MODEL_TYPES)}"
        )
    data["model_type"] = model_type
    problems = []
    if data.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={data['hidden_act']!r} (attnlab's SwiGLU gates with silu)")
    if data.get("pretraining_tp", 1) != 1:
        problems.append(f"pretraining_tp={data['pretraining_tp']} (only 1)")
    if rope_type(data) not in ROPE_TYPES:
        problems.append(f"rope scaling {rope_type(data)!r} (attnlab has {', '.join(ROPE_TYPES)})")
    if data.get("layer_types") and len(set(data["layer_types"])) > 1:
        problems.append(f"mixed layer_types {sorted(set(data['layer_types']))} (one kind only)")
    problems += classifier_problems(data)
    if problems:
        raise ConfigError(problems_message(model_type, problems, SUPPORTED))
    return FAMILY_OF[model_type].read(data)


def qkv_rows(cfg: ModelConfig, h: str, b: str) -> list[Mapped]:
    """Hugging Face's q, k, v projections of layer ``h`` -> attnlab's fused ``qkv_proj`` of
    block ``b``: rows [W_q; W_k; W_v] of H*Dh, G*Dh, G*Dh; the bias too when there is one."""
    sizes = (cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim)
    qkv = tuple(f"{h}self_attn.{p}_proj" for p in "qkv")
    params = ("weight", "bias") if cfg.attention_bias else ("weight",)
    return [
        Mapped(tuple(f"{p}.{w}" for p in qkv), f"{b}self_attn.qkv_proj.{w}", sizes) for w in params
    ]


def decoder_table(
    cfg: ModelConfig,
    layer: Callable[[ModelConfig, str, str], list[Mapped]],
    offset: float = 0.0,
) -> list[Mapped]:
    """Hugging Face name(s) -> attnlab name for every tensor of a Llama-layout model (Llama's and
    Gemma's): the embeddings, each layer's fused q/k/v and the rows ``layer(cfg, h, b)`` gives
    for HF layer ``h`` and attnlab block ``b``, the final norm (its gain stored as
    g - ``offset``) and the head (an untied LM head, or a classifier's ``score``)."""
    table = [Mapped.one("model.embed_tokens.weight", "embed.tok_emb.weight")]
    for i in range(cfg.n_layers):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        table += qkv_rows(cfg, h, b)
        table += layer(cfg, h, b)
    table.append(Mapped.one("model.norm.weight", "final_norm.weight", offset=offset))
    return table + head_rows(cfg)


def _llama_layer(cfg: ModelConfig, h: str, b: str) -> list[Mapped]:
    """A Llama layer's tensors besides q/k/v."""
    pairs = [
        ("input_layernorm.weight", "self_attn_norm.weight"),
        ("self_attn.o_proj.weight", "self_attn.out_proj.weight"),
        ("post_attention_layernorm.weight", "ffn_norm.weight"),
        ("mlp.gate_proj.weight", "ffn.gate.weight"),
        ("mlp.up_proj.weight", "ffn.up.weight"),
        ("mlp.down_proj.weight", "ffn.down.weight"),
    ]
    if cfg.attention_out_bias:
        pairs.append(("self_attn.o_proj.bias", "self_attn.out_proj.bias"))
    if cfg.qk_norm:  # Qwen3
        pairs += [(f"self_attn.{n}.weight", f"self_attn.{n}.weight") for n in ("q_norm", "k_norm")]
    if cfg.feedforward_bias:
        pairs += [(f"mlp.{p}_proj.bias", f"ffn.{p}.bias") for p in ("gate", "up", "down")]
    return [Mapped.one(h + hf, b + ours) for hf, ours in pairs]


def llama_table(cfg: ModelConfig) -> list[Mapped]:
    """Hugging Face name(s) -> attnlab name for every tensor of a Llama-like model of ``cfg``."""
    return decoder_table(cfg, _llama_layer)


LLAMA = decoder_family("Llama", "llama", KEYS, FIXED, llama_table)
QWEN2_FIXED = {**FIXED, "attn_bias": True, "attn_out_bias": False}  # biased q, k, v; plain W^O
QWEN2 = decoder_family("Qwen2", "qwen2", _qwen_keys("qwen2", "Qwen2"), QWEN2_FIXED, llama_table)
QWEN3 = decoder_family("Qwen3", "qwen3", QWEN3_KEYS, {**FIXED, "qk_norm": True}, llama_table)
FAMILY_OF = {"llama": LLAMA, "mistral": LLAMA, "qwen2": QWEN2, "qwen3": QWEN3}
# The file around the tables: the head tied to embed_tokens, one reader for the four model types.
LLAMA_LM = CausalLM(
    families=(LLAMA, QWEN2, QWEN3),
    embedding="model.embed_tokens.weight",
    convert=llama_config_to_model_config,
    loader="LLAMA_LM.load",
)
