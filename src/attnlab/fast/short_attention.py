"""Eq. 9 for short key sequences on the CPU, with its gradient written out (004 eq. 9).

The matrix form of :func:`attnlab.nn.attention._explicit`, as one autograd node:

    forward   S  = factor * Q K^T  (masked entries set to the dtype's minimum)      (B, H, T, S)
              A  = softmax_row(S)  (rows with no admissible key set to 0)           (B, H, T, S)
              O  = A V                                                              (B, H, T, Dv)
    backward  dV = A^T dO                                                           (B, H, S, Dv)
              dA = dO V^T                                                           (B, H, T, S)
              dS = A * (dA - rowsum(dA * A))     (the softmax Jacobian, row by row) (B, H, T, S)
              dQ = factor * dS K,   dK = factor * dS^T Q                            (B, H, T|S, Dk)

Why a third path: for short keys PyTorch's CPU flash kernel is dominated by per-call set-up (it
tiles for long sequences), and autograd on the explicit form keeps and revisits more buffers than
the five products above need. Measured forward + backward on the 2-core CPU (fp32, ad hoc timing
loop, 100 calls each, contiguous q, k, v): (B, H, T, Dh) = (16, 8, 20, 32) with a key padding
mask 1327 us fused, 582 us explicit with autograd, 482 us here; (16, 8, 128, 32) 14.5 / - / 10.0
ms. Inside multi-head attention on an unpacked batch the heads are strided views of one
projection and the products need contiguous copies, which eats much of that (the row groups of a
packed batch arrive contiguous: ``nn.packing.grouped_heads``). On the seq2seq benchmark's whole
training step the node gave +6% (ad hoc A/B, 12 interleaved rounds: 2928 vs 2767 target tokens/s,
before ``grouped_heads``); with a causal mask alone PyTorch's ``is_causal`` kernel is as fast (LM
step A/B), so the node is used only for masked attention. From S = 256 (Dh 64) the fused kernel
is as fast and from S = 512 faster, so the node is used only up to :data:`SHORT_KEYS` keys, where
the (T, S) matrix kept for backward is at most 128 / Dh times the size of Q: memory stays O(N) in
the sequence length as a whole (long sequences take the fused path).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

SHORT_KEYS = 128  # up to this many keys the CPU uses this path (see the module docstring)

# True inside torch.func transforms (a private hook; without it, assume none are active).
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def use_short_keys(q: Tensor, k: Tensor, dropout_p: float) -> bool:
    """True where this path is the faster one: CPU, fp32/fp64, eager, no dropout, 1 < T, S <= 128.

    A single query (a decode step) is faster through the fused kernel (13 vs 50 us at S = 64).
    Under ``torch.func`` transforms (grad, vmap, jacrev, ...) the fused kernel is used: this node
    has a first derivative only and no batching rule.
    """
    return (
        q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.float64)
        and dropout_p == 0.0
        and q.size(-2) > 1
        and k.size(-2) <= SHORT_KEYS
        and not torch.compiler.is_compiling()
        and not _functorch_active()
    )


def short_key_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, factor: float):
    """softmax(factor * Q K^T, masked) V. q (B, H, T, Dk), k (B, H, S, Dk), v (B, H, S, Dv),
    mask bool broadcastable to (B, H, T, S) (True = may attend) or None -> (B, H, T, Dv)."""
    return _ShortKeyAttention.apply(q, k, v, mask, factor)


class _ShortKeyAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, factor):
        scores = torch.matmul(q, k.transpose(-2, -1)).mul_(factor)  # (B, H, T, S)
        if mask is not None:
            scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
        if mask is not None:
            row_any = mask.any(dim=-1, keepdim=True)  # (.., T, 1): a row with no admissible key
            if not bool(row_any.all()):
                weights.mul_(row_any)  # ... attends nowhere: zero weights, zero output
        ctx.save_for_backward(q, k, v, weights)
        ctx.factor = factor
        return torch.matmul(weights, v)  # (B, H, T, Dv)

    @staticmethod
    @once_differentiable  # the saved weights carry no graph: a second derivative is refused
    def backward(ctx, grad_out):
        q, k, v, weights = ctx.saved_tensors
        grad_v = torch.matmul(weights.transpose(-2, -1), grad_out)  # (B, H, S, Dv)
        grad_weights = torch.matmul(grad_out, v.transpose(-2, -1))  # (B, H, T, S)
        grad_scores = torch.ops.aten._softmax_backward_data(
            grad_weights, weights, -1, weights.dtype
        ).mul_(ctx.factor)  # (B, H, T, S); zero on rows whose weights are zero
        grad_q = torch.matmul(grad_scores, k)  # (B, H, T, Dk)
        grad_k = torch.matmul(grad_scores.transpose(-2, -1), q)  # (B, H, S, Dk)
        return grad_q, grad_k, grad_v, None, None
