"""Suite ``matmul``: this machine's dense fp32 matmul rate, the physical limit for training.

C = A B with A, B square n x n fp32 costs 2 n^3 FLOPs. We time ``torch.mm`` (into a preallocated
output) at a few sizes in interleaved rounds and take, per size, the median GFLOP/s; the *peak* is
the best of those medians, so "fraction of peak" elsewhere is measured against the most
favourable dense kernel this process achieved with the same thread count (a generous denominator:
it makes our fractions conservative).
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.bench.harness import interleave

SIZES = (1024, 2048)
QUICK_SIZES = (1024,)
TINY_SIZES = (128,)


def make_matmul(n: int, seed: int = 0):
    """work(r) -> FLOPs of one n x n x n fp32 matmul."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)
    out = torch.empty(n, n)
    flops = 2.0 * n**3

    def work(r: int) -> float:
        torch.mm(a, b, out=out)
        return flops

    return work


def measure(sizes: tuple[int, ...], *, rounds: int, warmup: int, min_round_s: float) -> dict:
    """Median GFLOP/s per size and the peak over sizes (JSON block of the ``matmul`` suite)."""
    works = {f"mm_{n}": make_matmul(n) for n in sizes}
    timings = interleave(works, rounds=rounds, warmup=max(warmup, 2), min_round_s=min_round_s)
    rows: list[dict[str, Any]] = []
    for n in sizes:
        t = timings[f"mm_{n}"]
        rows.append(
            {
                "n": n,
                "gflops": t.median_rate / 1e9,
                "gflops_rounds": [r / 1e9 for r in t.rates],
                "calls_per_round": t.repeats,
            }
        )
    return {
        "status": "ok",
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "sizes": rows,
        "peak_gflops": max(r["gflops"] for r in rows),
    }


def sizes_for(settings) -> tuple[int, ...]:
    """Matrix sizes of this mode: 1024 and 2048 (quick: 1024; tiny: 128)."""
    return TINY_SIZES if settings.tiny else QUICK_SIZES if settings.quick else SIZES


def run(settings, ctx) -> dict[str, Any]:
    result = measure(
        sizes_for(settings),
        rounds=settings.rounds,
        warmup=settings.warmup,
        min_round_s=settings.min_round_s,
    )
    ctx.say(
        f"matmul: peak {result['peak_gflops']:.1f} GFLOP/s fp32 with {result['threads']} threads"
    )
    return result
