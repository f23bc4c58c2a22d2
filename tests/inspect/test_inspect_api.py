"""attnlab.inspect's framework: name discovery and selection, the cache, clear errors for bad
requests, hooks removed after errors, gradients through cached and replaced activations."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import inspect
from attnlab.errors import UserError
from attnlab.nn.hooks import HookPoint
from lstm_models import _model as _recurrent_seq2seq


def _seq2seq():
    return _recurrent_seq2seq(n_layers=1)


def _inputs():
    return torch.randint(1, 9, (2, 5)), torch.randint(1, 7, (2, 4))


class Toy(nn.Module):
    """y = W2 relu(W1 x): two named points, a plain module built outside attnlab."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(3, 4), nn.Linear(4, 2)
        self.hook_hidden = HookPoint()
        self.inner = nn.Module()
        self.inner.hook_out = HookPoint()

    def forward(self, x):
        return self.inner.hook_out(self.down(self.hook_hidden(torch.relu(self.up(x)))))


def _no_hooks_left(model: nn.Module) -> bool:
    return (
        all(
            not (p._forward_hooks or p._forward_pre_hooks)
            for p in inspect.hook_points(model).values()
        )
        and not model._forward_hooks
        and "decode" not in model.__dict__
    )


def test_names_come_from_hook_points_and_selections_resolve():
    toy = Toy()
    assert inspect.activation_names(toy) == ["hidden", "inner.out"]
    assert inspect.activation_names(toy, "inner.*") == ["inner.out"]
    assert inspect.activation_names(toy, lambda n: n.startswith("h")) == ["hidden"]
    y, cache = inspect.run_with_cache(toy, torch.randn(5, 3))
    assert torch.equal(cache["inner.out"], y) and cache["hidden"].shape == (5, 4)
    assert set(cache.select("*")) == {"hidden", "inner.out"}
    assert "ActivationCache(hidden: (5, 4)" in repr(cache)
    assert cache.to("cpu")["hidden"].shape == (5, 4)


def test_unknown_names_list_the_valid_ones():
    model = _seq2seq()
    src, tgt = _inputs()
    with pytest.raises(
        inspect.InspectError, match=r"unknown activation name 'blocks\.0\.A'.*alpha"
    ):
        inspect.run_with_cache(model, src, tgt, names=["alpha", "blocks.0.A"])
    with (
        pytest.raises(inspect.InspectError, match="h_enc, v, f, keys, e, alpha, v_l, h_dec"),
        inspect.intervene(model, {"nope": lambda v: v}),
    ):
        pass
    _, cache = inspect.run_with_cache(model, src, tgt, names="alpha")
    with pytest.raises(inspect.InspectError, match="this cache holds 1 names: alpha"):
        cache["e"]
    assert isinstance(inspect.InspectError("x"), (UserError, ValueError))
    with pytest.raises(inspect.InspectError, match="no hook points"):
        inspect.activation_names(nn.Linear(2, 2))
    assert _no_hooks_left(model)


def test_bad_replacements_give_one_clear_error_and_leave_no_hook():
    model = _seq2seq()
    src, tgt = _inputs()
    before = model(src, tgt).logits
    cases = [
        ({"alpha": torch.zeros(2, 3)}, r"shape \(2, 3\) but the activation has \(2, 5\)"),
        ({"alpha": torch.zeros(2, 5, dtype=torch.float64)}, r"dtype torch.float64.*\.to\("),
        ({"f": lambda f: f[:, :2]}, "the function's result"),
        ({"f": lambda f: 3}, "returned int"),
        ({"f": 3.0}, "must be a tensor or a function"),
    ]
    for changes, message in cases:
        with pytest.raises(inspect.InspectError, match=message), inspect.intervene(model, changes):
            model(src, tgt)
        assert _no_hooks_left(model)
    with (
        pytest.raises(inspect.InspectError, match="holds 2 steps"),
        inspect.intervene(model, {"alpha": torch.full((2, 2, 5), 0.2)}),
    ):
        model(src, tgt)  # 4 decoder steps but only 2 given
    assert _no_hooks_left(model) and torch.equal(model(src, tgt).logits, before)
    with (
        pytest.raises(inspect.InspectError, match="ActivationCache"),
        inspect.patch(model, {"alpha": torch.zeros(2, 5)}),
    ):
        pass


def test_hooks_are_removed_when_the_block_raises():
    model = _seq2seq()
    src, tgt = _inputs()
    before = model(src, tgt).logits
    with (
        pytest.raises(RuntimeError, match="user code failed"),
        inspect.intervene(model, {"alpha": lambda a: a * 0}),
        inspect.capture(model) as c,
    ):
        model(src, tgt)
        raise RuntimeError("user code failed")
    assert _no_hooks_left(model) and len(c) == len(inspect.activation_names(model))
    assert torch.equal(model(src, tgt).logits, before)


def test_interventions_compose_and_nest():
    model = _seq2seq()
    src, tgt = _inputs()
    with inspect.compose(
        inspect.intervene(model, {"f": lambda f: f * 2}),
        inspect.intervene(model, {"f": lambda f: f + 1}),
    ):
        _, both = inspect.run_with_cache(model, src, tgt, names="f")
    _, clean = inspect.run_with_cache(model, src, tgt, names="f")
    torch.testing.assert_close(both["f"], clean["f"] * 2 + 1)  # outer first, then inner
    assert _no_hooks_left(model)


def test_gradients_reach_cached_and_replaced_activations():
    model = _seq2seq()
    src, tgt = _inputs()
    out, cache = inspect.run_with_cache(model, src, tgt, detach=False)
    (grad_alpha,) = torch.autograd.grad(out.logits.sum(), cache["f"])
    assert grad_alpha.shape == cache["f"].shape and grad_alpha.abs().sum() > 0
    _, detached = inspect.run_with_cache(model, src, tgt)
    assert not detached["f"].requires_grad
    f = cache["f"].detach().clone().requires_grad_(True)
    with inspect.intervene(model, {"f": f}):
        loss = model(src, tgt).logits.square().mean()
    loss.backward()
    assert f.grad is not None and f.grad.abs().sum() > 0
    with torch.no_grad(), inspect.intervene(model, {"f": f}):
        out, cache = inspect.run_with_cache(model, src, tgt)
    assert not out.logits.requires_grad and torch.equal(cache["f"], f.detach())


def test_bench_suite_inspect_runs_in_tiny_mode():
    from attnlab.bench.runner import BenchSettings, run_bench
    from attnlab.bench.tables import suite_tables

    result = run_bench(BenchSettings.for_mode(tiny=True, suites=("inspect",), threads=1))
    suite = result["suites"]["inspect"]
    assert suite["status"] == "ok", suite
    for shape in suite["shapes"]:
        names = [c["name"] for c in shape["contenders"]]
        assert names == ["no_hook_points", "plain", "explicit_path", "cache_all"]
        assert all(c["tokens_per_s"] > 0 for c in shape["contenders"])
        assert shape["points_per_forward"] > 0 and 0 < shape["idle_points_fraction"] < 1
    assert "| small |" in "\n".join(suite_tables(result))
