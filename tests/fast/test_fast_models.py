"""The engine (attnlab.fast) against the plain forms: the same parameters give the same values
and gradients, hook points see the plain values on both, and ``attnlab.nn`` never imports it.

Shapes: B batch, S source length, T target length, N real target tokens, V vocabulary.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.fast import accelerate, is_fast
from attnlab.fast.packing import GROUP_ROWS
from attnlab.models import build_model
from attnlab.nn.hooks import HookPoint
from oracle_params import TOL64

NN = Path(__file__).resolve().parents[2] / "src" / "attnlab" / "nn"


def _right_padded(lengths: torch.Tensor) -> torch.Tensor:
    return torch.arange(int(lengths.max()))[None, :] < lengths[:, None]  # (B, T) True = real


def _batch(b: int, vocab: int, max_len: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (b,), generator=gen)
    ids = torch.randint(3, vocab, (b, int(lengths.max())), generator=gen)
    return ids, _right_padded(lengths)


def _pair(**cfg):
    """A plain model and its fast copy (the same weights), float64."""
    torch.manual_seed(0)
    plain = build_model(ModelConfig(**cfg)).double()
    return plain, accelerate(copy.deepcopy(plain))


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_nn_never_imports_the_engine():
    for path in NN.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.startswith("attnlab.fast") for n in names), path.name


def test_the_switch_builds_the_same_model_on_the_engine():
    cfg = ModelConfig(kind="encoder_decoder", vocab_size=30, d_model=16, n_heads=2, n_layers=1)
    torch.manual_seed(0)
    plain = build_model(cfg)
    torch.manual_seed(0)
    fast = build_model(cfg, fast=True)
    torch.manual_seed(0)
    assert is_fast(build_model(cfg.replace(fast=True))) and is_fast(fast) and not is_fast(plain)
    assert fast.state_dict().keys() == plain.state_dict().keys()
    for name, value in plain.state_dict().items():
        assert torch.equal(fast.state_dict()[name], value)
    assert not is_fast(build_model(cfg.replace(kind="lstm_seq2seq"), fast=True))  # no fast form


@pytest.mark.parametrize(
    "opts",
    [dict(), dict(positional="rotary", qk_norm=True), dict(norm_placement="post")],
    ids=["learned", "rotary+qk_norm", "post-norm"],
)
def test_encoder_decoder_equals_the_plain_form_in_value_and_gradient(opts):
    plain, fast = _pair(kind="encoder_decoder", vocab_size=40, d_model=16, n_heads=2,
                        n_layers=2, d_ff=32, max_len=24, **opts)  # fmt: skip
    src, src_mask = _batch(2 * GROUP_ROWS + 7, 40, 20, seed=1)
    tgt, tgt_mask = _batch(2 * GROUP_ROWS + 7, 40, 15, seed=2)
    results = []
    for model in (plain, fast):
        model.zero_grad()
        out = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask).logits  # (B, T, V)
        out[tgt_mask].sin().sum().backward()  # position-dependent: a mix-up of rows would show
        real_only = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask, real_only=True).logits
        results.append((out[tgt_mask].detach(), real_only.detach(), _grads(model)))
    (want, want_real, want_grads), (got, got_real, got_grads) = results
    torch.testing.assert_close(got, want, **TOL64)
    torch.testing.assert_close(got_real, want_real, **TOL64)  # the order of logits[tgt_mask]
    assert got_grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, **TOL64)


def test_models_with_value_heads_of_another_width_run_the_plain_form():
    plain, fast = _pair(
        kind="encoder_decoder", vocab_size=40, d_model=16, n_heads=2, n_layers=1, d_v=3, max_len=24
    )
    src, src_mask = _batch(2 * GROUP_ROWS, 40, 20, seed=6)
    tgt, tgt_mask = _batch(2 * GROUP_ROWS, 40, 15, seed=7)
    args = dict(src_mask=src_mask, tgt_mask=tgt_mask, real_only=True)
    torch.testing.assert_close(fast(src, tgt, **args).logits, plain(src, tgt, **args).logits)


def test_classifier_and_encoder_equal_the_plain_form():
    plain, fast = _pair(kind="classifier", vocab_size=40, d_model=16, n_heads=2, n_layers=2,
                        n_classes=3, max_len=24, pooling="mean")  # fmt: skip
    ids, mask = _batch(3 * GROUP_ROWS, 40, 20, seed=3)
    for model in (plain, fast):
        model.eval()
    want = plain(ids, key_padding_mask=mask).logits
    torch.testing.assert_close(fast(ids, key_padding_mask=mask).logits, want, **TOL64)
    hidden = fast.encoder(ids, key_padding_mask=mask).hidden  # (B, T, D)
    torch.testing.assert_close(hidden[mask], plain.encoder(ids, key_padding_mask=mask).hidden[mask])
    assert torch.equal(hidden[~mask], torch.zeros_like(hidden[~mask]))  # padding: zeros


def test_hook_points_see_the_plain_values_on_the_fast_model():
    plain, fast = _pair(kind="encoder_decoder", vocab_size=40, d_model=16, n_heads=2,
                        n_layers=1, d_ff=32, max_len=24)  # fmt: skip
    src, src_mask = _batch(2 * GROUP_ROWS, 40, 20, seed=4)
    tgt, tgt_mask = _batch(2 * GROUP_ROWS, 40, 15, seed=5)
    seen = []
    for model in (plain, fast):
        values = {}
        for name, module in model.named_modules():
            if isinstance(module, HookPoint) and name.endswith(("hook_A", "hook_resid_post")):
                module.register_forward_hook(lambda m, a, o, k=name, d=values: d.update({k: o}))
        model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)
        seen.append(values)
    assert seen[0].keys() == seen[1].keys() and len(seen[0]) == 5
    for name, value in seen[0].items():
        torch.testing.assert_close(seen[1][name], value, **TOL64)


@pytest.mark.parametrize("rotary", [False, True], ids=["no-rotary", "rotary"])
def test_fast_attention_modules_on_row_groups_equal_the_plain_modules(rotary):
    """FastSelfAttention and FastCrossAttention on packed row groups give, at the real tokens,
    what the plain modules give on the padded batch (value and input gradients, float64)."""
    from attnlab.fast.attention import FastCrossAttention, FastSelfAttention, packed
    from attnlab.fast.packing import length_groups, make_packing, pack, row_major
    from attnlab.nn.masks import padding_mask
    from attnlab.nn.multihead import CrossAttention, SelfAttention
    from attnlab.nn.positional import RotaryPositions

    torch.manual_seed(0)
    b, d = 2 * GROUP_ROWS + 5, 8
    tgt_mask = _right_padded(torch.randint(1, 10, (b,)))
    src_mask = _right_padded(torch.randint(1, 13, (b,)))
    groups = length_groups(tgt_mask, src_mask)
    packing, memory_packing = make_packing(tgt_mask, groups), make_packing(src_mask, groups)
    x = torch.randn(b, tgt_mask.size(1), d, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(b, src_mask.size(1), d, dtype=torch.float64, requires_grad=True)
    rope = RotaryPositions(4) if rotary else None
    self_attn = SelfAttention(8, 2, pos_enc=rope, qk_norm=True).double()
    cross = CrossAttention(8, 2).double()
    fast_self, fast_cross = copy.deepcopy(self_attn), copy.deepcopy(cross)
    fast_self.__class__, fast_cross.__class__ = FastSelfAttention, FastCrossAttention
    self_mask, cross_mask = padding_mask(tgt_mask), padding_mask(src_mask)
    results = []
    for fast in (False, True):
        if fast:
            with packed(packing, memory_packing):
                y = fast_self(pack(x, packing), self_mask, causal=True).out  # (N, D)
                z = fast_cross(y, pack(memory, memory_packing), cross_mask).out
            out = row_major(z, packing)  # (N, D) in x[mask] order
        else:
            y = self_attn(x, self_mask, causal=True).out
            out = cross(y, memory, cross_mask).out[tgt_mask]  # (N, D)
        gx, gm = torch.autograd.grad(out.sin().sum(), (x, memory))
        results.append((out.detach(), gx[tgt_mask], gm[src_mask]))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, **TOL64)


def test_soft_capped_attention_on_the_engine_is_the_plain_kernel(monkeypatch):
    """A capped encoder on packed row groups equals the plain one; a compiled one-token decode
    step with a cap takes the plain kernel (``one_query_attention``'s reductions do not cap)."""
    from attnlab.fast.attention import fast_attention
    from attnlab.nn import SelfAttention
    from attnlab.nn.attention import Softmax, scaled_dot_product_attention

    plain, fast = _pair(kind="classifier", vocab_size=40, d_model=16, n_heads=2, n_layers=2,
                        n_classes=3, max_len=24, attn_logit_softcap=0.5)  # fmt: skip
    ids, mask = _batch(3 * GROUP_ROWS, 40, 20, seed=8)
    for model in (plain, fast):
        model.eval()
    want = plain(ids, key_padding_mask=mask).logits
    torch.testing.assert_close(fast(ids, key_padding_mask=mask).logits, want, **TOL64)
    q, k, v = torch.randn(2, 4, 1, 8), 3 * torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    points = SelfAttention(32, 4)  # unhooked points, as a module passes its own
    opts = dict(activation=Softmax(), points=points)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    got = fast_attention(q, k, v, softcap=0.5, **opts).out
    torch.testing.assert_close(got, scaled_dot_product_attention(q, k, v, softcap=0.5, **opts).out)
    assert not torch.allclose(got, fast_attention(q, k, v, **opts).out, atol=1e-3)
