"""Gemma 2 parity with ``transformers`` on random-weight models built here (nothing is
downloaded): logits to 1e-5 in float32 through attention-logit and final-logit soft-capping,
sliding-window layers alternating with full ones (sequences longer than the window, so both kinds
matter), sandwich norms, (1 + w) RMSNorm gains, sqrt(D)-scaled embeddings, GeGLU and
grouped-query attention; greedy continuations identical to ``generate``; export round trips
(transformers loads the export with the same logits); loading by hub id from an offline cache;
the settings attnlab does not hold refused together."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.interop.family import REGISTRY, check_exportable
from attnlab.interop.gemma import gemma_config_to_model_config
from attnlab.interop.pretrained import from_hf_model, load_pretrained
from attnlab.models import build_model
from hf_dirs import (
    SMALL_LLAMA,
    assert_export_round_trip,
    assert_logits_and_greedy_equal,
    gemma_lm,
    token_ids,
)

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
TOL = {"rtol": 1e-5, "atol": 1e-5}
WINDOW = 5
BASE = dict(
    SMALL_LLAMA,
    num_hidden_layers=4,
    num_key_value_heads=2,
    head_dim=16,
    query_pre_attn_scalar=16,
    sliding_window=WINDOW,
)
CASES = {
    # transformers' default layer_types (sliding, full, sliding, full), caps that bend the logits
    "alternating_gqa_capped": dict(attn_logit_softcapping=2.0, final_logit_softcapping=4.0),
    # every third layer full, MQA, untied head, biased attention, no caps, another rotary base
    "every_third_untied_bias": dict(
        num_hidden_layers=3, num_key_value_heads=1, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        attention_bias=True, attn_logit_softcapping=None, final_logit_softcapping=None,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    # the released models' caps (50 and 30: transformers' defaults), all layers sliding
    "default_caps_all_sliding": dict(layer_types=["sliding_attention"] * 4),
}  # fmt: skip


def hf_gemma2(case: str, seed: int = 0):
    return gemma_lm(2, {**BASE, **CASES[case]}, seed)


GEMMA2_BLOCK = ("sandwich", "geglu", True, False)  # norm placement, ffn, embed scale, q/k norm


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_continuations_equal_transformers(case):
    hf = hf_gemma2(case)
    ours = from_hf_model(hf)
    cfg = ours.cfg
    assert (cfg.norm_placement, cfg.ffn, cfg.embed_scale, cfg.qk_norm) == GEMMA2_BLOCK
    assert cfg.attn_logit_softcap == hf.config.attn_logit_softcapping
    assert cfg.final_logit_softcap == hf.config.final_logit_softcapping
    assert cfg.rope_base == hf.config.rope_parameters["rope_theta"]
    windows = [cfg.layer_window(i) for i in range(cfg.n_layers)]
    assert windows == [WINDOW if t == "sliding_attention" else None for t in hf.config.layer_types]
    ids = token_ids(24, 1)  # longer than the window: sliding and full layers differ
    logits = assert_logits_and_greedy_equal(hf, ours, ids, **TOL)  # 22 tokens: past the window
    with torch.no_grad():
        if case == "alternating_gqa_capped":  # (caps of 50 and 30 barely bend these logits)
            uncapped = cfg.replace(attn_logit_softcap=None, final_logit_softcap=None)
            assert not torch.allclose(_same_weights(ours, uncapped)(ids).logits, logits, **TOL)
        no_windows = cfg.replace(attn_window=None, full_attn_every=None)
        assert not torch.allclose(_same_weights(ours, no_windows)(ids).logits, logits, **TOL)


def _same_weights(model, cfg):
    """A model of ``cfg`` with ``model``'s weights (the settings compared change no tensor)."""
    other = build_model(cfg).eval()
    other.load_state_dict(model.state_dict())
    return other


@pytest.mark.parametrize("case", list(CASES))
def test_export_round_trip_loads_in_transformers_with_equal_logits(case, tmp_path):
    hf = hf_gemma2(case)
    assert hf.config.model_type == "gemma2"
    again = assert_export_round_trip(hf, tmp_path / "out", token_ids(15, 4, b=1), **TOL)
    assert again.config.layer_types == hf.config.layer_types


def test_a_config_json_without_caps_or_layer_types_means_transformers_defaults():
    data = transformers.Gemma2Config(**BASE).to_dict()
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "layer_types"):
        del data[key]
    cfg = gemma_config_to_model_config(data)
    assert (cfg.attn_logit_softcap, cfg.final_logit_softcap) == (50.0, 30.0)
    assert (cfg.attn_window, cfg.full_attn_every) == (WINDOW, 2)  # even layers slide


def test_what_attnlab_does_not_hold_is_refused_together():
    data = transformers.Gemma2Config(
        **{**BASE, "query_pre_attn_scalar": 64}, use_bidirectional_attention=True
    ).to_dict()
    data["layer_types"] = ["full_attention", "sliding_attention"] * 2
    with pytest.raises(ConfigError) as err:
        gemma_config_to_model_config(data)
    message = str(err.value)
    for part in ("Gemma 2", "query_pre_attn_scalar=64", "use_bidirectional_attention",
                 "layer_types ['full_attention', 'sliding_attention'"):  # fmt: skip
        assert part in message


def test_other_families_refuse_soft_caps_and_mixed_layers_and_point_at_gemma2():
    cfg = from_hf_model(hf_gemma2("alternating_gqa_capped")).cfg
    with pytest.raises(ConfigError) as err:
        check_exportable(REGISTRY["gemma3"], cfg)
    message = str(err.value)
    for field, noun in (
        ("attn_logit_softcap=2.0", "attention logit soft-capping"),
        ("final_logit_softcap=4.0", "final logit soft-capping"),
        ("full_attn_every=2", "sliding-window layers mixed with full ones"),
    ):
        assert f"{field} (Gemma 3 needs None): Gemma 3 has no {noun}, export to gemma2" in message


def test_load_by_hub_id_from_an_offline_cache(tmp_path, monkeypatch):
    """The hub's cache layout (models--org--name/refs/main, snapshots/<commit>/) built here."""
    hf = hf_gemma2("alternating_gqa_capped")
    repo = tmp_path / "hub" / "models--tiny-org--tiny-gemma2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("c" * 40)
    hf.save_pretrained(repo / "snapshots" / ("c" * 40))
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    found = load_pretrained("tiny-org/tiny-gemma2")
    assert found.model_type == "gemma2" and found.config.full_attn_every == 2
    ids = token_ids(12, 7)
    with torch.no_grad():
        torch.testing.assert_close(found.model(ids).logits, hf(ids).logits, **TOL)
