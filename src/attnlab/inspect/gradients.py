"""Gradients of a metric with respect to named activations, and attribution patching.

    out, cache = run_with_cache(model, ids, grads=True)                   # metric: the LM loss
    cache.grads["blocks.0.self_attn.A"]                                   # dM/dA, (B, H, T, S)
    est = attribution_patching(model, ids, source=corrupt_cache, names="*.heads", keep=(1,))
    est.effects["blocks.1.self_attn.heads"]                              # (H,) one number per head

**Gradient cache.** Each selected activation a is replaced by a + z with z = 0 a leaf that
requires a gradient, so the forward pass computes the same values and dM/dz is the *total*
derivative dM/da (through every later layer, whatever the parameters' ``requires_grad``); it is
``torch.autograd.grad`` of the metric, the model's parameters get no ``.grad``. An activation
the metric does not depend on (a later position under a causal mask) gets a zero gradient.

**Attribution patching** (Nanda 2023; Syed et al. 2023) approximates activation patching to first
order: patching activation a of the base run with the source run's a' changes the metric by

    M(a <- a') - M(a)  ~=  sum_i (a'_i - a_i) * dM/da_i          (the gradient at the base run)

for every name at once from one forward and one backward pass, instead of one forward pass per
patch (:func:`attnlab.inspect.patch`). It is exact for a metric linear in a and good while the
patch is small; tests check that the estimate and real patching agree to second order as the
patch shrinks. ``keep`` names the dimensions not summed over, e.g. ``keep=(1,)`` on a ``heads``
activation (B, H, T, Dv) gives one estimate per head.

Points inside a recurrence (the LSTM decoder's e, alpha, v_l: one value per step) have no gradient
cache here; select other names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnlab.inspect.attribution import make_metric
from attnlab.inspect.cache import ActivationCache
from attnlab.inspect.names import InspectError, Selection, hook_points, is_read_only, select


class GradientRun(NamedTuple):
    """One forward and backward pass: the output, the metric, activations and their gradients."""

    output: object
    metric: Tensor  # the scalar M of the run
    cache: ActivationCache  # activations a (detached)
    grads: ActivationCache  # dM/da, same names and shapes


def run_with_grads(
    model: nn.Module,
    *args,
    names: Selection = None,
    metric="loss",
    targets: Tensor | None = None,
    token: int | None = None,
    position: int = -1,
    **kwargs,
) -> GradientRun:
    """``model(*args, **kwargs)`` with the activations and dM/da of the selected names (module
    docstring); ``metric`` as in :func:`attnlab.inspect.make_metric` ("loss", "logprob" with
    ``token`` at ``position``, or a function output -> scalar)."""
    measure = make_metric(
        model, args, kwargs, metric, targets=targets, token=token, position=position
    )
    points = hook_points(model)
    chosen = [n for n in select(points, names) if not is_read_only(n)]
    recurrent = [n for n in chosen if getattr(points[n], "step_axis", None) is not None]
    if recurrent and names is not None:
        raise InspectError(
            f"{recurrent[0]!r} fires once per recurrent step, which the gradient cache does not "
            "follow; select the other names (e.g. the encoder's or the final outputs)"
        )
    chosen = [n for n in chosen if n not in recurrent]
    cache, zeros = ActivationCache(), {}

    def make_hook(name: str):
        def hook(module, hook_args, value):
            if name in zeros:
                raise InspectError(
                    f"{name!r} fired twice in one forward call; the gradient cache needs one "
                    "forward call of the whole sequence (not generation step by step)"
                )
            if not value.is_floating_point():
                return None
            z = torch.zeros_like(value, requires_grad=True)
            zeros[name] = z
            cache._record(name, value.detach(), None)
            return value + z  # the same values; dM/dz = dM/d(value)

        return hook

    handles = [points[n].register_forward_hook(make_hook(n)) for n in chosen]
    try:
        with torch.enable_grad():
            output = model(*args, **kwargs)
            value = measure(output)
            if value.dim() != 0:
                raise InspectError(
                    f"the metric must be a scalar to differentiate, got shape {tuple(value.shape)}"
                    "; reduce it (e.g. .mean()) in the metric function"
                )
            found = list(zeros)
            grads = torch.autograd.grad(value, [zeros[n] for n in found], allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    grad_cache = ActivationCache()
    for name, g in zip(found, grads, strict=True):
        grad_cache._record(name, torch.zeros_like(zeros[name]) if g is None else g, None)
    return GradientRun(output, value.detach(), cache, grad_cache)


class PatchingEstimate(NamedTuple):
    """metric: M of the base run (scalar); effects: {name: the estimated change of M when that
    activation is patched from the source, summed over every dimension not in ``keep``}."""

    metric: Tensor
    effects: dict[str, Tensor]


def attribution_patching(
    model: nn.Module,
    *args,
    source: ActivationCache,
    names: Selection = None,
    keep: Sequence[int] = (),
    metric="loss",
    targets: Tensor | None = None,
    token: int | None = None,
    position: int = -1,
    **kwargs,
) -> PatchingEstimate:
    """First-order estimate of patching each selected activation of the run ``model(*args)``
    with its value in ``source`` (a cache of another input of the same shape): sum over the
    dimensions not in ``keep`` of (source - base) * dM/d(base) (module docstring)."""
    if not isinstance(source, ActivationCache):
        raise InspectError(
            f"source must be an ActivationCache from run_with_cache, got {type(source).__name__}"
        )
    points = hook_points(model)
    chosen = [n for n in select(points, names) if n in source and not is_read_only(n)]
    if not chosen:
        raise InspectError(
            "none of the selected activations is in the source cache; run run_with_cache on the "
            "source input with names that include them"
        )
    run = run_with_grads(
        model,
        *args,
        names=chosen,
        metric=metric,
        targets=targets,
        token=token,
        position=position,
        **kwargs,
    )
    effects = {}
    for name in run.grads:
        base, patched, grad = run.cache[name], source[name], run.grads[name]
        if patched.shape != base.shape:
            raise InspectError(
                f"the source's {name!r} has shape {tuple(patched.shape)} but this run's has "
                f"{tuple(base.shape)}; cache the source on an input of the same shape"
            )
        product = (patched.to(base.device, base.dtype) - base) * grad
        summed = [d for d in range(product.dim()) if d not in {k % product.dim() for k in keep}]
        effects[name] = product.sum(dim=summed) if summed else product
    return PatchingEstimate(run.metric, effects)
