"""Hugging Face GPT-2 <-> attnlab DecoderLM: the config and weight mapping (both directions).

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

import torch
from torch import Tensor

from attnlab.config import ModelConfig
from attnlab.errors import CheckpointError, ConfigError
from attnlab.interop.weights_map import config_dict, mismatches, model_to_load
from attnlab.models.lm import DecoderLM

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
_REQUIRED = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
# Causal-mask buffers that old GPT-2 checkpoints store next to the weights; not parameters.
_IGNORED = re.compile(r"(^|\.)h\.\d+\.attn\.(bias|masked_bias)$")


def gpt2_config_to_model_config(hf_config: Any) -> ModelConfig:
    """A GPT2Config (or the dict of its config.json) -> the equivalent attnlab ModelConfig."""
    data = config_dict(hf_config, "GPT2Config")
    model_type = data.get("model_type")
    if model_type is not None and model_type != "gpt2":
        raise ConfigError(
            f"this is a {model_type!r} model, not GPT-2 (config.json has "
            f"model_type={model_type!r}); attnlab imports only GPT-2 architectures"
        )
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ConfigError(f"GPT-2 config is missing {missing}; expected keys {list(_REQUIRED)}")
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
    n_embd = data["n_embd"]
    try:
        return ModelConfig(
            kind="decoder_lm",
            vocab_size=data["vocab_size"],
            d_model=n_embd,
            n_heads=data["n_head"],
            n_layers=data["n_layer"],
            d_ff=data.get("n_inner") or 4 * n_embd,
            max_len=data["n_positions"],
            dropout=float(data.get("resid_pdrop", 0.0)),
            positional="learned",
            norm="layernorm",
            norm_placement="pre",
            norm_eps=float(data.get("layer_norm_epsilon", 1e-5)),
            activation=_ACT_IN[act],
            bias=True,
            scale_logits=bool(data.get("scale_attn_weights", True)),
            tie_embeddings=bool(data.get("tie_word_embeddings", True)),
            final_norm=True,
        )
    except (TypeError, ValueError) as err:
        raise ConfigError(f"GPT-2 config does not make a valid attnlab model: {err}") from None


def check_gpt2_compatible(cfg: ModelConfig) -> None:
    """Raise ConfigError listing every setting of ``cfg`` that GPT-2's architecture cannot hold."""
    if cfg.kind != "decoder_lm":
        raise ConfigError(
            f"only decoder-only language models (kind='decoder_lm') map to GPT-2, "
            f"this model has kind={cfg.kind!r}"
        )
    wanted = {
        "positional": "learned",
        "norm": "layernorm",
        "norm_placement": "pre",
        "attention": "softmax",
        "final_norm": True,
        "qk_norm": False,
        "out_proj": True,
        "embed_scale": False,
    }
    problems = mismatches(cfg, wanted, "GPT-2")
    if cfg.activation not in _ACT_OUT:
        problems.append(f"activation={cfg.activation!r} (GPT-2 supports {sorted(_ACT_OUT)})")
    if cfg.head_dim * cfg.n_heads != cfg.d_model or cfg.value_dim != cfg.head_dim:
        problems.append(
            f"d_head={cfg.head_dim}, d_v={cfg.value_dim} (GPT-2 needs both equal to "
            f"d_model / n_heads = {cfg.d_model / cfg.n_heads:g})"
        )
    if problems:
        raise ConfigError("this model cannot be expressed as GPT-2: " + "; ".join(problems))


def model_config_to_gpt2_config(
    cfg: ModelConfig,
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
    pad_id: int | None = None,
) -> dict[str, Any]:
    """The config.json dict that ``transformers.GPT2Config`` reads for an attnlab ModelConfig."""
    check_gpt2_compatible(cfg)
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_len,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": cfg.ff_dim,
        "activation_function": _ACT_OUT[cfg.activation],
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
        "layer_norm_epsilon": cfg.norm_eps,
        "initializer_range": 0.02,
        "scale_attn_weights": cfg.scale_logits,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "use_cache": True,
    }


# One block: (HF module, attnlab module, is a Conv1D whose weight must be transposed).
_LAYER_KEYS = (
    ("ln_1", "self_attn_norm", False),
    ("attn.c_attn", "self_attn.qkv_proj", True),  # columns [q | k | v] = our rows
    ("attn.c_proj", "self_attn.out_proj", True),  # W^O
    ("ln_2", "ffn_norm", False),
    ("mlp.c_fc", "ffn.up", True),  # W_1
    ("mlp.c_proj", "ffn.down", True),  # W_2
)


