"""Interop by round trip and coverage (attnlab.interop.family): export is allowed exactly when the
config survives ``read(write(cfg))``; every tensor maps exactly once, both ways.

Three layers of evidence, over a hypothesis-generated config space that covers grouped KV heads,
GeGLU/SwiGLU, sliding windows (on every layer or alternating with full ones), logit soft-caps,
embedding norms, token types, biases, every position scheme and tying (models stay tiny, so each
example costs milliseconds):

* the config round trip (200 configs per family, no weights): refusals name every lost field,
  and fixing exactly those fields makes the config exportable;
* the weights round trip (100 configs per family): an exportable model written through the
  family's tensor table and read into the model of ``read(write(cfg))`` computes the same logits;
* transformers (a few configs per family): the exported directory loads in ``transformers`` with
  logits within 1e-5, and a refused export writes nothing.

Each decoder family is drawn as a language model and as a classifier (``decoder_classifier``,
Hugging Face's ``...ForSequenceClassification``). Plus the five failures issue 32 demonstrated,
kept as regression tests.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from attnlab.config import ModelConfig
from attnlab.errors import CheckpointError, ConfigError
from attnlab.interop import export_as, save_gpt2_dir
from attnlab.interop.family import REGISTRY, canonical, check_exportable
from attnlab.interop.pretrained import load_pretrained, save_pretrained
from attnlab.interop.weights_map import check_table, export_mapped, load_mapped
from attnlab.models import build_model

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

# Each family's own shape; the strategy perturbs a few fields of it (or none).
ROTARY = dict(kind="decoder_lm", positional="rotary", norm="rmsnorm", bias=False)
SWIGLU = dict(ROTARY, ffn="swiglu", activation="silu")  # Llama's block, and Qwen's
NATURAL = {
    "gpt2": dict(kind="decoder_lm", positional="learned", activation="gelu_tanh"),
    "llama": dict(SWIGLU, tie_embeddings=False),
    "qwen2": dict(SWIGLU, attn_bias=True, attn_out_bias=False),
    "qwen3": dict(SWIGLU, qk_norm=True),
    "gemma3": dict(
        ROTARY,
        norm_placement="sandwich",
        ffn="geglu",
        activation="gelu_tanh",
        embed_scale=True,
        qk_norm=True,
    ),
    "gemma": dict(
        ROTARY, ffn="geglu", activation="gelu_tanh", embed_scale=True, tie_embeddings=True
    ),
    "gemma2": dict(
        ROTARY,
        norm_placement="sandwich",
        ffn="geglu",
        activation="gelu_tanh",
        embed_scale=True,
        attn_window=3,
        full_attn_every=2,
        attn_logit_softcap=2.0,
        final_logit_softcap=5.0,
    ),
    "bert": dict(
        kind="encoder",
        norm_placement="post",
        activation="gelu",
        final_norm=False,
        embed_norm=True,
        n_token_types=2,
        pooler=True,
    ),
}
FFN = [("mlp", a) for a in ("relu", "gelu", "gelu_tanh", "relu2", "silu")] + [
    ("swiglu", "silu"),
    ("geglu", "gelu"),
    ("geglu", "gelu_tanh"),
]
# The config space: every ModelConfig field a Transformer family could hold or lose.
SPACE = {
    "kind": [
        "decoder_lm",
        "decoder_classifier",
        "encoder",
        "classifier",
        "masked_lm",
        "encoder_decoder",
    ],
    "ffn_activation": FFN,
    "n_kv_heads": [None, 1, 2],
    "d_head": [None, 4, 8],
    "d_v": [None, 4],
    "d_ff": [None, 12],
    "ffn_mult": [2.0, 4.0],
    "positional": ["learned", "sinusoidal", "concat", "rotary", "alibi", "none"],
    "norm": ["layernorm", "rmsnorm"],
    "norm_placement": ["pre", "post", "sandwich"],
    "norm_eps": [1e-5, 1e-6],
    "bias": [True, False],
    "attn_bias": [None, True, False],
    "ffn_bias": [None, True, False],
    "attn_out_bias": [None, True, False],
    "attn_window": [None, 3],
    "full_attn_every": [None, 2],
    "attn_logit_softcap": [None, 2.0],
    "final_logit_softcap": [None, 5.0],
    "attention": ["softmax", "hardmax"],
    "scale_logits": [True, False],
    "qk_norm": [False, True],
    "out_proj": [True, False],
    "tie_embeddings": [True, False],
    "final_norm": [True, False],
    "embed_scale": [False, True],
    "embed_norm": [False, True],
    "n_token_types": [0, 2],
    "pooler": [False, True],
    "pooling": ["cls", "mean"],
    "rope": [(10000.0, "none"), (500000.0, "none"), (10000.0, "linear"), (10000.0, "llama3")],
    "dropout": [0.0, 0.1],
    "pad_id": [0, 3],
    "fast": [False, True],
    "straight_through": [True, False],
}


@st.composite
def configs(draw, family: str, buildable: bool = False, min_changes: int = 0) -> ModelConfig:
    """A valid tiny ModelConfig: the family's natural shape with ``min_changes``-4 fields drawn
    from SPACE."""
    fields = dict(vocab_size=13, d_model=16, n_heads=draw(st.sampled_from([2, 4])), max_len=16)
    fields["n_layers"] = draw(st.sampled_from([1, 2]))
    fields.update(NATURAL[family])
    if family == "bert" and draw(st.booleans()):
        fields["kind"] = draw(st.sampled_from(["classifier", "masked_lm"]))
    elif family != "bert" and draw(st.booleans()):
        fields["kind"] = "decoder_classifier"
    changed = draw(
        st.lists(st.sampled_from(sorted(SPACE)), min_size=min_changes, max_size=4, unique=True)
    )
    for name in changed:
        value = draw(st.sampled_from(SPACE[name]))
        if name == "ffn_activation":
            fields["ffn"], fields["activation"] = value
        elif name == "rope":
            fields["rope_base"], fields["rope_scaling"] = value
            if value[1] != "none":
                fields.update(rope_factor=2.0, rope_original_max_len=8)
        elif not (buildable and name == "fast"):
            fields[name] = value
    if fields["kind"] in ("classifier", "decoder_classifier"):
        fields["n_classes"] = 3
    if fields["kind"] not in ("encoder", "classifier", "masked_lm"):
        fields["pooler"] = False
    try:
        return ModelConfig(**fields)
    except ValueError:
        assume(False)  # an invalid combination (e.g. a window on an encoder)
        raise


FAMILIES = sorted(REGISTRY)
CONFIG_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("name", FAMILIES)
@given(data=st.data())
@CONFIG_SETTINGS
def test_export_is_allowed_exactly_when_the_config_survives_the_round_trip(name, data):
    family = REGISTRY[name]
    cfg = data.draw(configs(name))
    lost = family.lost_fields(cfg)
    if not lost:
        check_exportable(family, cfg)  # no error
        back = family.read(family.write(cfg))
        widened = {**canonical(cfg), **family.widens}
        assert canonical(back) == widened
        assert family.write(back) == family.write(cfg)  # and the file side is a fixed point
        return
    with pytest.raises(ConfigError) as err:
        check_exportable(family, cfg)
    message = str(err.value)
    if "kind" in lost:
        assert f"kind={cfg.kind!r} ({family.name} needs" in message
        return
    want = family.round_trip(cfg)[0]  # cfg in canonical form: derived sizes and biases explicit
    for field in lost:  # every lost field is named, with what the family would make of it
        assert f"{field}={want[field]!r} ({family.name} needs {lost[field]!r})" in message
    # The list is complete: setting exactly the named fields as the family needs makes it fit.
    try:
        fixed = ModelConfig(**{**canonical(cfg), **lost})
    except ValueError:
        return  # the family's values for these fields need another change elsewhere
    assert not family.lost_fields(fixed), (lost, family.lost_fields(fixed))


def _randomise(model: torch.nn.Module) -> None:
    """Non-trivial norms and biases so the mapping of each tensor is exercised."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))


