"""The gradient cache and attribution patching, against independent references: central finite
differences of the metric through ``intervene`` (float64), and real activation patching through
``patch``, which the first-order estimate must match to second order as the patch shrinks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab import inspect
from attnlab.inspect import ActivationCache, InspectError
from attnlab.models import build_model
from tiny_configs import tiny_config

NAMES = ("blocks.0.self_attn.A", "blocks.1.self_attn.heads", "blocks.0.resid_mid", "blocks.1.x")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = tiny_config("decoder_lm", vocab_size=37, d_model=32, n_heads=4, n_layers=2, dropout=0.0)
    return build_model(cfg).double().eval()


@pytest.fixture(scope="module")
def ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 37, (2, 9), generator=g)


def lm_loss(ids):
    """The next-token loss in float64 (make_metric's "loss" computes in float32, too coarse for
    finite differences)."""

    def measure(output):
        return F.cross_entropy(output.logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

    return measure


def metric_of(model, ids, change=None, name=None):
    """The LM loss of the run, with ``name``'s activation changed by ``change`` (or not)."""
    measure = lm_loss(ids)
    with torch.no_grad():
        if change is None:
            return measure(model(ids))
        with inspect.intervene(model, {name: lambda v: v + change}):
            return measure(model(ids))


def test_the_gradient_cache_equals_finite_differences(model, ids):
    out, cache = inspect.run_with_cache(
        model, ids, names=list(NAMES), grads=True, metric=lm_loss(ids)
    )
    assert cache.metric == pytest.approx(float(metric_of(model, ids)), rel=1e-12)
    g = torch.Generator().manual_seed(2)
    eps = 1e-6
    for name in NAMES:
        grad = cache.grads[name]
        assert grad.shape == cache[name].shape
        direction = torch.randn(grad.shape, generator=g, dtype=grad.dtype)
        up = metric_of(model, ids, eps * direction, name)
        down = metric_of(model, ids, -eps * direction, name)
        numeric = (up - down) / (2 * eps)
        assert float((grad * direction).sum()) == pytest.approx(float(numeric), rel=1e-6), name


def test_the_forward_pass_is_unchanged_and_parameters_get_no_grad(model, ids):
    out, cache = inspect.run_with_cache(model, ids, grads=True)
    with torch.no_grad():
        plain_out, plain = inspect.run_with_cache(model, ids)
    assert torch.equal(out.logits.detach(), plain_out.logits)
    assert set(cache) == set(plain) - {n for n in plain if n.endswith(".mask")}
    for name in cache:
        assert torch.equal(cache[name], plain[name]), name
    assert all(p.grad is None for p in model.parameters())


def test_later_positions_get_zero_gradient_under_the_causal_mask(model, ids):
    _, cache = inspect.run_with_cache(
        model, ids, names="blocks.*.resid_post", grads=True, metric="logprob", token=3, position=4
    )
    grad = cache.grads["blocks.0.resid_post"]  # (B, T, D)
    assert grad[:, 5:].abs().max() == 0 and grad[:, :5].abs().max() > 0


def test_attribution_patching_matches_real_patching_to_second_order(model, ids):
    corrupt = ids.flip(1)
    names = ["blocks.0.self_attn.heads", "blocks.1.self_attn.heads", "blocks.0.resid_post"]
    _, base = inspect.run_with_cache(model, ids, names=names)
    _, other = inspect.run_with_cache(model, corrupt, names=names)
    clean = metric_of(model, ids)
    errors = []
    for eps in (1e-2, 1e-3):
        source = ActivationCache.from_dict({n: base[n] + eps * (other[n] - base[n]) for n in names})
        est = inspect.attribution_patching(
            model, ids, source=source, names=names, metric=lm_loss(ids)
        )
        assert est.metric == pytest.approx(float(clean), rel=1e-12)
        for name in names:
            with torch.no_grad(), inspect.patch(model, source, name):
                real = lm_loss(ids)(model(ids)) - clean
            errors.append(abs(float(est.effects[name] - real)))
            assert float(est.effects[name]) == pytest.approx(float(real), rel=0.05), name
    first, second = errors[: len(names)], errors[len(names) :]
    for a, b in zip(first, second):  # ten times smaller patch: about a hundred times less error
        assert b < a / 30


def test_per_head_estimates_add_up_and_match_patching_one_head(model, ids):
    name = "blocks.1.self_attn.heads"  # (B, H, T, Dv)
    _, base = inspect.run_with_cache(model, ids, names=name)
    _, other = inspect.run_with_cache(model, ids.flip(1), names=name)
    eps = 1e-3
    patched = base[name] + eps * (other[name] - base[name])
    source = ActivationCache.from_dict({name: patched})
    per_head = inspect.attribution_patching(
        model, ids, source=source, names=name, keep=(1,), metric=lm_loss(ids)
    )
    total = inspect.attribution_patching(model, ids, source=source, names=name, metric=lm_loss(ids))
    assert per_head.effects[name].shape == (4,)
    assert float(per_head.effects[name].sum()) == pytest.approx(float(total.effects[name]))
    clean = metric_of(model, ids)
    for h in range(4):
        one = base[name].clone()
        one[:, h] = patched[:, h]
        with torch.no_grad(), inspect.intervene(model, {name: one}):
            real = lm_loss(ids)(model(ids)) - clean
        assert float(per_head.effects[name][h]) == pytest.approx(float(real), rel=0.05, abs=1e-9)


def test_bad_sources_are_one_clear_error(model, ids):
    _, short = inspect.run_with_cache(model, ids[:, :5], names="blocks.0.resid_post")
    with pytest.raises(InspectError, match="same shape"):
        inspect.attribution_patching(model, ids, source=short)
    with pytest.raises(InspectError, match="ActivationCache"):
        inspect.attribution_patching(model, ids, source={"x": ids})
    with pytest.raises(InspectError, match="none of the selected"):
        inspect.attribution_patching(model, ids, source=short, names="blocks.1.*")
