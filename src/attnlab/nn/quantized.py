"""Weight-only reduced-precision linear layers: drop-in replacements of ``nn.Linear`` for decoding.

A linear layer computes y = x W^T + b. Decoding one token at a time reads every weight once per
token and does two flops with it, so at batch 1 its speed is the memory traffic of W. Storing an
approximation W_hat of W in fewer bits cuts that traffic; the activations x, the bias and every
other part of the model stay in the compute dtype (fp32). The three forms:

    int8, per output channel n (symmetric):
        s_n = max_k |W_nk| / 127,   q_nk = round(W_nk / s_n) in [-127, 127],   W_hat_nk = s_n q_nk
    int4, per group g of G inputs of channel n (asymmetric, 16 levels):
        lo, hi = min, max of W_n,g;   a = (hi - lo) / 15,   z = lo + 8 a
        q_nk = round((W_nk - lo) / a) in [0, 15],            W_hat_nk = a (q_nk - 8) + z
    bf16:  W_hat = W rounded to bfloat16 (8 significant bits)

and the error of one output is bounded by the rounding of W (|W - W_hat|_nk <= s_n / 2 for int8,
a / 2 for int4) times ||x||_1, plus the bfloat16 rounding of the product's operands and output
(relative 2^-8 each; see :func:`error_bound`).

The products run in PyTorch's own kernels: ``torch._weight_int8pack_mm`` and
``torch._weight_int4pack_mm_for_cpu`` (which widen the weights inside the kernel, so only the
small codes cross the memory bus) and oneDNN's bf16 ``linear`` (timings: benchmarks/ANALYSIS.md,
"Reduced-precision decode"). The int8/int4 kernels are fast only for bfloat16 activations (their
fp32-activation path is scalar), so x is rounded to bf16 on its way in and the output widened
back.
Inductor lowers both to the same kernels, so ``torch.compile`` keeps them.

The modules are for inference: their weights are buffers, not parameters, and no gradient flows.
``weight`` describes the stored weight (shape, compute dtype, device) for code that checks it, and
``weight.dequantize()`` returns W_hat as a float tensor.

Shapes: M rows (all leading dimensions of x flattened), K in_features, N out_features, G group.
"""

from __future__ import annotations

import warnings
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

BF16_UNIT = 2.0**-8  # bfloat16's unit roundoff (8 significant bits), an upper bound per rounding
INT4_GROUP_SIZES = (64, 32)  # tried in this order; the kernel takes 32, 64, 128 or 256
INT4_N_BLOCK = 64  # the int4 CPU packing's block of output channels; rows are padded to it
# torch._weight_int8pack_mm reads K in vector steps (torch 2.13, CPU: 16 with AVX-512, 8 with AVX2
# and NEON) and on other widths crashes the process (AVX2) or returns garbage (AVX-512), so codes
# and inputs are padded with zero columns to a multiple of the largest step;
# int8_kernel_is_exact checks the kernel once per process on this machine
INT8_K_BLOCK = 16


def bf16_at_least(x: Tensor) -> Tensor:
    """x rounded to a bfloat16 value >= x (for x > 0), so a scale never shrinks the code range."""
    return (x * (1 + 2 * BF16_UNIT)).to(torch.bfloat16)  # RN lowers by at most 2^-8


class QuantizedWeight:
    """What a reduced-precision ``Linear`` shows as ``.weight``: shape, dtype, device, codes.

    ``dtype`` is the compute dtype (what the layer takes and returns), so a dtype check such as
    ``x.dtype == layer.weight.dtype`` holds as for ``nn.Linear``. It is not a tensor: arithmetic
    on it fails loudly; :meth:`dequantize` gives W_hat (N, K) as a tensor.
    """

    def __init__(self, layer: WeightOnlyLinear):
        self._layer = layer
        self.shape = torch.Size((layer.out_features, layer.in_features))
        self.dtype = layer.compute_dtype
        self.format = layer.format

    @property
    def device(self) -> torch.device:
        return self._layer.bias_or_codes().device

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dequantize(self) -> Tensor:
        """W_hat (N, K) in the compute dtype."""
        return self._layer.dequantize()

    def __repr__(self) -> str:
        return f"QuantizedWeight({self.format}, shape={tuple(self.shape)}, dtype={self.dtype})"

    def __getattr__(self, name: str):
        raise AttributeError(
            f"the layer holds {self.format} weights, not a float tensor, so .weight has no "
            f"{name!r}; use .weight.dequantize() for W_hat as a tensor, or load the model "
            "again without reduced-precision weights to train or export it"
        )


