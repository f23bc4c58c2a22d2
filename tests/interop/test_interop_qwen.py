"""Qwen2 and Qwen3 parity with ``transformers`` on random-weight models built here (nothing is
downloaded): logits to 1e-5 in float32 with grouped-query attention, Qwen2's q/k/v biases (and
its unbiased W^O), Qwen3's query/key norms, tied heads and sliding windows on every layer; greedy
continuations identical to ``generate``; export round trips; mixed layer kinds refused."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.interop.llama import llama_config_to_model_config
from attnlab.interop.pretrained import from_hf_model
from hf_dirs import (
    SMALL_LLAMA,
    assert_export_round_trip,
    assert_logits_and_greedy_equal,
    hf_causal_lm,
)

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
TOL = {"rtol": 1e-5, "atol": 1e-5}
CASES = {
    "qwen2_gqa": ("Qwen2", dict(num_key_value_heads=2, rope_theta=1000000.0)),
    "qwen2_tied_window": ("Qwen2", dict(num_key_value_heads=1, tie_word_embeddings=True,
                                        use_sliding_window=True, sliding_window=5,
                                        max_window_layers=0)),
    "qwen3_gqa": ("Qwen3", dict(num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6)),
    "qwen3_bias_window": ("Qwen3", dict(num_key_value_heads=2, head_dim=8, attention_bias=True,
                                        use_sliding_window=True, sliding_window=5,
                                        layer_types=["sliding_attention"] * 2)),
}  # fmt: skip


def hf_qwen(case: str, seed: int = 0):
    family, extra = CASES[case]
    hf = hf_causal_lm(family, {**SMALL_LLAMA, **extra}, seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "_norm" in name:  # non-trivial biases and norm gains
                p.add_(torch.randn_like(p) * 0.2)
    return hf


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_continuations_equal_transformers(case):
    hf = hf_qwen(case)
    ours = from_hf_model(hf)
    cfg = ours.cfg
    assert cfg.kv_heads == hf.config.num_key_value_heads
    assert cfg.qk_norm == case.startswith("qwen3")
    if case.startswith("qwen2"):
        assert (cfg.attention_bias, cfg.attention_out_bias) == (True, False)
    if "window" in case:
        assert cfg.attn_window == 5
    ids = torch.randint(3, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    assert_logits_and_greedy_equal(hf, ours, ids, **TOL)


@pytest.mark.parametrize("case", ["qwen2_tied_window", "qwen3_bias_window"])
def test_export_round_trip_loads_in_transformers_with_equal_logits(case, tmp_path):
    hf = hf_qwen(case)
    ids = torch.randint(3, 97, (1, 15), generator=torch.Generator().manual_seed(4))
    assert_export_round_trip(hf, tmp_path / "out", ids, rtol=0, atol=0)


def test_mixed_sliding_and_full_layers_are_refused():
    data = transformers.Qwen2Config(
        **SMALL_LLAMA, use_sliding_window=True, sliding_window=4, max_window_layers=1
    ).to_dict()  # layer 0 full, layer 1 sliding
    with pytest.raises(ConfigError, match=r"mixed layer_types .*one kind only"):
        llama_config_to_model_config(data)
