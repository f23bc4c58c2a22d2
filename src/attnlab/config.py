"""Frozen, validated model configuration and presets.

One dataclass, :class:`ModelConfig`, describes every model family attnlab builds. Only
``attnlab.models.build_model`` reads it; leaf modules in ``attnlab.nn`` take explicit arguments.
Names follow Vaswani et al. (2017): ``d_model, n_heads, d_head, d_ff, n_layers, vocab_size,
max_len, dropout``.

Glossary of ``kind``:
    decoder_lm        GPT-like decoder-only language model (000 "Transformer Decoder").
    encoder_decoder   Vaswani encoder-decoder, teacher forcing (000/003/004).
    classifier        BERT-like encoder-only classifier, CLS or mean pooling (003).
    decoder_classifier  a decoder-only Transformer (GPT-2, Llama) whose class logits are read
                      from the last real token (Hugging Face's ...ForSequenceClassification).
    encoder           a bare Transformer encoder producing contextual vectors (000).
    masked_lm         a BERT-like encoder with a masked-token prediction head (Devlin et al.).
    rnn_lm            the simple RNN language model of 000: h_t = sigma(W h_{t-1} + U x_t).
    lstm_seq2seq      Sutskever et al. LSTM encoder-decoder; with ``rnn_attention`` set, the
                      Bahdanau (additive) or Luong (dot/general) attention decoder of 004 eq. 4-8.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from attnlab.errors import ConfigValueError

ModelKind = Literal[
    "decoder_lm",
    "encoder_decoder",
    "classifier",
    "decoder_classifier",
    "encoder",
    "masked_lm",
    "rnn_lm",
    "lstm_seq2seq",
]
TRANSFORMER_KINDS = (
    "decoder_lm",
    "encoder_decoder",
    "classifier",
    "decoder_classifier",
    "encoder",
    "masked_lm",
)
RECURRENT_KINDS = ("rnn_lm", "lstm_seq2seq")
LM_KINDS = ("decoder_lm", "rnn_lm")
SEQ2SEQ_KINDS = ("encoder_decoder", "lstm_seq2seq")
CLASSIFIER_KINDS = ("classifier", "decoder_classifier")
DECODER_ONLY_KINDS = ("decoder_lm", "decoder_classifier")  # a causal stack of blocks, no encoder

_CHOICES: dict[str, tuple[Any, ...]] = {
    "kind": TRANSFORMER_KINDS + RECURRENT_KINDS,
    "positional": ("learned", "sinusoidal", "concat", "rotary", "alibi", "none"),
    "norm": ("layernorm", "rmsnorm", "none"),
    "norm_placement": ("pre", "post", "sandwich"),
    "activation": ("relu", "gelu", "gelu_tanh", "relu2", "silu"),
    "ffn": ("mlp", "swiglu", "geglu", "none"),
    "rope_scaling": ("none", "linear", "llama3"),
    "attention": ("softmax", "hardmax"),
    "pooling": ("cls", "mean"),
    "rnn_attention": ("none", "additive", "dot", "general"),
}


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of one model. Validated on construction; derived sizes are properties."""

    kind: str = "decoder_lm"
    vocab_size: int = 256
    tgt_vocab_size: int | None = None  # encoder-decoder with a separate target vocabulary
    n_classes: int | None = None  # classifiers only
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int | None = None  # key/value heads: None = n_heads (MHA), 1 = MQA, else GQA
    d_head: int | None = None  # d_k = d_q per head; default d_model // n_heads
    d_v: int | None = None  # value width per head; default d_head
    n_layers: int = 2  # decoder-only / encoder-only depth, and encoder depth of seq2seq
    n_decoder_layers: int | None = None  # seq2seq decoder depth; default n_layers
    d_ff: int | None = None  # feed-forward hidden width; default ffn_mult * d_model
    ffn_mult: float = 4.0  # 000 uses 5x, Vaswani 4x
    max_len: int = 256  # longest sequence the model accepts (learned table size)
    dropout: float = 0.0
    positional: str = "learned"
    norm: str = "layernorm"  # "none": every norm of the model is the identity (an ablation)
    norm_placement: str = "pre"  # "pre": f(LN(h)) + h, "post": LN(f(h) + h)  (000 Add & Norm),
    # "sandwich": LN'(f(LN(h))) + h (Gemma 2/3; decoder-only LMs)
    norm_eps: float = 1e-5
    activation: str = "relu"
    ffn: str = "mlp"  # "mlp": W2 a(W1 h); "swiglu"/"geglu": W2 (a(W_g h) * W1 h) (Shazeer 2020)
    # "none": no feed-forward sublayer (it adds 0; an ablation, d_ff is then unused)
    bias: bool = True
    attn_bias: bool | None = None  # biases of W_q, W_k, W_v, W^O; None = ``bias``
    attn_out_bias: bool | None = None  # bias of W^O alone; None = attn_bias (Qwen2: False)
    ffn_bias: bool | None = None  # biases of the feed-forward matrices; None = ``bias``
    attn_window: int | None = None  # sliding-window causal attention: each query sees W keys
    full_attn_every: int | None = None  # with attn_window: every k-th layer (k-1, 2k-1, ...)
    # attends to all keys, the others slide (Gemma 2: k = 2); None = every layer slides
    attention: str = "softmax"  # row activation a(.) of 004 eq. 9: soft or hard attention
    straight_through: bool = True  # hard attention: backpropagate the softmax gradient (STE)
    scale_logits: bool = True  # divide Q K^T by sqrt(d_head); off only for experiments
    attn_logit_softcap: float | None = None  # c: attention logits -> c tanh(s / c) (Gemma 2)
    final_logit_softcap: float | None = None  # c: LM head logits -> c tanh(z / c) (Gemma 2)
    qk_norm: bool = False  # RMS-normalise queries and keys per head (eps = norm_eps; Qwen3)
    out_proj: bool = True  # W^O after concatenating heads (002 omits it)
    qkv_proj: bool = True  # W_q, W_k, W_v of self-attention; False: q = k = v = x (001's basic,
    # parameter-free self-attention; needs d_head, d_v, n_kv_heads unset)
    tie_embeddings: bool = True  # decoder LM: lm_head.weight = tok_emb.weight
    final_norm: bool = True  # a norm after the last block (needed for pre-norm)
    embed_scale: bool = False  # multiply token embeddings by sqrt(d_model) (Vaswani 3.4)
    embed_norm: bool = False  # a norm on the summed embeddings (BERT)
    n_token_types: int = 0  # segment embeddings T_type added to the tokens (BERT: 2); 0 = none
    pooler: bool = False  # encoder: tanh(W h_CLS + b), the pooled vector BERT classifies
    rope_base: float = 10000.0
    rope_scaling: str = "none"  # rotary frequency scaling: "linear" (PI) or "llama3"
    rope_factor: float = 1.0  # the scaling factor s (positions / s, or low frequencies / s)
    rope_low_freq_factor: float = 1.0  # llama3 scaling: wavelengths above L / this are scaled
    rope_high_freq_factor: float = 4.0  # llama3 scaling: wavelengths below L / this are kept
    rope_original_max_len: int | None = None  # llama3 scaling: the pre-training context L
    pooling: str = "cls"  # classifier: "cls" token or "mean" over non-padding (a
    # decoder_classifier always reads its last real token: the only one that has seen them all)
    # Recurrent families.
    rnn_attention: str = "none"  # lstm_seq2seq: "additive" = Bahdanau (004 eq. 4-8)
    reverse_source: bool = False  # Sutskever et al.: feed x_{T:1} to the encoder (004)
    bidirectional: bool = False  # bidirectional LSTM encoder
    d_attn: int | None = None  # additive attention width; default d_model
    pad_id: int = 0  # padding token id of the (source and target) vocabulary
    # Engine: run on attnlab.fast's drop-in modules (the same function; see docs/fast.md).
    fast: bool = False

    def __post_init__(self) -> None:
        _check_types(self)
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                raise ConfigValueError(
                    f"ModelConfig.{name}={getattr(self, name)!r} is not one of {list(choices)}",
                    fields=(name,),
                )
        _positive(self, "vocab_size", "d_model", "n_heads", "n_layers", "max_len")
        if self.kind in TRANSFORMER_KINDS and self.d_head is None and self.d_model % self.n_heads:
            raise ConfigValueError(
                f"d_model={self.d_model} must be divisible by n_heads={self.n_heads} "
                f"(or set d_head explicitly); try n_heads in {_divisors(self.d_model)}",
                fields=("d_model", "n_heads"),
            )
        for name in (
            "d_head",
            "d_v",
            "n_decoder_layers",
            "d_ff",
            "tgt_vocab_size",
            "d_attn",
            "n_kv_heads",
            "attn_window",
            "full_attn_every",
            "rope_original_max_len",
            "n_classes",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ConfigValueError(
                    f"ModelConfig.{name}={value!r} must be a positive int or None", fields=(name,)
                )
        if not isinstance(self.n_token_types, int) or self.n_token_types < 0:
            raise ConfigValueError(
                f"ModelConfig.n_token_types={self.n_token_types!r} must be an int >= 0",
                fields=("n_token_types",),
            )
        for name in ("ffn_mult", "norm_eps", "rope_base", "rope_factor", "dropout"):
            _finite(self, name)
        for name in ("rope_low_freq_factor", "rope_high_freq_factor"):
            _finite(self, name)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigValueError(
                f"ModelConfig.dropout={self.dropout} must be in [0, 1)", fields=("dropout",)
            )
        if not self.ffn_mult > 0 or self.ff_dim < 1:
            raise ConfigValueError(
                f"ModelConfig.ffn_mult={self.ffn_mult} must be > 0 and give a feed-forward width "
                f"d_ff >= 1 (got d_ff={self.ff_dim})",
                fields=("ffn_mult",),
            )
        if not self.norm_eps > 0:
            raise ConfigValueError(
                f"ModelConfig.norm_eps={self.norm_eps} must be > 0", fields=("norm_eps",)
            )
        if not self.rope_base > 1:
            raise ConfigValueError(
                f"ModelConfig.rope_base={self.rope_base} must be > 1", fields=("rope_base",)
            )
        if self.kind in CLASSIFIER_KINDS and (self.n_classes is None or self.n_classes < 2):
            raise ConfigValueError("a classifier needs n_classes >= 2", fields=("n_classes",))
        if self.positional == "rotary" and self.head_dim % 2:
            raise ConfigValueError(
                f"rotary positions need an even d_head, got {self.head_dim}",
                fields=("d_head", "d_model", "n_heads"),
            )
        if self.n_heads % self.kv_heads:
            raise ConfigValueError(
                f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.kv_heads} (each "
                f"key/value head serves n_heads / n_kv_heads query heads); try n_kv_heads in "
                f"{_divisors(self.n_heads)}",
                fields=("n_heads", "n_kv_heads"),
            )
        gates = {"swiglu": ("silu",), "geglu": ("gelu", "gelu_tanh")}.get(self.ffn)
        if gates is not None and self.activation not in gates:
            raise ConfigValueError(
                f"ffn={self.ffn!r} gates with activation in {list(gates)}, got "
                f"activation={self.activation!r}; set activation={gates[0]!r}",
                fields=("ffn", "activation"),
            )
        if self.rope_scaling != "none" and not self.rope_factor > 0:
            raise ConfigValueError(
                f"ModelConfig.rope_factor={self.rope_factor} must be > 0", fields=("rope_factor",)
            )
        if self.rope_scaling == "llama3" and self.rope_original_max_len is None:
            raise ConfigValueError(
                "rope_scaling='llama3' needs rope_original_max_len (the context L)",
                fields=("rope_original_max_len",),
            )
        if self.attn_window is not None and self.kind not in DECODER_ONLY_KINDS:
            raise ConfigValueError(
                f"attn_window={self.attn_window} (sliding-window causal attention) applies to "
                f"decoder-only models, not kind={self.kind!r}",
                fields=("attn_window", "kind"),
            )
        if self.full_attn_every is not None and self.attn_window is None:
            raise ConfigValueError(
                f"full_attn_every={self.full_attn_every} picks the layers that attend to all keys "
                "among sliding-window layers, but attn_window is None; set attn_window or leave "
                "full_attn_every None",
                fields=("full_attn_every", "attn_window"),
            )
        if self.full_attn_every == 1:
            raise ConfigValueError(
                "full_attn_every=1 makes every layer attend to all keys; set attn_window=None "
                "instead (or k >= 2 for every k-th layer full)",
                fields=("full_attn_every", "attn_window"),
            )
        for name in ("attn_logit_softcap", "final_logit_softcap"):
            cap = getattr(self, name)
            if cap is not None and not (math.isfinite(cap) and cap > 0):
                raise ConfigValueError(
                    f"ModelConfig.{name}={cap!r} must be a finite number > 0 (the soft-cap c of "
                    "c tanh(x / c)) or None for no cap",
                    fields=(name,),
                )
        if self.final_logit_softcap is not None and self.kind != "decoder_lm":
            raise ConfigValueError(
                f"final_logit_softcap={self.final_logit_softcap} caps a decoder-only LM's output "
                f"logits, not kind={self.kind!r}; leave it None",
                fields=("final_logit_softcap", "kind"),
            )
        if not self.qkv_proj and (
            self.kind not in TRANSFORMER_KINDS
            or self.head_dim * self.n_heads != self.d_model
            or self.value_dim != self.head_dim
            or self.kv_heads != self.n_heads
        ):
            raise ConfigValueError(
                "qkv_proj=False (q = k = v = x, 001's basic self-attention) needs a Transformer "
                "whose heads split d_model exactly: leave d_head, d_v and n_kv_heads unset "
                f"(got kind={self.kind!r}, d_head={self.d_head}, d_v={self.d_v}, "
                f"n_kv_heads={self.n_kv_heads})",
                fields=("qkv_proj", "d_head", "d_v", "n_kv_heads"),
            )
        if self.norm_placement == "sandwich" and self.kind not in DECODER_ONLY_KINDS:
            raise ConfigValueError(
                "norm_placement='sandwich' (Gemma's norms around each sublayer) applies to "
                f"decoder-only models, not kind={self.kind!r}; use 'pre' or 'post'",
                fields=("norm_placement", "kind"),
            )
        if self.positional == "alibi" and self.kind in RECURRENT_KINDS:
            raise ConfigValueError(
                "positional='alibi' applies to Transformer models only", fields=("positional",)
            )
        if self.pooler and (
            self.kind not in ("encoder", "classifier", "masked_lm") or self.pooling != "cls"
        ):
            raise ConfigValueError(
                "pooler=True (BERT's tanh(W h_CLS + b)) needs an encoder, classifier or masked_lm "
                f"with pooling='cls', got kind={self.kind!r}, pooling={self.pooling!r}",
                fields=("pooler", "pooling"),
            )
        if self.positional == "concat" and self.kind in RECURRENT_KINDS:
            raise ConfigValueError(
                "positional='concat' applies to Transformer models only", fields=("positional",)
            )
        if not isinstance(self.pad_id, int) or not 0 <= self.pad_id < self.vocab_size:
            raise ConfigValueError(
                f"pad_id={self.pad_id} must be a token id below {self.vocab_size}",
                fields=("pad_id",),
            )

    # Derived sizes -------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        """d_k = d_q of one head."""
        return self.d_head if self.d_head is not None else self.d_model // self.n_heads

    def layer_window(self, layer: int) -> int | None:
        """The attention window of layer ``layer`` (0-based): ``attn_window``, except that every
        ``full_attn_every``-th layer (k-1, 2k-1, ...) attends to all earlier keys (None)."""
        k = self.full_attn_every
        if k is not None and (layer + 1) % k == 0:
            return None
        return self.attn_window

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_heads, default n_heads (one per query head)."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def attention_bias(self) -> bool:
        return self.bias if self.attn_bias is None else self.attn_bias

    @property
    def attention_out_bias(self) -> bool:
        """Whether W^O has a bias: attn_out_bias, default the attention biases'."""
        return self.attention_bias if self.attn_out_bias is None else self.attn_out_bias

    @property
    def feedforward_bias(self) -> bool:
        return self.bias if self.ffn_bias is None else self.ffn_bias

    @property
    def value_dim(self) -> int:
        """d_v of one head."""
        return self.d_v if self.d_v is not None else self.head_dim

    @property
    def ff_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else int(round(self.ffn_mult * self.d_model))

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def target_vocab_size(self) -> int:
        return self.tgt_vocab_size if self.tgt_vocab_size is not None else self.vocab_size

    @property
    def attn_dim(self) -> int:
        return self.d_attn if self.d_attn is not None else self.d_model

    # Serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        return from_dict(cls, data)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def from_dict(cls: type, data: dict[str, Any]):
    """Build dataclass ``cls`` from a plain dict; unknown keys are an error listing valid ones."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} settings must be a table/dict, got {type(data).__name__}")
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown {cls.__name__} key(s) {unknown}; valid keys are: {', '.join(valid)}"
        )
    try:
        return cls(**data)
    except TypeError as err:  # e.g. wrong value types reaching int comparisons
        raise ValueError(f"bad {cls.__name__} value: {err}") from None


_TYPES = {"float": (int, float), "bool": (bool,), "str": (str,)}  # ints: see _positive


def _check_types(cfg) -> None:
    """Each field must hold its annotated type (a TOML "0.1" string is an error, not a float)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        ann = str(f.type).replace(" ", "")
        optional = ann.endswith("|None")
        base = ann.removesuffix("|None")
        if base not in _TYPES or (optional and value is None):
            continue
        ok = isinstance(value, _TYPES[base]) and (base == "bool" or not isinstance(value, bool))
        if not ok:
            raise ConfigValueError(
                f"{type(cfg).__name__}.{f.name}={value!r} must be of type {base}"
                + (" or None" if optional else ""),
                fields=(f.name,),
            )


def _finite(cfg: ModelConfig, name: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigValueError(
            f"ModelConfig.{name}={value!r} must be a finite number", fields=(name,)
        )


def _positive(cfg: ModelConfig, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigValueError(
                f"ModelConfig.{name}={value!r} must be a positive int", fields=(name,)
            )


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 64) + 1) if n % k == 0]


# Presets: plain dicts of ModelConfig fields. Build with ModelConfig(**PRESETS[name], vocab_size=V).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=64),  # tests, seconds
    "small": dict(d_model=128, n_heads=4, n_layers=4, max_len=256),
    "base": dict(
        d_model=512,
        n_heads=8,
        n_layers=6,
        d_ff=2048,
        max_len=512,
        dropout=0.1,
        positional="sinusoidal",
        norm_placement="post",
        embed_scale=True,
    ),  # Vaswani
}
