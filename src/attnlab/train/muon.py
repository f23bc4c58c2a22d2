"""Muon (Jordan et al. 2024) with its Newton-Schulz iteration in a dtype this hardware runs fast.

For a 2-D hidden weight W with gradient G, momentum mu and learning rate lr, one step is

    B <- mu B + (1 - mu) G                          momentum buffer            (m, n)
    U  = mu B + (1 - mu) G   (Nesterov)  or  B                                  (m, n)
    O  = NS_k(U)             ~ the orthogonal factor of U (singular values pushed to ~1)
    W <- (1 - lr wd) W - lr * sqrt(max(1, m / n)) O

and NS_k runs k steps of the quintic iteration X <- a X + (b A + c A^2) X with A = X X^T,
starting from X = U / ||U||_F (so every singular value is <= 1), on the wide orientation
(m <= n, transposing a tall U) so A is the smaller Gram matrix.

This is ``torch.optim.Muon``'s update (a subclass, so it is one for ``isinstance`` and
checkpoints), except for one thing: PyTorch always iterates in bfloat16, the GPU choice. A CPU
without native bf16 matrix products (AVX2, AVX-512 without BF16) emulates them; on a 2-core
AVX2 host a (128, 512) bf16 product pair took 14 ms against 0.32 ms in fp32, which made a
``fast-char`` training step 15x slower than AdamW's. ``ns_dtype=None`` picks bfloat16 on CUDA and
on CPUs with native bf16 (oneDNN AVX-512 BF16 / AMX), float32 elsewhere.

The step is also arranged for a GPU, where a small model's update is bound by kernel launches,
not arithmetic: the momentum, decay and update run as ``torch._foreach_*`` over all matrices, and
matrices of one shape (a layer stack's W^Q K V, W^O, W_1, W_2) are orthogonalised together as one
(B, m, n) batch of products. No value is read back to the host, so the step never waits for the
GPU. The arithmetic per matrix is unchanged.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from attnlab.runtime import cpu_has_native_bf16

# The quintic's coefficients: chosen to maximise the slope at zero (Jordan et al. 2024), so a few
# steps map every singular value into roughly [0.7, 1.2] rather than converging exactly to 1.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7


@functools.cache
def fast_ns_dtype(device_type: str) -> torch.dtype:
    """bfloat16 where matrix products run natively in it (CUDA, AVX-512 BF16 / AMX), else fp32."""
    if device_type == "cuda" or (device_type == "cpu" and cpu_has_native_bf16()):
        return torch.bfloat16
    return torch.float32


def newton_schulz(
    u: torch.Tensor,
    steps: int = NS_STEPS,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = NS_EPS,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """NS_k(U): an approximately orthogonal matrix with U's singular vectors. (m, n) -> (m, n).

    ``u`` may also be a stack of same-shape matrices, (B, m, n) -> (B, m, n): each is normalised
    by its own Frobenius norm and the iteration runs as batched products (one kernel per product
    for the whole stack instead of one per matrix: what makes Muon cheap on a GPU).
    """
    if u.ndim not in (2, 3):
        raise ValueError(
            f"Muon orthogonalises 2-D matrices (or a (B, m, n) stack); got shape {tuple(u.shape)}"
        )
    a, b, c = coefficients
    tall = u.size(-2) > u.size(-1)
    x = u.to(dtype).mT if tall else u.to(dtype)  # (..., r, s), r <= s
    mul_add: Callable[..., torch.Tensor]  # beta * input + alpha * (m1 @ m2), batched or not
    if x.ndim == 2:
        x = x / x.norm().clamp(min=eps)
        mul_add = torch.addmm
    else:
        x = x / torch.linalg.matrix_norm(x, keepdim=True).clamp(min=eps)
        mul_add = torch.baddbmm
    for _ in range(steps):
        gram = x @ x.mT  # A = X X^T                                             (..., r, r)
        poly = mul_add(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2         (..., r, r)
        x = mul_add(x, poly, x, beta=a)  # a X + (b A + c A^2) X                 (..., r, s)
    return x.mT if tall else x


def shape_scale(shape: torch.Size, adjust_lr_fn: str | None) -> float:
    """Muon's per-matrix learning-rate factor (``torch.optim.Muon``'s ``adjust_lr_fn``)."""
    m, n = shape[:2]
    if adjust_lr_fn in (None, "original"):
        return math.sqrt(max(1.0, m / n))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(m, n))
    raise ValueError(f"unknown adjust_lr_fn {adjust_lr_fn!r}; use 'original' or 'match_rms_adamw'")


class Muon(torch.optim.Muon):
    """``torch.optim.Muon`` whose Newton-Schulz iteration runs in ``ns_dtype`` (None: fastest).

    The parent checks the arguments (2-D parameters only, rates, coefficients) and owns the
    param-group and state layout, so checkpoints are interchangeable with PyTorch's Muon.
    """

    def __init__(
        self, params: Iterable[Any], *, ns_dtype: torch.dtype | None = None, **kwargs: Any
    ) -> None:
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            lr, mu, wd = float(group["lr"]), group["momentum"], group["weight_decay"]
            grads = [p.grad for p in params]
            bufs = [self._buffer(p) for p in params]
            torch._foreach_lerp_(bufs, grads, 1 - mu)  # B <- mu B + (1 - mu) G
            updates = torch._foreach_lerp(grads, bufs, mu) if group["nesterov"] else bufs
            if wd:
                torch._foreach_mul_(params, 1 - lr * wd)
            for same_shape in _same_shape_groups(params, updates):
                ps, us = zip(*same_shape)
                dtype = self.ns_dtype or fast_ns_dtype(ps[0].device.type)
                ortho = newton_schulz(  # (m, n) alone, (B, m, n) for a stack
                    us[0] if len(us) == 1 else torch.stack(us),
                    group["ns_steps"],
                    group["ns_coefficients"],
                    group["eps"],
                    dtype,
                )
                scale = -lr * shape_scale(ps[0].shape, group["adjust_lr_fn"])
                if len(us) == 1:
                    ps[0].add_(ortho, alpha=scale)
                else:
                    torch._foreach_add_(list(ps), list(ortho.unbind(0)), alpha=scale)
        return loss

    def _buffer(self, p: torch.Tensor) -> torch.Tensor:
        state = self.state[p]
        assert p.grad is not None  # step() passes only the parameters that have a gradient
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p.grad)
        return state["momentum_buffer"]


def _same_shape_groups(params, updates) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """(parameter, update) pairs grouped by shape, device and dtype, in first-seen order: each
    group's Newton-Schulz iterations run as one batched product chain."""
    groups: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for p, u in zip(params, updates):
        groups.setdefault((tuple(p.shape), p.device, p.dtype), []).append((p, u))
    return list(groups.values())
