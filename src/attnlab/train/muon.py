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
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any

import torch

from attnlab.train.distributed import cpu_has_native_bf16

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
    """NS_k(U): an approximately orthogonal matrix with U's singular vectors. (m, n) -> (m, n)."""
    if u.ndim != 2:
        raise ValueError(f"Muon orthogonalises 2-D matrices; got shape {tuple(u.shape)}")
    a, b, c = coefficients
    tall = u.size(0) > u.size(1)
    x = u.to(dtype).mT if tall else u.to(dtype)  # (r, s), r <= s
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT  # A = X X^T                                              (r, r)
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2     (r, r)
        x = torch.addmm(x, poly, x, beta=a)  # a X + (b A + c A^2) X              (r, s)
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
            lr, mu, wd = float(group["lr"]), group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)
                update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
                dtype = self.ns_dtype or fast_ns_dtype(p.device.type)
                ortho = newton_schulz(
                    update, group["ns_steps"], group["ns_coefficients"], group["eps"], dtype
                )
                p.mul_(1 - lr * wd)
                p.add_(ortho, alpha=-lr * shape_scale(p.shape, group["adjust_lr_fn"]))
        return loss
