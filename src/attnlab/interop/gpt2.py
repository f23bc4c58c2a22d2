"""Hugging Face GPT-2 <-> attnlab DecoderLM (``GPT2LMHeadModel``) and DecoderClassifier
(``GPT2ForSequenceClassification``: ``score`` -> ``head``): the config and weight mapping (both
directions).

GPT-2 (Radford et al. 2019) is exactly our pre-norm decoder-only LM (000 "Transformer Decoder"):

    x_0 = E w + P_pos                          wte, wpe             -> embed.tok_emb, embed.pos_enc
    h   = x + W_O MultiHead(LN_1(x))           ln_1, attn.c_attn/c_proj -> self_attn_norm, self_attn
    x'  = h + W_2 gelu_tanh(W_1 LN_2(h))       ln_2, mlp.c_fc/c_proj    -> ffn_norm, ffn.up/down
    logits = LN_f(x_N) E^T                     ln_f, lm_head (tied to wte) -> final_norm, lm_head

Weight layout: HF GPT-2 uses ``Conv1D`` whose weight is stored (in, out), the transpose of
``nn.Linear``'s (out, in); every projection is transposed on the way in and out. The columns of
``c_attn`` are [q | k | v] with heads contiguous inside each part, which is exactly the row order
of our fused ``qkv_proj`` (see ``attnlab.nn.multihead``), so no head permutation is needed.

Shapes: D d_model (n_embd), F d_ff (n_inner), V vocabulary, N n_positions, H heads.

Deviations: GPT-2 has three dropout rates (embd/attn/resid); attnlab has one and takes
``resid_pdrop``. GPT-2's activation "gelu_new" is the tanh approximation of GELU, our "gelu_tanh".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.interop.causal_lm import (
    CLASSIFIER_KEYS,
    HEADS,
    CausalLM,
    DecoderModel,
    architecture_key,
    classifier_problems,
    head_rows,
)
from attnlab.interop.family import (
    PAD_ID,
    Family,
    Key,
    as_bool,
    as_float,
    register,
    tie_key,
)
from attnlab.interop.weights_map import Mapped, config_dict, problems_message

# HF activation_function -> attnlab activation, and back (the first HF name is the one we write).
_ACT_IN = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "relu": "relu",
    "relu2": "relu2",
}
_ACT_OUT = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "relu2": "relu2"}
# Causal-mask buffers that old GPT-2 checkpoints store next to the weights; not parameters.
_IGNORED = re.compile(r"(^|\.)h\.\d+\.attn\.(bias|masked_bias)$")


def _activation(value: Any, data: dict[str, Any]) -> str:
    return _ACT_IN[value]


def _activation_function(cfg: ModelConfig) -> str:
    return _ACT_OUT.get(cfg.activation, "gelu_new")  # another activation: lost, so refused


def _d_ff(value: Any, data: dict[str, Any]) -> int:
    return value or 4 * data["n_embd"]


# config.json <-> ModelConfig, both directions (attnlab.interop.family).
KEYS = (
    Key("model_type", (), lambda c: "gpt2", default=None),
    architecture_key(lambda c: "GPT2LMHeadModel", lambda c: "GPT2ForSequenceClassification"),
    Key("vocab_size", "vocab_size"),
    Key("n_positions", "max_len"),
    Key("n_embd", "d_model"),
    Key("n_layer", "n_layers"),
    Key("n_head", "n_heads"),
    Key("n_inner", "d_ff", lambda c: c.ff_dim, _d_ff, default=None),
    Key("activation_function", "activation", _activation_function, _activation, default="gelu_new"),
    Key("resid_pdrop", "dropout", read=as_float, default=0.0),
    Key("embd_pdrop", (), lambda c: c.dropout, default=None),  # attnlab has one dropout rate
    Key("attn_pdrop", (), lambda c: c.dropout, default=None),
    Key("layer_norm_epsilon", "norm_eps", read=as_float, default=1e-5),
    Key("scale_attn_weights", "scale_logits", read=as_bool, default=True),
    tie_key(default=True),
    PAD_ID,
    Key("scale_attn_by_inverse_layer_idx", (), lambda c: False, default=None),
    Key("reorder_and_upcast_attn", (), lambda c: False, default=None),
    Key("add_cross_attention", (), lambda c: False, default=None),
    Key("initializer_range", (), lambda c: 0.02, default=None),
    Key("use_cache", (), lambda c: True, default=None),
    *CLASSIFIER_KEYS,
)
# What the Transformer of GPT-2 and BERT pins: learned positions, LayerNorm, a biased MLP.
LEARNED_LAYERNORM = dict(
    positional="learned", norm="layernorm", ffn="mlp", bias=True, attention="softmax"
)
# What GPT-2's architecture pins (everything else comes from a key above): a pre-norm decoder.
FIXED = {**LEARNED_LAYERNORM, "norm_placement": "pre", "final_norm": True}
# GPT-2 stores every bias; a bias-free model is written with zero biases (the same function).
ALL_BIASES = dict(bias=True, attn_bias=None, attn_out_bias=None, ffn_bias=None)

# One block: (HF module, attnlab module, is a Conv1D whose weight is stored (in, out)).
_LAYER_KEYS = (
    ("ln_1", "self_attn_norm", False),
    ("attn.c_attn", "self_attn.qkv_proj", True),  # columns [q | k | v] = our rows
    ("attn.c_proj", "self_attn.out_proj", True),  # W^O
    ("ln_2", "ffn_norm", False),
    ("mlp.c_fc", "ffn.up", True),  # W_1
    ("mlp.c_proj", "ffn.down", True),  # W_2
)


def gpt2_table(cfg: ModelConfig) -> list[Mapped]:
    """Hugging Face ``GPT2LMHeadModel`` (``GPT2ForSequenceClassification``) name -> attnlab name
    for every tensor of ``cfg``'s model; biases are ``zero`` rows (GPT-2 always has them)."""
    t = "transformer."
    table = [
        Mapped.one(t + "wte.weight", "embed.tok_emb.weight"),
        Mapped.one(t + "wpe.weight", "embed.pos_enc.table.weight"),
    ]
    for i in range(cfg.n_layers):
        h, b = f"{t}h.{i}.", f"blocks.{i}."
        for hf, ours, conv in _LAYER_KEYS:
            table.append(Mapped.one(h + hf + ".weight", b + ours + ".weight", transpose=conv))
            table.append(Mapped.one(h + hf + ".bias", b + ours + ".bias", zero=True))
    table.append(Mapped.one(t + "ln_f.weight", "final_norm.weight"))
    table.append(Mapped.one(t + "ln_f.bias", "final_norm.bias", zero=True))
    return table + head_rows(cfg)


