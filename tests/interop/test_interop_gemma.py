"""Gemma 3 parity with ``transformers`` on random-weight models built here (nothing is
downloaded): logits to 1e-5 in float32 through the sandwich norms, (1 + w) RMSNorm gains,
sqrt(D)-scaled embeddings, GeGLU, query/key norms and grouped-query attention, with full or
sliding-window layers; greedy continuations identical to ``generate``; export round trips; the
settings attnlab does not hold (mixed layer kinds, soft-capping) refused together."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.interop.gemma import gemma_config_to_model_config
from attnlab.interop.pretrained import from_hf_model
from hf_dirs import SMALL_LLAMA, assert_export_round_trip, assert_logits_and_greedy_equal, gemma_lm

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
TOL = {"rtol": 1e-5, "atol": 1e-5}
BASE = dict(SMALL_LLAMA, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16)
CASES = {
    "full": dict(layer_types=["full_attention"] * 2),
    "sliding_untied": dict(layer_types=["sliding_attention"] * 2, sliding_window=5,
                           tie_word_embeddings=False, num_key_value_heads=1),
}  # fmt: skip


def hf_gemma(case: str, seed: int = 0):
    return gemma_lm(3, {**BASE, **CASES[case]}, seed)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_continuations_equal_transformers(case):
    hf = hf_gemma(case)
    ours = from_hf_model(hf)
    block = (ours.cfg.norm_placement, ours.cfg.ffn, ours.cfg.embed_scale, ours.cfg.qk_norm)
    assert block == ("sandwich", "geglu", True, True)
    assert ours.cfg.attn_window == (5 if case == "sliding_untied" else None)
    ids = torch.randint(3, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    assert_logits_and_greedy_equal(hf, ours, ids, **TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_export_round_trip_loads_in_transformers_with_equal_logits(case, tmp_path):
    hf = hf_gemma(case)
    assert hf.config.model_type == "gemma3_text"
    ids = torch.randint(3, 97, (1, 15), generator=torch.Generator().manual_seed(4))
    assert_export_round_trip(hf, tmp_path / "out", ids, **TOL)


def test_what_attnlab_does_not_hold_is_refused_together():
    data = transformers.Gemma3TextConfig(
        **{**BASE, "query_pre_attn_scalar": 64}, attn_logit_softcapping=50.0
    ).to_dict()  # the default layer_types mix sliding and full layers
    data["layer_types"] = ["sliding_attention", "full_attention"]
    with pytest.raises(ConfigError) as err:
        gemma_config_to_model_config(data)
    message = str(err.value)
    for part in ("mixed layer_types", "query_pre_attn_scalar=64", "attn_logit_softcapping=50"):
        assert part in message
