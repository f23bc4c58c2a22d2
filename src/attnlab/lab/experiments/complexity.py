"""Experiment ``complexity``: the cost of self-attention vs recurrence (004 "Complexity figures";
Vaswani et al. 2017, Table 1).

Per layer, for a sequence of n vectors of width d:

    layer            FLOPs per layer        sequential operations
    self-attention   O(n^2 d)  (Q K^T, A V)        O(1)
    recurrent        O(n d^2)  (W h, U x)          O(n)

so self-attention is cheaper than a recurrent layer while n < d, and the two cost the same
near n = d. Measured here on this machine, forward pass, B = 1, one thread:

- FLOPs: the attention core Q K^T, softmax, A V (counted by ``torch.utils.flop_counter`` on
  ``attnlab.nn.scaled_dot_product_attention``: 4 n^2 d) against the Elman recurrence
  h_t = tanh(W h_{t-1} + U x_t + b) (4 n d^2, two d x d products per step; torch.nn.RNN's
  fused kernel is not seen by the counter, so its count is the formula, checked against an
  explicit loop of the same products);
- wall time of each (best of several calls, in 3 rounds), and the length n* where the two
  curves cross, against the predicted n* = d;
- the projections W^Q, W^K, W^V, W^O of a full attention layer add 8 n d^2 FLOPs, the same
  order as the recurrence: Table 1 counts only the attention itself (said in the findings).

Where a GPU is present the same wall times are measured on it too, and the claim's own test --
the attention core is faster than the recurrence at every n < d -- joins the verdict there; without
one the verdict says "CPU only" (:data:`CPU_ONLY`).

Shapes: B = 1, n length, d width.
"""

from __future__ import annotations