GPT2 = register(
    Family(
        name="GPT-2",
        export_name="gpt2",
        keys=KEYS,
        fixed=FIXED,
        table=gpt2_table,
        kinds=("decoder_lm", "decoder_classifier"),
        widens=ALL_BIASES,
    )
)


def gpt2_config_to_model_config(hf_config: Any) -> ModelConfig:
    """A GPT2Config (or the dict of its config.json) -> the equivalent attnlab ModelConfig."""
    data = config_dict(hf_config, "GPT2Config")
    model_type = data.get("model_type")
    if model_type is not None and model_type != "gpt2":
        raise ConfigError(
            f"this is a {model_type!r} model, not GPT-2 (config.json has "
            f"model_type={model_type!r}); attnlab imports only GPT-2 architectures"
        )
    act = data.get("activation_function", "gelu_new")
    if act not in _ACT_IN:
        raise ConfigError(
            f"GPT-2 activation_function={act!r} has no attnlab equivalent; supported: "
            f"{sorted(_ACT_IN)}"
        )
    if data.get("add_cross_attention"):
        raise ConfigError(
            "GPT-2 with add_cross_attention=true (an encoder-decoder) is not "
            "supported; only decoder-only GPT-2 language models are"
        )
    if data.get("scale_attn_by_inverse_layer_idx"):
        raise ConfigError(
            "GPT-2 with scale_attn_by_inverse_layer_idx=true is not supported "
            "(attnlab scales every layer's logits by 1/sqrt(d_head) only)"
        )
    problems = classifier_problems(data)
    if problems:
        raise ConfigError(problems_message("GPT-2", problems, "GPT-2 with " + HEADS))
    return GPT2.read(data)


# The file around the table: the head tied to wte, the reader, the causal-mask buffers skipped.
GPT2_LM = CausalLM(
    families=(GPT2,),
    embedding="transformer.wte.weight",
    convert=gpt2_config_to_model_config,
    loader="load_gpt2_state_dict",
    ignored=_IGNORED,
)


def check_gpt2_compatible(cfg: ModelConfig) -> None:
    """Raise ConfigError naming every setting of ``cfg`` that does not survive the round trip
    through GPT-2's config (and the family that would hold it)."""
    GPT2_LM.family(cfg)


def model_config_to_gpt2_config(
    cfg: ModelConfig,
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
    pad_id: int | None = None,
) -> dict[str, Any]:
    """The config.json dict that ``transformers.GPT2Config`` reads for an attnlab ModelConfig."""
    return GPT2_LM.config_json(cfg, dict(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id))


def load_gpt2_state_dict(
    model: DecoderModel | None, state_dict: Mapping[str, Tensor], config: Any = None
) -> DecoderModel:
    """Copy HF GPT-2 weights into ``model``, or into a new DecoderLM (DecoderClassifier) built
    from ``config``.

    ``state_dict`` may come from GPT2LMHeadModel ("transformer.h.0...", "lm_head.weight"),
    GPT2ForSequenceClassification ("score.weight": a DecoderClassifier) or the bare GPT2Model
    ("h.0..."). ``config`` (needed when ``model`` is None) is an attnlab
    ModelConfig, a GPT2Config, or the dict of config.json. Every tensor is shape-checked against
    the model; missing and unexpected keys are errors. Returns the model in eval mode.
    """
    tensors = {
        k if k.startswith(("transformer.", "lm_head.", "score.")) else "transformer." + k: v
        for k, v in state_dict.items()
    }
    return GPT2_LM.load(model, tensors, config)


def to_gpt2_state_dict(model: DecoderModel) -> dict[str, Tensor]:
    """attnlab DecoderLM -> the state dict of ``transformers.GPT2LMHeadModel`` (fresh tensors);
    a DecoderClassifier -> ``GPT2ForSequenceClassification``'s.

    Bias-free layers export zero biases. With tied embeddings "lm_head.weight" is the same tensor
    as "transformer.wte.weight", as in HF.
    """
    return GPT2_LM.export(model)