def _outputs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    return out.logits if getattr(out, "logits", None) is not None else out.hidden


def _exportable_model(name: str, data) -> tuple:
    """(family, cfg, model): a config drawn for family ``name`` that it holds exactly, and its
    model with random weights (eval mode)."""
    family = REGISTRY[name]
    cfg = data.draw(configs(name, buildable=True))
    assume(not family.lost_fields(cfg))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    _randomise(model)
    return family, cfg, model


@pytest.mark.parametrize("name", FAMILIES)
@given(data=st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_an_exportable_model_keeps_its_function_through_the_tensor_table(name, data):
    family, cfg, model = _exportable_model(name, data)
    tensors = export_mapped(model, family.table(cfg), family.name)  # covers every tensor
    back_cfg = family.read(family.write(cfg))
    back = load_mapped(build_model(back_cfg), tensors, family.table(back_cfg), family.name)
    ids = torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_outputs(back, ids), _outputs(model, ids), rtol=1e-6, atol=1e-6)


HF_CLASSES = {
    "GPT2LMHeadModel": "logits",
    "LlamaForCausalLM": "logits",
    "MistralForCausalLM": "logits",
    "Qwen2ForCausalLM": "logits",
    "Qwen3ForCausalLM": "logits",
    "Gemma3ForCausalLM": "logits",
    "Gemma2ForCausalLM": "logits",
    "GemmaForCausalLM": "logits",
    "GPT2ForSequenceClassification": "logits",
    "LlamaForSequenceClassification": "logits",
    "MistralForSequenceClassification": "logits",
    "Qwen2ForSequenceClassification": "logits",
    "Qwen3ForSequenceClassification": "logits",
    "Gemma3TextForSequenceClassification": "logits",
    "GemmaForSequenceClassification": "logits",
    "BertModel": "last_hidden_state",
    "BertForSequenceClassification": "logits",
    "BertForMaskedLM": "logits",
    "BertForPreTraining": "prediction_logits",
}