import math
import os
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from attnlab.lab.kit.charts import line_chart, save_chart, seeds_chart
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import FigureRef, Report, Table, Threshold
from attnlab.lab.kit.seeds import spread, spread_text, start_seeds
from attnlab.lab.kit.timing import CPU, best_ms, device_name, find_gpu
from attnlab.lab.kit.verdict import gated_fields, verdict_of
from attnlab.nn.attention import scaled_dot_product_attention


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) V for one head: (1, 1, n, d) each -> (1, 1, n, d)."""
    return scaled_dot_product_attention(q, k, v, need_weights=True).out  # explicit path


def recurrence_loop(x: torch.Tensor, rnn: nn.RNN) -> torch.Tensor:
    """h_t = tanh(U x_t + b_U + W h_{t-1} + b_W), t = 1..n, as explicit products: (1, n, d)."""
    w_ih, w_hh, b_ih, b_hh = rnn.all_weights[0]  # U (d, d), W (d, d), b_U, b_W
    h = x.new_zeros(1, rnn.hidden_size)
    out = []
    for t in range(x.size(1)):
        h = torch.tanh(x[:, t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh)
        out.append(h)
    return torch.stack(out, dim=1)


def counted_flops(fn, *args) -> int:
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def crossover(ns: list[int], a: list[float], b: list[float]) -> float:
    """The n where curve a (rising faster) meets curve b, by log-log interpolation; inf if
    a stays below b, 0 if it starts above."""
    diff = [math.log(x) - math.log(y) for x, y in zip(a, b)]
    if diff[0] >= 0:
        return float(ns[0]) if diff[0] == 0 else 0.0
    for i in range(1, len(ns)):
        if diff[i] >= 0:
            f = -diff[i - 1] / (diff[i] - diff[i - 1])
            return float(
                math.exp(math.log(ns[i - 1]) + f * (math.log(ns[i]) - math.log(ns[i - 1])))
            )
    return math.inf


COST = (
    "Full run: FLOP counts plus 3 rounds of best-of-5 forward timings, 2 widths x 8 lengths. "
    "Under 1 min on 2 idle cores; where a GPU is present the timings "
    "run there too (seconds more). Command: attnlab experiment complexity --seed 0"
)
CPU_ONLY = (
    "CPU only: no GPU was used. The FLOP counts do not depend on the hardware; the wall times "
    "are this CPU's (one thread), where the recurrence's n serial steps cost little more than "
    "their FLOPs. On a GPU, where the n^2 scores run in parallel and the n steps cannot, the "
    "measured crossover would move; this run cannot show where."
)
CLAIM = (
    "For self-attention, since Q = K, then the time complexity [...] figures are "
    "O(N^2 d_q + N^2 d_v) (004). -- Self-attention layers are faster than recurrent layers "
    "when the sequence length n is smaller than the representation dimensionality d "
    "(Vaswani et al. 2017, Sec. 4 and Table 1: recurrent O(n d^2) per layer, O(n) "
    "sequential operations)."
)
WARMUP = 1  # untimed calls before the timed ones
NEAR = 4.0  # "near n = d": within this factor (the lab's; the paper gives none)
THRESHOLDS = [
    Threshold(
        "counted FLOPs: attention core = recurrence at",
        "n = d (within 5 %)",
        "Vaswani et al. 2017, Table 1: O(n^2 d) vs O(n d^2) per layer",
    ),
    Threshold(
        "wall time: the crossover, on every round",
        f"within a factor {NEAR:g} of n = d",
        "Vaswani et al. 2017, Sec. 4: self-attention is faster 'when the sequence length n is "
        f"smaller than the representation dimensionality d' (no tolerance given; {NEAR:g} is the "
        "lab's)",
    ),
]

GPU_THRESHOLDS = [
    Threshold(
        "GPU wall time: the attention core faster than the recurrence",
        "at every n < d, on every round",
        "Vaswani et al. 2017, Sec. 4: self-attention layers are faster than recurrent layers "
        "'when the sequence length n is smaller than the representation dimensionality d'",
    )
]


@torch.no_grad()
def measure(
    quick: bool, seed: int, data: Path | None = None, gpu: torch.device | None = None
) -> dict:
    """Counted FLOPs per (arm, d) and n, and best-of forward times per (arm, d), round and n
    (each round re-measures everything with its own seed) on the CPU and on ``gpu`` (default:
    the machine's GPU, if any). ``data`` is unused."""
    rounds = start_seeds(seed, quick)
    widths = (32,) if quick else (64, 256)
    ns = [8, 16, 32, 64] if quick else [16, 32, 64, 128, 256, 512, 1024, 2048]
    repeats = 2 if quick else 5
    flops: dict[tuple, list[int]] = {}
    ms: dict[tuple, dict[int, list[float]]] = {}
    check = {}
    for d in widths:
        rnn = nn.RNN(d, d, batch_first=True)
        for n in ns:
            q, k, v = (torch.randn(1, 1, n, d) for _ in range(3))
            flops.setdefault(("self-attention", d), []).append(
                counted_flops(attention_core, q, k, v)
            )
            flops.setdefault(("recurrent", d), []).append(4 * n * d * d)
        x = torch.randn(1, ns[0], d)
        check[d] = (counted_flops(recurrence_loop, x, rnn), 4 * ns[0] * d * d)
    ms = timings(rounds, widths, ns, repeats, CPU)
    gpu = gpu if gpu is not None else find_gpu()
    return {
        "rounds": rounds,
        "widths": list(widths),
        "ns": ns,
        "repeats": repeats,
        "warmup": WARMUP,
        "flops": flops,
        "ms": ms,
        "ms_gpu": timings(rounds, widths, ns, repeats, gpu) if gpu is not None else None,
        "flop_check": check,
        "logical_cores": os.cpu_count(),
        "gpu": device_name(gpu) if gpu is not None else None,  # the GPU timed, if any
    }


def timings(
    rounds: list[int], widths, ns: list[int], repeats: int, device: torch.device
) -> dict[tuple, dict[int, list[float]]]:
    """Best-of forward times ``{(arm, d): {round: [ms at each n]}}`` on ``device``, each round
    with its own seed (the same inputs on every device)."""
    ms: dict[tuple, dict[int, list[float]]] = {}
    for r in rounds:
        torch.manual_seed(r)
        for d in widths:
            rnn = nn.RNN(d, d, batch_first=True).to(device)
            for n in ns:
                q, k, v = (torch.randn(1, 1, n, d).to(device) for _ in range(3))
                x = torch.randn(1, n, d).to(device)
                ms.setdefault(("self-attention", d), {}).setdefault(r, []).append(
                    best_ms(partial(attention_core, q, k, v), device, repeats, WARMUP)
                )
                ms.setdefault(("recurrent", d), {}).setdefault(r, []).append(
                    best_ms(partial(rnn, x), device, repeats, WARMUP)
                )
    return ms


def cost_rows(m: dict, key: str = "ms") -> list[dict]:
    """FLOPs and wall times per (d, n), from the timings under ``key`` (``ms``: CPU; ``ms_gpu``)."""
    flops, ms, rounds, rows = m["flops"], m[key], m["rounds"], []
    for d in m["widths"]:
        for j, n in enumerate(m["ns"]):
            att = [ms[("self-attention", d)][r][j] for r in rounds]
            rec = [ms[("recurrent", d)][r][j] for r in rounds]
            rows.append(
                {
                    "d": d,
                    "n": n,
                    "attention FLOPs": flops[("self-attention", d)][j],
                    "recurrent FLOPs": flops[("recurrent", d)][j],
                    "FLOP ratio att/rec": flops[("self-attention", d)][j]
                    / flops[("recurrent", d)][j],
                    "attention ms": spread_text(att),
                    "recurrent ms": spread_text(rec),
                    "time ratio": spread(att)["mean"] / spread(rec)["mean"],
                }
            )
    return rows


def crossovers(m: dict, key: str = "ms") -> tuple[dict[int, float], dict[int, list[float]]]:
    """The FLOP crossover per d, and the wall-time crossover per d and round (timings under
    ``key``)."""
    flops, ms, ns = m["flops"], m[key], m["ns"]
    by_flops = {
        d: crossover(ns, flops[("self-attention", d)], flops[("recurrent", d)]) for d in m["widths"]
    }
    by_time = {
        d: [
            crossover(ns, ms[("self-attention", d)][r], ms[("recurrent", d)][r])
            for r in m["rounds"]
        ]
        for d in m["widths"]
    }
    return by_flops, by_time


def faster_below_d(m: dict, key: str = "ms_gpu") -> dict[int, bool]:
    """Per d: whether the attention core was faster than the recurrence at every n < d on every
    round (the claim as Vaswani et al. state it), from the timings under ``key``."""
    ms = m[key]
    return {
        d: all(
            ms[("self-attention", d)][r][j] < ms[("recurrent", d)][r][j]
            for r in m["rounds"]
            for j, n in enumerate(m["ns"])
            if n < d
        )
        for d in m["widths"]
    }


def crossing_text(cross: dict[int, list[float]], ns: list[int]) -> str:
    """``at n = mean (min-max) for d = ..`` per d; a crossover outside the lengths measured
    says on which side."""

    def one(d: int, cs: list[float]) -> str:
        if all(math.isinf(c) for c in cs):
            return f"beyond n = {ns[-1]} for d = {d} (attention faster at every n measured)"
        if all(c == 0 for c in cs):
            return f"below n = {ns[0]} for d = {d} (attention slower at every n measured)"
        return f"at n = {spread_text(cs)} for d = {d}"

    return ", ".join(one(d, cs) for d, cs in cross.items())


def verdict(m: dict) -> tuple[str, str]:
    widths, n_rounds = m["widths"], len(m["rounds"])
    cross_flops, cross_ms = crossovers(m)
    near = {d: all(d / NEAR <= c <= NEAR * d for c in cross_ms[d]) for d in widths}
    flop_exact = all(abs(cross_flops[d] / d - 1) < 0.05 for d in widths)
    scope = (
        f"GPU: {m['gpu']}, and the CPU ({m['logical_cores']} logical cores, one thread used)"
        if m["gpu"]
        else f"CPU only ({m['logical_cores']} logical cores, one thread used, no GPU)"
    )
    reason = (
        f"{scope}. Counted FLOPs cross at n = "
        + ", ".join(f"{cross_flops[d]:.0f} for d = {d}" for d in widths)
        + " (predicted n = d); measured CPU wall time (forward, B = 1; attention core vs "
        "torch.nn.RNN's fused kernel) crosses "
        + crossing_text(cross_ms, m["ns"])
        + f" (mean (min-max) over {n_rounds} rounds); within a factor {NEAR:g} of d on "
        "every round: " + ", ".join(f"d = {d} {'yes' if near[d] else 'no'}" for d in widths) + "."
    )
    checks = [flop_exact, *near.values()]
    if m["gpu"]:
        faster = faster_below_d(m)
        reason += (
            " On the GPU the wall times cross "
            + crossing_text(crossovers(m, "ms_gpu")[1], m["ns"])
            + "; the attention core faster than the recurrence at every n < d on every round: "
            + ", ".join(f"d = {d} {'yes' if faster[d] else 'no'}" for d in widths)
            + "."
        )
        checks += faster.values()
    return verdict_of(checks), reason


def gpu_finding(
    m: dict, gpu_cross: dict[int, list[float]], cpu_cross: dict[int, list[float]]
) -> str:
    """Where the GPU's wall times cross, against the CPU's and n = d (measured, not assumed)."""
    later = all(min(gpu_cross[d]) > max(cpu_cross[d]) for d in m["widths"])
    return (
        f"On the GPU ({m['gpu']}) the wall times cross "
        + crossing_text(gpu_cross, m["ns"])
        + "; on the CPU "
        + crossing_text(cpu_cross, m["ns"])
        + (
            ": later on the GPU for every d, where the n^2 scores run in parallel and the "
            "recurrence's n dependent steps cannot."
            if later
            else ": not later on the GPU for every d in this run."
        )
    )


def charts(m: dict, out_dir: Path) -> list[FigureRef]:
    figures = []
    ns, rounds = m["ns"], m["rounds"]
    names = {"self-attention": "self-attention core", "recurrent": "recurrent (nn.RNN)"}
    where = {"ms": "CPU, 1 thread"} | ({"ms_gpu": "GPU"} if m["gpu"] else {})
    for d in m["widths"]:
        fig = seeds_chart(
            {
                f"{names[arm]}, {place}": (ns, [m[key][(arm, d)][r] for r in rounds])
                for key, place in where.items()
                for arm in names
            },
            xlabel="sequence length n",
            ylabel="ms per forward pass",
            title=f"one layer, d = {d}, B = 1" + (f"; GPU {m['gpu']}" if m["gpu"] else ", CPU"),
            logx=True,
            logy=True,
            vline=d,
        )
        figures.append(
            save_chart(
                fig,
                out_dir,
                f"time_d{d}.png",
                f"Forward time on the {' and on the '.join(where.values())} of the attention "
                f"core and of the recurrence at d = {d} (mean over {len(rounds)} round(s), "
                "min-max band); the dashed line is n = d, the predicted crossover.",
            )
        )
    fig = line_chart(
        {
            f"{arm}, d = {d}": (ns, m["flops"][(arm, d)])
            for d in m["widths"]
            for arm in ("self-attention", "recurrent")
        },
        xlabel="sequence length n",
        ylabel="FLOPs per layer (forward)",
        title="counted FLOPs: 4 n^2 d vs 4 n d^2",
        logx=True,
        logy=True,
    )
    figures.append(
        save_chart(
            fig,
            out_dir,
            "flops.png",
            "FLOPs per layer against n (exact counts: no spread): the attention line (slope 2) "
            "crosses the recurrent one (slope 1) at n = d.",
        )
    )
    return figures


def write_up(measured: dict, out_dir: Path, quick: bool) -> Report:
    """Tables, figures and the verdict from :func:`measure`'s counts and timings."""
    m = measured
    word, reason = verdict(m)
    cross_flops, cross_ms = crossovers(m)
    gpu_cross = crossovers(m, "ms_gpu")[1] if m["gpu"] else {}
    return Report(
        name="complexity",
        title="The cost table: self-attention O(n^2 d) vs recurrence O(n d^2)",
        claim=CLAIM,
        source="004, 'Complexity figures'; Vaswani et al. 2017, Table 1 and Sec. 4",
        setup=[
            f"d in {m['widths']}, n in {m['ns']}, batch 1, forward only, float32, one torch "
            f"thread of {m['logical_cores']} logical cores.",
            "Self-attention: one head of attnlab.nn.scaled_dot_product_attention (Q K^T, "
            "softmax, A V) on random q, k, v; recurrent: torch.nn.RNN (tanh, one layer, d -> d), "
            "whose n steps run one after another inside one fused call.",
            "FLOPs: torch.utils.flop_counter on the attention; the recurrence's 4 n d^2 checked "
            "against the counter on an explicit loop of the same products: "
            + ", ".join(
                f"d = {d}: counted {c:,} vs formula {f:,}" for d, (c, f) in m["flop_check"].items()
            )
            + ".",
            f"Wall time: best of {m['repeats']} calls after {m['warmup']} warm-up call(s), in "
            f"{len(m['rounds'])} rounds (each with its own seed); other processes may share "
            "the CPU (the load average is recorded below).",
            "Timings and counts only: no trained arms are compared, so there is no competence "
            "gate.",
            (
                f"GPU: {m['gpu']}: the same forward calls on the same inputs timed there too, "
                "each between two torch.cuda.synchronize() calls."
                if m["gpu"]
                else CPU_ONLY
            ),
        ],
        thresholds=THRESHOLDS + (GPU_THRESHOLDS if m["gpu"] else []),
        tables=[
            Table("cost per layer against n", cost_rows(m)),
            *([Table("cost per layer against n, GPU", cost_rows(m, "ms_gpu"))] if m["gpu"] else []),
        ],
        figures=charts(m, out_dir),
        **gated_fields(word, reason, [], m["rounds"], quick, arms=[]),
        per_seed={
            "crossover_ms": {str(d): v for d, v in cross_ms.items()},
            **({"crossover_ms_gpu": {str(d): v for d, v in gpu_cross.items()}} if m["gpu"] else {}),
        },
        metrics={
            "crossover_flops": {str(d): c for d, c in cross_flops.items()},
            "crossover_ms": {str(d): spread(v) for d, v in cross_ms.items()},
            **(
                {"crossover_ms_gpu": {str(d): spread(v) for d, v in gpu_cross.items()}}
                if m["gpu"]
                else {}
            ),
            "flop_check": {str(d): list(v) for d, v in m["flop_check"].items()},
            "ns": m["ns"],
            "gpu": m["gpu"],
        },
        findings=[
            "Sequential operations: the attention core is three calls whatever n is (its n^2 "
            "scores are independent of each other); the recurrence's n steps each wait for the "
            "previous h, so its time grows with n even where its FLOPs are small.",
            "A full attention layer also has the projections W^Q, W^K, W^V, W^O (8 n d^2 "
            "FLOPs), the same order as the recurrence itself; Table 1 compares the token-mixing "
            "parts only.",
            *([gpu_finding(m, gpu_cross, cross_ms)] if m["gpu"] else []),
        ],
        quick=quick,
        seed=m["rounds"][0],
    )


@experiment("complexity", notes="004 'Complexity figures'; Vaswani et al. 2017 Table 1")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Per layer, self-attention costs O(n^2 d) with O(1) sequential steps and a recurrent
    layer O(n d^2) with O(n) sequential steps, so self-attention is cheaper when n < d."""
    return write_up(measure(quick, seed, data), out_dir, quick)
