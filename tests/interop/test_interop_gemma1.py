"""Gemma 1 parity with ``transformers`` on random-weight models built here (nothing is
downloaded): logits to 1e-5 in float32 through the pre-norm block with (1 + w) RMSNorm gains,
sqrt(D)-scaled embeddings, GeGLU with the tanh GELU (the releases' legacy ``hidden_act="gelu"``
included), multi-query and grouped-query attention, biased attention, an untied head and another
rotary base; greedy continuations identical to ``generate``; export round trips (transformers
loads the export as ``GemmaForCausalLM`` with the same logits); the classifier
(``GemmaForSequenceClassification``) on a padded batch; the settings attnlab does not hold
refused together. (Loading by hub id is the same path for every family: test_interop_gemma2.py.)"""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.interop.gemma import gemma_config_to_model_config
from attnlab.interop.pretrained import from_hf_model, load_pretrained
from attnlab.models import DecoderClassifier
from hf_dirs import (
    SMALL_LLAMA,
    assert_export_round_trip,
    assert_logits_and_greedy_equal,
    gemma_lm,
    padded_batch,
    token_ids,
)

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
TOL = {"rtol": 1e-5, "atol": 1e-5}
BASE = dict(SMALL_LLAMA, head_dim=16, num_key_value_heads=4)  # 4 heads of 16 on a width of 32
CASES = {
    # the released 2B's shape: one key/value head, tied head, the legacy "gelu" name
    "mqa_tied_legacy_gelu": dict(num_key_value_heads=1, hidden_act="gelu"),
    # the 7B's: a key/value head per query head; here also biased, untied, another rotary base
    "mha_untied_bias_rope": dict(
        num_key_value_heads=4, tie_word_embeddings=False, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "gqa": dict(num_key_value_heads=2),
}  # fmt: skip


def hf_gemma1(case: str, seed: int = 0):
    return gemma_lm(1, {**BASE, **CASES[case]}, seed)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_continuations_equal_transformers(case):
    hf = hf_gemma1(case)
    assert hf.config.model_type == "gemma" and hf.config.hidden_act == "gelu_pytorch_tanh"
    ours = from_hf_model(hf)
    cfg = ours.cfg
    block = (cfg.norm_placement, cfg.ffn, cfg.activation, cfg.embed_scale, cfg.qk_norm)
    assert block == ("pre", "geglu", "gelu_tanh", True, False)
    assert (cfg.kv_heads, cfg.head_dim) == (hf.config.num_key_value_heads, 16)
    assert cfg.rope_base == hf.config.rope_parameters["rope_theta"]
    assert cfg.tie_embeddings == hf.config.tie_word_embeddings
    assert cfg.attention_bias == hf.config.attention_bias
    assert_logits_and_greedy_equal(hf, ours, token_ids(20, 1), **TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_export_round_trip_loads_in_transformers_with_equal_logits(case, tmp_path):
    again = assert_export_round_trip(
        hf_gemma1(case), tmp_path / "out", token_ids(15, 4, b=1), **TOL
    )
    assert type(again).__name__ == "GemmaForCausalLM"


def test_the_classifier_reads_a_padded_batch_as_transformers_does(tmp_path):
    config = transformers.GemmaConfig(**{**BASE, "num_key_value_heads": 1}, num_labels=3)
    torch.manual_seed(0)
    hf = transformers.GemmaForSequenceClassification(config).eval()
    ours = from_hf_model(hf)
    assert isinstance(ours, DecoderClassifier) and ours.cfg.n_classes == 3
    ids, mask = padded_batch(config.vocab_size, config.pad_token_id)
    with torch.no_grad():
        want = hf(ids, attention_mask=mask.long()).logits  # (3, 3)
        torch.testing.assert_close(ours(ids, key_padding_mask=mask).logits, want, **TOL)
    hf.save_pretrained(tmp_path / "hf")
    assert load_pretrained(tmp_path / "hf", tokenizer=False).config == ours.cfg


def test_what_attnlab_does_not_hold_is_refused_together():
    data = transformers.GemmaConfig(**BASE, use_bidirectional_attention=True).to_dict()
    data.update(hidden_act="relu", rope_parameters={"rope_type": "yarn", "factor": 2.0})
    data["hidden_activation"] = "gelu"  # transformers 4's key: it ran the exact GELU
    data["architectures"] = ["GemmaForSequenceClassification"]
    data["id2label"] = {"0": "only"}
    with pytest.raises(ConfigError) as err:
        gemma_config_to_model_config(data)
    message = " ".join(str(err.value).split())
    for part in ("Gemma 1", "hidden_act='relu'", "hidden_activation='gelu'",
                 "use_bidirectional_attention", "rope scaling 'yarn'", "num_labels=1"):  # fmt: skip
        assert part in message


def test_the_releases_legacy_gelu_reads_as_the_tanh_gelu_and_a_tanh_hidden_activation_too():
    """transformers 5 reads hidden_act="gelu" as the tanh GELU; transformers 4 ran
    hidden_activation when set (the exact GELU for "gelu", refused above)."""
    for extra in (dict(hidden_act="gelu"), dict(hidden_activation="gelu_pytorch_tanh")):
        data = {**transformers.GemmaConfig(**BASE).to_dict(), **extra}
        assert gemma_config_to_model_config(data).activation == "gelu_tanh"
