"""Hook points in the Transformer modules (the contract of attnlab.nn.hooks): every name exists
where the contract puts it, holds the value it names, can be replaced, and an inactive point
leaves the forward untouched.

Shapes: B batch, H heads, T target length, S source length, D d_model, F d_ff.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.models import build_model
from attnlab.nn.hooks import HookPoint, hook_name
from attnlab.nn.multihead import SelfAttention

ATTN = ["Q", "K", "V", "scores", "scaled", "mask", "A", "heads", "concat", "out"]
BLOCK = ["x", "attn_norm", "resid_mid", "ffn_norm", "resid_post"]
EMBED = ["X", "P", "embed"]


def _names(model) -> set[str]:
    return {hook_name(n) for n, m in model.named_modules() if isinstance(m, HookPoint)}


def _cache(model, names):
    """Record every named point's value during one forward: {name: tensor}."""
    values, handles = {}, []
    for path, module in model.named_modules():
        if isinstance(module, HookPoint) and hook_name(path) in names:
            key = hook_name(path)
            handles.append(
                module.register_forward_hook(lambda m, a, o, k=key: values.update({k: o}))
            )
    return values, handles


def _lm(positional="learned", **kw):
    cfg = ModelConfig(
        vocab_size=30, d_model=16, n_heads=2, n_layers=2, max_len=16, positional=positional, **kw
    )
    torch.manual_seed(0)
    return build_model(cfg).double().eval()


def test_every_contract_name_exists_in_the_three_transformer_families():
    lm = _lm(positional="rotary")
    want = {f"blocks.{i}.{b}" for i in range(2) for b in BLOCK}
    want |= {f"blocks.{i}.self_attn.{a}" for i in range(2) for a in ATTN + ["Q_rot", "K_rot"]}
    want |= {f"blocks.{i}.ffn.hidden" for i in range(2)} | {f"embed.{e}" for e in EMBED}
    assert want | {"final"} <= _names(lm)
    cfg = ModelConfig(
        kind="encoder_decoder", vocab_size=30, d_model=16, n_heads=2, n_layers=1, max_len=16
    )
    s2s = _names(build_model(cfg))
    assert {f"blocks.0.cross_attn.{a}" for a in ATTN} | {"final", "encoder.stack.final"} <= s2s
    assert {"blocks.0.cross_norm", "blocks.0.resid_cross", "tgt_embed.P"} <= s2s
    assert {f"encoder.stack.blocks.0.self_attn.{a}" for a in ATTN} <= s2s


def test_hooked_values_are_the_ones_the_model_computes():
    lm = _lm()
    ids = torch.randint(0, 30, (2, 7))
    plain = lm(ids, need_weights=True)
    values, handles = _cache(lm, set(_names(lm)))
    hooked = lm(ids)  # inner points hooked: every layer takes the explicit form
    for h in handles:
        h.remove()
    torch.testing.assert_close(hooked.logits, plain.logits, rtol=1e-10, atol=1e-10)
    attn = lm.blocks[0].self_attn
    a = values["blocks.0.self_attn.A"]  # (B, H, T, T)
    torch.testing.assert_close(a, plain.attentions[0].self_attn)
    assert values["blocks.0.self_attn.Q"].shape == (2, 2, 7, attn.d_head)
    scores, scaled = values["blocks.0.self_attn.scores"], values["blocks.0.self_attn.scaled"]
    torch.testing.assert_close(scaled, scores / attn.d_head**0.5)
    mask = values["blocks.0.self_attn.mask"]
    assert mask.shape == (2, 1, 7, 7) and torch.equal(mask[0, 0], torch.ones(7, 7).tril().bool())
    torch.testing.assert_close(
        values["blocks.0.self_attn.heads"], a @ values["blocks.0.self_attn.V"]
    )
    torch.testing.assert_close(values["blocks.0.resid_post"], values["blocks.1.x"])
    torch.testing.assert_close(values["embed.embed"], values["blocks.0.x"])
    torch.testing.assert_close(values["embed.embed"], values["embed.X"] + values["embed.P"])
    torch.testing.assert_close(lm.lm_head(values["final"]), plain.logits)


def test_replacing_a_value_changes_the_output_and_the_mask_is_read_only():
    attn = SelfAttention(8, 2).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    plain = attn(x, causal=True).out
    handle = attn.hook_A.register_forward_hook(lambda m, a, o: torch.zeros_like(o))
    assert torch.allclose(attn(x, causal=True).out, attn.out_proj.bias.expand(2, 5, 8))
    handle.remove()
    handle = attn.hook_mask.register_forward_hook(lambda m, a, o: torch.zeros_like(o))
    torch.testing.assert_close(attn(x, causal=True).out, plain)  # read-only
    handle.remove()


@pytest.mark.parametrize("point", ["hook_Q", "hook_concat", "hook_out"])
def test_outer_points_keep_the_fused_form(point, monkeypatch):
    """Q/K/V/concat/out exist on every path: hooking them does not switch to the explicit form."""
    import attnlab.nn.attention as attention

    attn = SelfAttention(8, 2).eval()
    calls = []
    real = attention.fused_attention
    monkeypatch.setattr(
        attention, "fused_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    seen = []
    getattr(attn, point).register_forward_hook(lambda m, a, o: seen.append(o.shape))
    attn(torch.randn(2, 5, 8), causal=True)
    assert calls and seen
