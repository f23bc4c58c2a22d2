"""attnlab's Muon: PyTorch's update, with the Newton-Schulz iteration in a fast dtype."""

from __future__ import annotations

import pytest
import torch

from attnlab.train import muon as muon_mod
from attnlab.train.muon import Muon, fast_ns_dtype, newton_schulz


def _params_and_grads(seed: int, steps: int):
    g = torch.Generator().manual_seed(seed)
    shapes = [(12, 20), (20, 12), (8, 8)]
    params = [torch.randn(s, generator=g) for s in shapes]
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(steps)]
    return params, grads


def _run(opt_cls, params, grads, **kw):
    ps = [p.clone().requires_grad_(True) for p in params]
    opt = opt_cls(ps, lr=0.05, weight_decay=0.1, **kw)
    for step_grads in grads:
        for p, gr in zip(ps, step_grads):
            p.grad = gr.clone()
        opt.step()
    return [p.detach() for p in ps], opt


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust", [None, "match_rms_adamw"])
def test_in_bf16_it_is_torch_muon_bit_for_bit(nesterov, adjust):
    params, grads = _params_and_grads(0, 3)
    kw = dict(nesterov=nesterov, adjust_lr_fn=adjust)
    ours, opt = _run(Muon, params, grads, ns_dtype=torch.bfloat16, **kw)
    ref, ref_opt = _run(torch.optim.Muon, params, grads, **kw)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)
    buf = [s["momentum_buffer"] for s in opt.state.values()]
    ref_buf = [s["momentum_buffer"] for s in ref_opt.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(buf, ref_buf))


def test_in_fp32_it_tracks_torch_muon_to_bf16_precision():
    params, grads = _params_and_grads(1, 3)
    ours, _ = _run(Muon, params, grads, ns_dtype=torch.float32)
    ref, _ = _run(torch.optim.Muon, params, grads)
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, atol=2e-2), (a - b).abs().max()
        assert not torch.equal(a, b)  # really a different (more precise) iteration


@pytest.mark.parametrize("shape", [(16, 48), (48, 16), (32, 32)])
def test_newton_schulz_orthogonalises_with_the_same_singular_vectors(shape):
    u = torch.randn(shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    o = newton_schulz(u, dtype=torch.float64)
    assert o.shape == u.shape
    s = torch.linalg.svdvals(o)
    assert s.min() > 0.6 and s.max() < 1.25  # the quintic's band, not exactly 1
    # O = U f(S) V^T with f odd and increasing: U's polar factor, up to the singular values
    uu, _, vh = torch.linalg.svd(u, full_matrices=False)
    core = uu.mT @ o @ vh.mT
    assert torch.allclose(core, torch.diag(torch.diagonal(core)), atol=1e-8)


def test_default_dtype_is_fp32_where_bf16_is_emulated(monkeypatch):
    fast_ns_dtype.cache_clear()
    monkeypatch.setattr(muon_mod, "cpu_has_native_bf16", lambda: False)
    assert fast_ns_dtype("cpu") == torch.float32
    fast_ns_dtype.cache_clear()
    monkeypatch.setattr(muon_mod, "cpu_has_native_bf16", lambda: True)
    assert fast_ns_dtype("cpu") == torch.bfloat16
    assert fast_ns_dtype("cuda") == torch.bfloat16
    fast_ns_dtype.cache_clear()


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="2-D"):
        newton_schulz(torch.zeros(3))
    with pytest.raises(ValueError, match="2D parameters"):  # PyTorch's own check, inherited
        Muon([torch.zeros(4, requires_grad=True)])


def test_a_stack_is_orthogonalised_as_each_matrix_alone():
    g = torch.Generator().manual_seed(3)
    for shape in [(4, 16, 48), (4, 48, 16)]:
        stack = torch.randn(shape, generator=g, dtype=torch.float64)
        together = newton_schulz(stack, dtype=torch.float64)
        alone = torch.stack([newton_schulz(m, dtype=torch.float64) for m in stack])
        assert together.shape == stack.shape
        assert torch.allclose(together, alone, atol=1e-12)


def test_same_shape_matrices_step_as_torch_muon():
    # Three matrices of one shape and one of another: the stack takes the batched path.
    g = torch.Generator().manual_seed(4)
    shapes = [(12, 20), (12, 20), (20, 12), (12, 20)]
    params = [torch.randn(s, generator=g) for s in shapes]
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(3)]
    ours, _ = _run(Muon, params, grads, ns_dtype=torch.float32)
    ref, _ = _run(torch.optim.Muon, params, grads)
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, atol=2e-2), (a - b).abs().max()
    ours64, _ = _run(Muon, [p.double() for p in params], [[x.double() for x in s] for s in grads],
                     ns_dtype=torch.float64)  # fmt: skip
    alone = []
    for i in range(len(shapes)):  # each matrix stepped in an optimizer of its own
        (p,), _ = _run(Muon, [params[i].double()], [[s[i].double()] for s in grads],
                       ns_dtype=torch.float64)  # fmt: skip
        alone.append(p)
    for a, b in zip(ours64, alone):
        assert torch.allclose(a, b, atol=1e-12)