class WeightOnlyLinear(nn.Module):
    """Base of the reduced-precision layers: y = x W_hat^T + b, x and y in the compute dtype."""

    format = "?"
    bias: Tensor | None  # b (N,), a buffer

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.compute_dtype = linear.weight.dtype
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)

    @property
    def weight(self) -> QuantizedWeight:
        return QuantizedWeight(self)

    def bias_or_codes(self) -> Tensor:
        return next(iter(self.buffers()))

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) -> y (..., N) in x's dtype."""
        if x.size(-1) != self.in_features:
            raise ValueError(
                f"{type(self).__name__} expects inputs of width {self.in_features}, got "
                f"{tuple(x.shape)}"
            )
        y = _Product.apply(x.reshape(-1, self.in_features), self)  # (M, N)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)  # (..., N)
        return y if self.bias is None else y + self.bias

    def product(self, x: Tensor) -> Tensor:  # (M, K) -> (M, N)
        raise NotImplementedError

    def dequantize(self) -> Tensor:  # (N, K)
        raise NotImplementedError

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, weights={self.format}"
        )


class _Product(torch.autograd.Function):
    """y = x W_hat^T through the layer's packed kernel, which has no derivative of its own; the
    backward pass is dL/dx = dL/dy W_hat with the dequantised weights (the weights are frozen
    codes: they get no gradient). So gradients reach the activations of a quantised model
    (``inspect``'s gradient cache, attribution patching)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, layer: WeightOnlyLinear) -> Tensor:  # (M, K) -> (M, N)
        ctx.layer, ctx.dtype = layer, x.dtype
        return layer.product(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # (M, N) -> (M, K)
        w = ctx.layer.dequantize().to(grad.dtype)  # (N, K)
        return (grad @ w).to(ctx.dtype), None


class Int8Linear(WeightOnlyLinear):
    """int8 codes with one scale per output channel: W_hat_nk = s_n q_nk (module docstring)."""

    format = "int8"
    codes: Tensor  # q (N, K') int8, a buffer; K' = K rounded up to INT8_K_BLOCK (zero columns)
    scale: Tensor  # s (N,) bf16, a buffer

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        w = linear.weight.detach().float()  # (N, K)
        scale = bf16_at_least(w.abs().amax(dim=1).clamp(min=1e-12) / 127)  # (N,) s_n
        codes = torch.round(w / scale[:, None].float()).clamp(-127, 127).to(torch.int8)  # (N, K)
        self.k_pad = -self.in_features % INT8_K_BLOCK  # zero columns: they add 0 to x W^T
        self.register_buffer("codes", F.pad(codes, (0, self.k_pad)))  # (N, K')
        self.register_buffer("scale", scale)  # bf16, the kernel's scale dtype
        self.use_kernel = int8_kernel_is_exact()  # checked once per process (CPU: supported_modes)

    def product(self, x: Tensor) -> Tensor:
        x = F.pad(x.to(torch.bfloat16), (0, self.k_pad)) if self.k_pad else x.to(torch.bfloat16)
        if self.use_kernel:
            return torch._weight_int8pack_mm(x.contiguous(), self.codes, self.scale)  # (M, N)
        # the kernel's arithmetic without it: s_n q_nk is exact in fp32 (8 by 7 significant
        # bits), the sum runs in fp32 and is rounded to bf16 once, as the kernel does
        w_hat = self.codes.float() * self.scale.float()[:, None]  # (N, K')
        return F.linear(x.float(), w_hat).to(torch.bfloat16)  # (M, N)

    def dequantize(self) -> Tensor:
        codes = self.codes[:, : self.in_features].float()  # (N, K)
        return (codes * self.scale.float()[:, None]).to(self.compute_dtype)


@cache
def int8_kernel_is_exact() -> bool:
    """Whether ``torch._weight_int8pack_mm`` on this CPU computes x (s q)^T exactly for a
    problem whose every partial sum is a small integer (so exact in bf16), at a width that is a
    multiple of INT8_K_BLOCK but of no larger power of two, and row and column counts that fill
    no kernel block. PyTorch documents neither the kernel's vector step nor its CPU dispatch, so
    a kernel this module does not know is found here, once, and the layers compute the product
    without it (slower, same error bound) with a warning instead of wrong output."""
    gen = torch.Generator().manual_seed(0)
    m, n, k = 5, 20, 3 * INT8_K_BLOCK
    x = torch.randint(-1, 2, (m, k), generator=gen)  # entries in {-1, 0, 1}
    q = torch.randint(-2, 3, (n, k), generator=gen)  # |sum| <= 2k < 2^8: exact in bf16
    scale = torch.ones(n, dtype=torch.bfloat16)
    got = torch._weight_int8pack_mm(x.to(torch.bfloat16), q.to(torch.int8), scale)  # (M, N)
    exact = torch.equal(got.float(), (x @ q.T).float())
    if not exact:
        warnings.warn(
            f"torch._weight_int8pack_mm in torch {torch.__version__} gives wrong products on this "
            "CPU; int8 layers compute x (s q)^T with an fp32 matmul instead (within the same "
            "documented bound, slower)",
            RuntimeWarning,
            stacklevel=2,
        )
    return exact


def int4_group_size(in_features: int) -> int | None:
    """The group size G for an input width K (the largest supported one dividing K), or None."""
    return next((g for g in INT4_GROUP_SIZES if in_features % g == 0), None)


class Int4Linear(WeightOnlyLinear):
    """4-bit codes with a scale and an offset per group of G inputs (module docstring)."""

    format = "int4"
    packed: Tensor  # the kernel's packing of the codes (N', K/2), a buffer
    scales_zeros: Tensor  # (a, z) per group and channel (K/G, N', 2), a buffer

    def __init__(self, linear: nn.Linear, group_size: int | None = None):
        super().__init__(linear)
        n, k = self.out_features, self.in_features
        g = group_size or int4_group_size(k)
        if g is None or k % g:
            raise ValueError(
                f"int4 weights need an input width divisible by the group size "
                f"({' or '.join(map(str, INT4_GROUP_SIZES))}); this layer's is {k}; use int8"
            )
        self.group_size = g
        n_pad = -n % INT4_N_BLOCK
        w = F.pad(linear.weight.detach().float(), (0, 0, 0, n_pad))  # (N', K), zero rows
        groups = w.reshape(n + n_pad, k // g, g)  # (N', K/G, G)
        lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)  # (N', K/G)
        step = bf16_at_least(((hi - lo) / 15).clamp(min=1e-12))  # a (N', K/G)
        offset = (lo + 8 * step.float()).to(torch.bfloat16)  # z
        low = offset.float() - 8 * step.float()  # the lo that a and z represent
        codes = torch.round((groups - low[..., None]) / step.float()[..., None]).clamp(0, 15)
        codes = codes.to(torch.int32).reshape(n + n_pad, k)  # (N', K)
        # the kernel's layout: (K/G, N', 2) holding (a, z) per group and channel
        scales_zeros = torch.stack([step, offset], dim=-1).transpose(0, 1).contiguous()
        self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(codes, 1))
        self.register_buffer("scales_zeros", scales_zeros)

    def product(self, x: Tensor) -> Tensor:
        y = torch._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16).contiguous(), self.packed, self.group_size, self.scales_zeros
        )  # (M, N')
        return y[:, : self.out_features]  # (M, N)

    def dequantize(self) -> Tensor:
        n, k, g = self.out_features, self.in_features, self.group_size
        codes = unpack_int4(self.packed)[:n].float().reshape(n, k // g, g)  # (N, K/G, G)
        step, offset = self.scales_zeros.float().transpose(0, 1)[:n].unbind(-1)  # (N, K/G) each
        w_hat = (codes - 8) * step[..., None] + offset[..., None]  # (N, K/G, G)
        return w_hat.reshape(n, k).to(self.compute_dtype)


def unpack_int4(packed: Tensor, block: int | None = None) -> Tensor:
    """The codes (N, K) of ``torch._convert_weight_to_int4pack_for_cpu`` output (N, K/2).

    For N a multiple of 64 the layout is blocks of B channels, each stored column by column as
    B/2 bytes: the low nibble of byte j holds channel j, the high nibble channel B/2 + j. B is
    the kernel's vector block, which depends on the CPU: 64 with AVX-512, 32 with AVX2
    (:func:`int4_pack_block` finds it; ``block`` overrides).
    """
    b = block or int4_pack_block()
    n, k = packed.size(0), packed.size(1) * 2
    blocks = packed.view(n // b, k, b // 2)  # (N/B, K, B/2)
    codes = torch.cat([blocks & 15, blocks >> 4], dim=2)  # (N/B, K, B)
    return codes.transpose(1, 2).reshape(n, k).to(torch.int32)  # (N, K)


@cache
def int4_pack_block() -> int:
    """The channel block B of this machine's int4 packing, found by packing known codes once
    (PyTorch chooses it by CPU capability and documents neither)."""
    n, k = INT4_N_BLOCK, 32
    probe = (torch.arange(n)[:, None] * 7 + torch.arange(k)[None, :] * 3) % 16  # (N, K)
    packed = torch._convert_weight_to_int4pack_for_cpu(probe.to(torch.int32).contiguous(), 1)
    for b in (64, 32, 16):
        if torch.equal(unpack_int4(packed, b), probe.to(torch.int32)):
            return b
    raise RuntimeError(  # a PyTorch whose layout this module does not know
        f"unknown int4 packing layout in torch {torch.__version__}: attnlab.nn.quantized."
        "unpack_int4 cannot read it back; use int8 weights"
    )


class BF16Linear(WeightOnlyLinear):
    """W_hat = W in bfloat16; the product runs in bf16 (native on AVX-512 BF16, AMX, CUDA)."""

    format = "bf16"
    w: Tensor  # W_hat (N, K) bf16, a buffer

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        self.register_buffer("w", linear.weight.detach().to(torch.bfloat16).clone())  # (N, K)

    def product(self, x: Tensor) -> Tensor:
        return F.linear(x.to(torch.bfloat16), self.w)

    def dequantize(self) -> Tensor:
        return self.w.to(self.compute_dtype)


def error_bound(layer: WeightOnlyLinear, x: Tensor, weight: Tensor) -> Tensor:
    """An upper bound on |x W^T - layer(x)| (without bias), elementwise (..., N).

    With W_hat the stored weight and u = 2^-8 (bf16's unit roundoff), the computed product is
    fl(sum_k fl(x_k) W_hat_nk) accumulated in fp32 and rounded to bf16, so

        |y - y_hat|_n <= sum_k |x_k| |W - W_hat|_nk + (2u (1 + u) + K 2^-24) sum_k |x_k| |W_hat|_nk

    (the weights' rounding, then x's and the output's roundings to bf16, then fp32 accumulation).
    The weights' rounding itself is at most s_n / 2 (int8), a / 2 (int4) or u |W| (bf16).
    """
    xa = x.float().abs()
    w_hat = layer.dequantize().float()  # (N, K)
    weight_part = xa @ (weight.float() - w_hat).abs().T  # (..., N)
    k = layer.in_features
    return weight_part + (2 * BF16_UNIT * (1 + BF16_UNIT) + k * 2.0**-24) * (xa @ w_hat.abs().T)
