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
  order as the recurrence: Table 1 counts only the attention itself (shown for completeness).

Shapes: B = 1, n length, d width.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from attnlab.lab.kit.charts import line_chart, save_chart, seeds_chart
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Report, Table, outcome, spread, spread_text
from attnlab.lab.kit.seeds import start_seeds
from attnlab.nn.attention import scaled_dot_product_attention


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) V for one head: (1, 1, n, d) each -> (1, 1, n, d)."""
    return scaled_dot_product_attention(q, k, v, need_weights=True).out  # explicit path


def recurrence_loop(x: torch.Tensor, rnn: nn.RNN) -> torch.Tensor:
    """h_t = tanh(U x_t + b_U + W h_{t-1} + b_W), t = 1..n, as explicit products: (1, n, d)."""
    h = torch.zeros(1, rnn.hidden_size)
    out = []
    for t in range(x.size(1)):
        h = torch.tanh(
            x[:, t] @ rnn.weight_ih_l0.T + rnn.bias_ih_l0 + h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0
        )
        out.append(h)
    return torch.stack(out, dim=1)


def counted_flops(fn, *args) -> int:
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def best_ms(fn, *args, repeats: int) -> float:
    fn(*args)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(1000 * (time.perf_counter() - start))
    return min(times)


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


@experiment("complexity", notes="004 'Complexity figures'; Vaswani et al. 2017 Table 1")
@torch.no_grad()
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Per layer, self-attention costs O(n^2 d) with O(1) sequential steps and a recurrent
    layer O(n d^2) with O(n) sequential steps, so self-attention is cheaper when n < d."""
    rounds = start_seeds(seed, quick)  # each round re-measures everything
    widths = (32,) if quick else (64, 256)
    ns = [8, 16, 32, 64] if quick else [16, 32, 64, 128, 256, 512, 1024, 2048]
    repeats = 2 if quick else 5
    flops, ms = {}, {}  # (arm, d) -> per n; ms: (arm, d) -> per round, per n
    check = {}
    for d in widths:
        rnn = nn.RNN(d, d, batch_first=True)
        for n in ns:
            q, k, v = (torch.randn(1, 1, n, d) for _ in range(3))
            flops.setdefault(("self-attention", d), []).append(
                counted_flops(attention_core, q, k, v)
            )
            flops.setdefault(("recurrent", d), []).append(4 * n * d * d)
            flops.setdefault(("projections", d), []).append(8 * n * d * d)
        x = torch.randn(1, ns[0], d)
        check[d] = (counted_flops(recurrence_loop, x, rnn), 4 * ns[0] * d * d)
    for r in rounds:
        torch.manual_seed(r)
        for d in widths:
            rnn = nn.RNN(d, d, batch_first=True)
            for n in ns:
                q, k, v = (torch.randn(1, 1, n, d) for _ in range(3))
                x = torch.randn(1, n, d)
                ms.setdefault(("self-attention", d), {}).setdefault(r, []).append(
                    best_ms(attention_core, q, k, v, repeats=repeats)
                )
                ms.setdefault(("recurrent", d), {}).setdefault(r, []).append(
                    best_ms(rnn, x, repeats=repeats)
                )
    rows, cross_flops, cross_ms = [], {}, {}
    for d in widths:
        cross_flops[d] = crossover(ns, flops[("self-attention", d)], flops[("recurrent", d)])
        cross_ms[d] = [
            crossover(ns, ms[("self-attention", d)][r], ms[("recurrent", d)][r]) for r in rounds
        ]
        for j, n in enumerate(ns):
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
    near = {d: all(d / 4 <= c <= 4 * d for c in cross_ms[d]) for d in widths}
    flop_exact = all(abs(cross_flops[d] / d - 1) < 0.05 for d in widths)
    checks = [flop_exact, *near.values()]
    reason = (
        "counted FLOPs cross at n = "
        + ", ".join(f"{cross_flops[d]:.0f} for d = {d}" for d in widths)
        + " (predicted n = d); measured wall time (forward, B = 1, one thread; attention core vs "
        "torch.nn.RNN's fused kernel) crosses at n = "
        + ", ".join(f"{spread_text(cross_ms[d])} for d = {d}" for d in widths)
        + f" (mean (min-max) over {len(rounds)} rounds); 'near' = within a factor 4 of d: "
        + ", ".join(f"d = {d} {'yes' if near[d] else 'no'}" for d in widths)
        + "."
    )
    figures = []
    for d in widths:
        names = {"self-attention": "self-attention core", "recurrent": "recurrent (nn.RNN)"}
        fig = seeds_chart(
            {names[arm]: (ns, [ms[(arm, d)][r] for r in rounds]) for arm in names},
            xlabel="sequence length n",
            ylabel="ms per forward pass",
            title=f"one layer, d = {d}, B = 1, 1 thread",
            logx=True,
            logy=True,
            vline=d,
        )
        figures.append(
            save_chart(
                fig,
                out_dir,
                f"time_d{d}.png",
                f"Forward time of the "
                f"attention core and of the recurrence at d = {d} (mean over "
                "rounds, min-max band); the dashed line is n = d, the "
                "predicted crossover.",
            )
        )
    fig = line_chart(
        {
            f"{arm}, d = {d}": (ns, flops[(arm, d)])
            for d in widths
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
            "FLOPs per layer against n: the "
            "attention line (slope 2) crosses the recurrent one (slope 1) at "
            "n = d.",
        )
    )
    return Report(
        name="complexity",
        title="The cost table: self-attention O(n^2 d) vs recurrence O(n d^2)",
        claim="For self-attention, since Q = K, then the time complexity [...] figures are "
        "O(N^2 d_q + N^2 d_v) (004). -- Self-attention layers are faster than recurrent layers "
        "when the sequence length n is smaller than the representation dimensionality d "
        "(Vaswani et al. 2017, Sec. 4 and Table 1: recurrent O(n d^2) per layer, O(n) "
        "sequential operations).",
        source="004, 'Complexity figures'; Vaswani et al. 2017, Table 1 and Sec. 4",
        setup=[
            f"d in {list(widths)}, n in {ns}, batch 1, forward only, float32, one torch thread.",
            "Self-attention: one head of attnlab.nn.scaled_dot_product_attention (Q K^T, "
            "softmax, A V) on random q, k, v; recurrent: torch.nn.RNN (tanh, one layer, d -> d), "
            "whose n steps run one after another inside one fused call.",
            "FLOPs: torch.utils.flop_counter on the attention; the recurrence's 4 n d^2 checked "
            "against the counter on an explicit loop of the same products: "
            + ", ".join(f"d = {d}: counted {c:,} vs formula {f:,}" for d, (c, f) in check.items())
            + ".",
            f"Wall time: best of {repeats} calls after one warm-up, in {len(rounds)} rounds; other "
            "processes share the CPU (the load average is recorded below).",
        ],
        tables=[Table("cost per layer against n", rows)],
        figures=figures,
        **outcome(checks, reason, [], rounds, quick),
        per_seed={"crossover_ms": {str(d): v for d, v in cross_ms.items()}},
        metrics={
            "crossover_flops": {str(d): c for d, c in cross_flops.items()},
            "crossover_ms": {str(d): spread(v) for d, v in cross_ms.items()},
            "flop_check": {str(d): list(v) for d, v in check.items()},
            "ns": ns,
        },
        findings=[
            "Sequential operations: the attention core is three calls whatever n is (its n^2 "
            "scores are independent of each other); the recurrence's n steps each wait for the "
            "previous h, so its time grows with n even where its FLOPs are small.",
            "A full attention layer also has the projections W^Q, W^K, W^V, W^O (8 n d^2 "
            "FLOPs), the same order as the recurrence itself; Table 1 compares the token-mixing "
            "parts only.",
        ],
    )