@pytest.mark.parametrize("name", FAMILIES)
@given(data=st.data())
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_exportable_models_load_in_transformers_with_equal_outputs(name, data, tmp_path_factory):
    family, cfg, model = _exportable_model(name, data)
    out = save_pretrained(model, tmp_path_factory.mktemp("export") / "hf")
    arch = family.write(cfg)["architectures"][0]
    hf = getattr(transformers, arch).from_pretrained(out).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2))
    ids[ids == cfg.pad_id] = (cfg.pad_id + 1) % cfg.vocab_size  # a decoder classifier in HF
    # reads the rightmost token that is not pad_token_id: no padding here, so no pad ids
    with torch.no_grad():
        want = getattr(hf(ids), HF_CLASSES[arch])
    torch.testing.assert_close(_outputs(model, ids), want, rtol=1e-5, atol=1e-5)
    back = load_pretrained(out).model
    torch.testing.assert_close(_outputs(back, ids), _outputs(model, ids), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", FAMILIES)
@given(data=st.data())
@settings(  # the filter check too: every run still reaches its 30 valid examples (a quarter to
    # a half of the draws are invalid combinations or configs the family holds; flaky, 27 Nov)
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_a_refused_export_writes_nothing(name, data, tmp_path_factory):
    family = REGISTRY[name]
    # two or more changed fields: the family's natural shape (no change) always exports, and
    # drawing it again and again made Hypothesis' filter health check fail for gemma2
    cfg = data.draw(configs(name, buildable=True, min_changes=2))
    assume(family.lost_fields(cfg))
    try:
        model = build_model(cfg)
    except ValueError:  # a config the model builder refuses (e.g. no W^O with H*Dv != D)
        assume(False)
        raise
    out = tmp_path_factory.mktemp("export") / "hf"
    with pytest.raises(ConfigError, match="nothing was written"):
        check_exportable(family, cfg)
    writers = [lambda: export_as(model, "hf-gpt2", out)] if name == "gpt2" else []
    if not any(not f.lost_fields(cfg) for f in REGISTRY.values()):  # no family holds it
        writers.append(lambda: save_pretrained(model, out))
    for write in writers:
        with pytest.raises(ConfigError):
            write()
    assert not out.exists()


# The five failures of issue 32, kept -------------------------------------------------------

GPT2_SHAPED = dict(vocab_size=50, d_model=32, n_heads=4, n_layers=2, max_len=16)
LLAMA_SHAPED = dict(
    GPT2_SHAPED, positional="rotary", norm="rmsnorm", ffn="swiglu", activation="silu", bias=False
)


def _refused(model, out, *needles: str) -> None:
    for write in (
        lambda: save_gpt2_dir(model, out),
        lambda: export_as(model, "hf-gpt2", out),
        lambda: save_pretrained(model, out),
    ):
        with pytest.raises(ConfigError) as err:
            write()
        message = " ".join(str(err.value).split())
        assert "nothing was written" in message
        for needle in needles:
            assert needle in message
    assert not out.exists()


def test_gpt2_refuses_grouped_kv_heads_and_points_at_llama(tmp_path):
    model = build_model(ModelConfig(**GPT2_SHAPED, n_kv_heads=2))  # c_attn was (32, 64)
    _refused(model, tmp_path / "out", "n_kv_heads=2", "GPT-2 has no grouped KV heads", "llama")


def test_gpt2_refuses_a_gated_feed_forward_instead_of_dropping_the_gate(tmp_path):
    model = build_model(ModelConfig(**GPT2_SHAPED, ffn="geglu", activation="gelu_tanh"))
    _refused(model, tmp_path / "out", "ffn='geglu'", "GPT-2 has no gated feed-forward layers")


@pytest.mark.parametrize(
    ("field", "value", "noun"),
    [
        ("attn_window", 4, "sliding-window attention"),
        ("embed_norm", True, "norm on the embeddings"),
        ("n_token_types", 2, "token-type (segment) embeddings"),
    ],
)
def test_gpt2_refuses_windows_embedding_norms_and_token_types(tmp_path, field, value, noun):
    model = build_model(ModelConfig(**GPT2_SHAPED, **{field: value}))
    _refused(model, tmp_path / "out", f"{field}={value!r}", f"GPT-2 has no {noun}")


def test_llama_refuses_embedding_norms_and_token_types_and_keeps_windows(tmp_path):
    for extra in (
        dict(embed_norm=True),
        dict(n_token_types=2),
        dict(embed_norm=True, n_token_types=2),
    ):
        model = build_model(ModelConfig(**LLAMA_SHAPED, **extra))
        with pytest.raises(ConfigError) as err:
            save_pretrained(model, tmp_path / "out")
        for field, value in extra.items():
            assert f"{field}={value!r} (Llama needs" in str(err.value)
        assert not (tmp_path / "out").exists()
    windowed = build_model(ModelConfig(**LLAMA_SHAPED, attn_window=4))
    save_pretrained(windowed, tmp_path / "mistral")  # Mistral holds the window
    assert load_pretrained(tmp_path / "mistral").config.attn_window == 4


def test_the_refusal_names_every_field_and_the_family_that_holds_it():
    cfg = ModelConfig(**GPT2_SHAPED, n_kv_heads=2, attn_window=4, positional="sinusoidal")
    with pytest.raises(ConfigError) as err:
        check_exportable(REGISTRY["gpt2"], cfg)
    message = str(err.value)
    assert "n_kv_heads=2 (GPT-2 needs None): GPT-2 has no grouped KV heads" in message
    assert "attn_window=4 (GPT-2 needs None)" in message
    assert "positional='sinusoidal' (GPT-2 needs 'learned')" in message
    assert "llama, qwen2, qwen3, gemma3, gemma2, gemma can hold it" in message
    assert "no Hugging Face family" in message
    fits_llama = ModelConfig(**LLAMA_SHAPED, n_kv_heads=2)
    with pytest.raises(ConfigError, match=r"n_kv_heads=2 .*, export to llama instead"):
        check_exportable(REGISTRY["gpt2"], fits_llama)


# Tensor coverage, both ways -----------------------------------------------------------------


def test_a_table_that_misses_or_repeats_a_tensor_is_refused_both_ways():
    family = REGISTRY["llama"]
    cfg = ModelConfig(**LLAMA_SHAPED, n_kv_heads=2)
    model = build_model(cfg)
    table = family.table(cfg)
    gate = next(row for row in table if row.ours == "blocks.1.ffn.gate.weight")
    short = [row for row in table if row is not gate]
    with pytest.raises(CheckpointError, match=r"unmapped \['blocks\.1\.ffn\.gate\.weight'\]"):
        export_mapped(model, short, "Llama")
    with pytest.raises(CheckpointError, match=r"mapped twice \['blocks\.1\.ffn\.gate\.weight'"):
        check_table(model, [*table, gate], "Llama")
    tensors = export_mapped(model, table, "Llama")
    with pytest.raises(CheckpointError, match=r"does not know: \['extra\.weight'\]"):
        load_mapped(build_model(cfg), {**tensors, "extra.weight": torch.zeros(1)}, table, "Llama")
    del tensors["model.layers.0.mlp.gate_proj.weight"]
    with pytest.raises(CheckpointError, match=r"missing 1 tensor.*layers\.0\.mlp\.gate_proj"):
        load_mapped(build_model(cfg), tensors, table, "Llama")


def test_bias_free_models_are_written_with_zero_biases_and_non_zero_ones_refused():
    family = REGISTRY["gpt2"]
    cfg = ModelConfig(**GPT2_SHAPED, bias=False, activation="gelu_tanh")
    tensors = export_mapped(build_model(cfg), family.table(cfg), "GPT-2")
    assert not tensors["transformer.h.0.attn.c_attn.bias"].any()
    assert tensors["transformer.h.0.attn.c_attn.weight"].shape == (32, 96)  # Conv1D (in, out)
    tensors["transformer.h.0.ln_1.bias"] = torch.ones(32)
    with pytest.raises(CheckpointError, match=r"ln_1\.bias is non-zero.*bias=False"):
        load_mapped(build_model(cfg), tensors, family.table(cfg), "GPT-2")