def _key_map(n_layers: int) -> list[tuple[str, str, bool]]:
    """(HF key without the 'transformer.' prefix, attnlab key, Conv1D transpose?) for every tensor
    except the head."""
    keys = [
        ("wte.weight", "embed.tok_emb.weight", False),
        ("wpe.weight", "embed.pos_enc.table.weight", False),
    ]
    for i in range(n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        for hf, ours, conv in _LAYER_KEYS:
            keys.append((h + hf + ".weight", b + ours + ".weight", conv))
            keys.append((h + hf + ".bias", b + ours + ".bias", False))
    keys += [("ln_f.weight", "final_norm.weight", False), ("ln_f.bias", "final_norm.bias", False)]
    return keys


def load_gpt2_state_dict(
    model: DecoderLM | None, state_dict: Mapping[str, Tensor], config: Any = None
) -> DecoderLM:
    """Copy HF GPT-2 weights into ``model``, or into a new DecoderLM built from ``config``.

    ``state_dict`` may come from GPT2LMHeadModel ("transformer.h.0...", "lm_head.weight") or from
    the bare GPT2Model ("h.0..."). ``config`` (needed when ``model`` is None) is an attnlab
    ModelConfig, a GPT2Config, or the dict of config.json. Every tensor is shape-checked against
    the model; missing and unexpected keys are errors. Returns the model in eval mode.
    """
    model = model_to_load(
        model,
        config,
        loader="load_gpt2_state_dict",
        convert=gpt2_config_to_model_config,
        check=check_gpt2_compatible,
        build=DecoderLM,
        family="GPT-2",
        cls=DecoderLM,
    )
    cfg = model.cfg
    hf = {k.removeprefix("transformer."): v for k, v in state_dict.items()}
    head = hf.pop("lm_head.weight", None)
    targets = model.state_dict(keep_vars=True)
    missing: list[str] = []
    with torch.no_grad():
        for hf_key, our_key, conv in _key_map(cfg.n_layers):
            if hf_key not in hf:
                missing.append("transformer." + hf_key)
                continue
            tensor = hf.pop(hf_key)
            _copy(
                targets.get(our_key),
                tensor.t() if conv else tensor,
                "transformer." + hf_key,
                our_key,
                conv,
            )
        if missing:
            raise CheckpointError(
                f"GPT-2 weights are missing {len(missing)} tensor(s), e.g. {missing[:3]}; the file "
                f"is incomplete or has fewer layers than n_layer={cfg.n_layers}"
            )
        _load_head(model, head, cfg.tie_embeddings)
    unexpected = sorted(k for k in hf if not _IGNORED.search(k))
    if unexpected:
        raise CheckpointError(
            f"GPT-2 weights have {len(unexpected)} tensor(s) attnlab does not know, e.g. "
            f"{unexpected[:3]}; is the config's n_layer ({cfg.n_layers}) too small, or is "
            "this a GPT-2 variant (cross-attention, classification head)?"
        )
    return model.eval()


def _copy(target: Tensor | None, value: Tensor, hf_key: str, our_key: str, conv: bool) -> None:
    if target is None:  # a bias-free attnlab model: GPT-2's bias must then be zero
        if bool(value.any()):
            raise CheckpointError(
                f"{hf_key} is non-zero but the model has bias=False "
                f"(no {our_key}); build the model with bias=True"
            )
        return
    if tuple(value.shape) != tuple(target.shape):
        stored = tuple(value.t().shape) if conv else tuple(value.shape)
        expect = tuple(target.t().shape) if conv else tuple(target.shape)
        raise CheckpointError(
            f"shape mismatch for {hf_key}: the file has {stored}, the config implies {expect}"
            + (" (Conv1D, stored (in, out))" if conv else "")
            + "; the weights and config.json disagree"
        )
    target.copy_(value)


def _load_head(model: DecoderLM, head: Tensor | None, tied: bool) -> None:
    wte = model.embed.tok_emb.weight
    if tied:
        if head is not None and (head.shape != wte.shape or not torch.equal(head.to(wte), wte)):
            raise CheckpointError(
                "lm_head.weight differs from transformer.wte.weight but the config ties them "
                "(tie_word_embeddings=true); set tie_word_embeddings to false in config.json to "
                "keep the separate output head"
            )
        return
    if head is None:
        raise CheckpointError(
            "the config unties the output head (tie_word_embeddings=false) but "
            "the weights have no lm_head.weight"
        )
    _copy(model.lm_head.weight, head, "lm_head.weight", "lm_head.weight", False)


def to_gpt2_state_dict(model: DecoderLM) -> dict[str, Tensor]:
    """attnlab DecoderLM -> the state dict of ``transformers.GPT2LMHeadModel`` (fresh tensors).

    Bias-free layers export zero biases. With tied embeddings "lm_head.weight" is the same tensor
    as "transformer.wte.weight", as in HF.
    """
    if not isinstance(model, DecoderLM):
        raise TypeError(f"only a DecoderLM exports to GPT-2, got {type(model).__name__}")
    check_gpt2_compatible(model.cfg)
    ours = model.state_dict()
    out: dict[str, Tensor] = {}
    for hf_key, our_key, conv in _key_map(model.cfg.n_layers):
        if our_key in ours:
            t = ours[our_key].detach()
            out["transformer." + hf_key] = (t.t() if conv else t).contiguous().clone()
        else:  # bias=False: GPT-2 always has a bias; zero is the same function
            width = ours[our_key.removesuffix(".bias") + ".weight"].shape[0]
            out["transformer." + hf_key] = torch.zeros(width, dtype=model.lm_head.weight.dtype)
    wte = out["transformer.wte.weight"]
    tied = model.cfg.tie_embeddings
    out["lm_head.weight"] = wte if tied else model.lm_head.weight.detach().contiguous().clone()
    return out
