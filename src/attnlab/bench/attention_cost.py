"""Suite ``attention``: time and peak memory of attention versus sequence length N.

004 "Complexity figures": self-attention costs time O(N^2 d_q + N^2 d_v) and space
O(N^2 + N d_v), the N^2 being the score matrix Q K^T kept for back-propagation. We measure
forward + backward of one self-attention call (no mask), q, k, v: (B, H, N, Dh) = (1, 4, N, 64),
through attnlab's one API ``attnlab.nn.attention.scaled_dot_product_attention``:

    explicit   need_weights=True: A = softmax(Q K^T / sqrt(d)) is formed, returned and stored
    fused      need_weights=False: torch's fused SDPA kernel (on CPU a flash-attention kernel that
               tiles the rows and never stores A; backward recomputes it)

attnlab has no third, separate memory-efficient path: the fused path *is* the memory-efficient
one on this CPU. Time: interleaved rounds per N, median seconds per call. Memory: extra resident
memory of one forward+backward over the inputs (``step_extra_bytes``, see
:mod:`attnlab.bench.memory`), each case in a fresh child process.

Exponents: least squares of log(y) on log(N) over N >= 1024 (smaller N are dominated by fixed
per-call costs), expected 2 for time on both paths (the arithmetic is O(N^2 d) either way), 2 for
the explicit path's memory and 1 for the fused path's. An explicit case predicted to exceed the
memory cap is skipped (decided up front from the estimate 16 B H N^2 bytes: about four fp32 (N, N)
matrices per head), and the result says so.

``matmul_gflops`` = 12 B H N^2 Dh / seconds: the six N x N x Dh matmuls of forward and backward
(the fused kernel's recomputation of Q K^T in backward is not counted).
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.bench import memory
from attnlab.bench.harness import interleave, loglog_slope, target_entry
from attnlab.nn.attention import scaled_dot_product_attention

PATHS = ("explicit", "fused")
BATCH, HEADS, D_HEAD = 1, 4, 64
FIT_FROM = 1024
MEMORY_TARGET = 0.05  # fused extra memory <= 5% of explicit's at the largest N (issue 6)


def make_inputs(n: int, batch: int = BATCH, heads: int = HEADS, d_head: int = D_HEAD, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, d_head, generator=gen).requires_grad_() for _ in "qkv"]


def make_step(path: str, n: int, **shape: int):
    """work(r) -> 1.0 after one forward+backward of the ``path`` attention at length n."""
    if path not in PATHS:
        raise ValueError(f"unknown attention path {path!r}; choose from {PATHS}")
    q, k, v = make_inputs(n, **shape)
    need_weights = path == "explicit"

    def work(r: int) -> float:
        for x in (q, k, v):
            x.grad = None
        out, weights = scaled_dot_product_attention(q, k, v, need_weights=need_weights)
        out.sum().backward()
        return 1.0

    return work


def memory_case(spec: dict[str, Any]):
    """One forward+backward for :mod:`attnlab.bench.memory` (spec: path, n)."""
    work = make_step(spec["path"], int(spec["n"]))
    return lambda: work(0)


def predicted_explicit_bytes(n: int, measured: dict[int, float]) -> float:
    """Extrapolate c N^2 from the largest measured length (or 16 B H N^2 bytes if none)."""
    if measured:
        m = max(measured)
        return measured[m] * (n / m) ** 2
    return 16.0 * BATCH * HEADS * n * n  # ~4 fp32 (N, N) matrices per head: A, grads, temps


def _fit(rows: list[dict], path: str, key: str) -> dict[str, Any]:
    """Exponent over the lengths >= FIT_FROM (all lengths if fewer than two are that long)."""
    pts = [(r["n"], r[path][key]) for r in rows if r.get(path, {}).get(key)]
    big = [p for p in pts if p[0] >= FIT_FROM]
    use = big if len(big) >= 2 else pts
    return {
        "exponent": loglog_slope([p[0] for p in use], [p[1] for p in use]),
        "lengths": [p[0] for p in use],
    }


def run(settings, ctx) -> dict[str, Any]:
    cap = settings.memory_cap_gib * 1024**3
    threads = torch.get_num_threads()
    plan = []  # (n, paths to run, skipped-row entries)
    for n in settings.attention_lengths:
        predicted = predicted_explicit_bytes(n, {})
        if predicted > cap:
            plan.append(
                (
                    n,
                    ["fused"],
                    {
                        "explicit": {
                            "status": "skipped",
                            "predicted_bytes": predicted,
                            "reason": f"predicted {predicted / 1024**3:.1f} GiB > cap "
                            f"{settings.memory_cap_gib:g} GiB (--memory-cap-gib)",
                        }
                    },
                )
            )
        else:
            plan.append((n, list(PATHS), {}))
    cases = [
        {"module": "attention_cost", "path": p, "n": n, "threads": threads}
        for n, paths, _ in plan
        for p in paths
    ]
    ctx.say(f"attention: {len(cases)} memory cases in child processes")
    if settings.fresh_process_per_case:
        mems = [memory.run_cases([c])[0] for c in cases]
    else:
        mems = memory.run_cases(cases)
    by_case = {(c["n"], c["path"]): m for c, m in zip(cases, mems)}
    rows, explicit_mem = [], {}
    for n, paths, skipped in plan:
        row: dict[str, Any] = {"n": n, **skipped}
        works = {p: make_step(p, n) for p in paths}
        timings = interleave(
            works, rounds=settings.rounds, warmup=settings.warmup, min_round_s=settings.min_round_s
        )
        del works
        flops = 12.0 * BATCH * HEADS * n * n * D_HEAD
        for p in paths:
            t, mem = timings[p], by_case[(n, p)]
            sec = t.median_seconds_per_call
            row[p] = {
                "status": "ok",
                "seconds": sec,
                "seconds_rounds": [s / t.repeats for s in t.seconds],
                "matmul_gflops": flops / sec / 1e9,
                "extra_bytes": mem.get("step_extra_bytes"),
                "memory": mem,
            }
            if p == "explicit" and mem.get("step_extra_bytes"):
                explicit_mem[n] = mem["step_extra_bytes"]
        ctx.say(
            f"attention N={n}: "
            + "  ".join(
                f"{p} {row[p]['seconds'] * 1e3:.1f} ms {_mib(row[p]['extra_bytes'])}" for p in paths
            )
        )
        rows.append(row)
    fits = {}
    for p in PATHS:
        time_fit, memory_fit = _fit(rows, p, "seconds"), _fit(rows, p, "extra_bytes")
        fits[p] = {
            "time_exponent": time_fit["exponent"],
            "time_fit_lengths": time_fit["lengths"],
            "memory_exponent": memory_fit["exponent"],
            "memory_fit_lengths": memory_fit["lengths"],
        }
    expected = {
        "explicit": {"time_exponent": 2.0, "memory_exponent": 2.0},
        "fused": {"time_exponent": 2.0, "memory_exponent": 1.0},
    }
    return {
        "status": "ok",
        "shape": {"batch": BATCH, "heads": HEADS, "d_head": D_HEAD},
        "threads": threads,
        "memory_method": memory.METHOD,
        "fit_from_n": FIT_FROM,
        "memory_cap_bytes": cap,
        "lengths": rows,
        "fits": fits,
        "expected": expected,
        "targets": [_memory_target(rows, explicit_mem)],
    }


def _memory_target(rows: list[dict], explicit_mem: dict[int, float]) -> dict[str, Any]:
    last = rows[-1]
    fused = last.get("fused", {}).get("extra_bytes")
    note = ""
    if last.get("explicit", {}).get("status") == "ok":
        explicit = last["explicit"]["extra_bytes"]
    else:
        explicit = predicted_explicit_bytes(last["n"], explicit_mem)
        note = "explicit path skipped at this N; its memory is extrapolated as c N^2"
    value = fused / explicit if fused and explicit else None
    return target_entry(
        "attention_fused_memory_fraction",
        f"fused-path extra memory / explicit-path extra memory at N={last['n']} (lower is better)",
        value,
        MEMORY_TARGET,
        higher_is_better=False,
        note=note,
    )


def _mib(x: float | None) -> str:
    return "(memory n/a)" if not x else f"{x / 2**20:.1f} MiB"
