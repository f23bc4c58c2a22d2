"""Experiment ``parallelism``: the RNN's serial dependency vs the Transformer's parallel
attention (000 "Parallelization issues with dependence on the sequence index").

000: "we can't compute h_2 until we know the value of h_1 [...] As the sequence gets longer, there
is only so much we can parallelize the computation of the network [...] because of the number of
serial dependencies." The recurrence h_t = sigma(W h_{t-1} + U x_t) is a loop of T small
(B, D) x (D, D) products; a Transformer layer does the same positions as a few large matmuls.

Measured: one training step (forward, backward, AdamW update) of the RNN LM (``kind="rnn_lm"``,
000's Elman recurrence) and of a decoder-only Transformer LM with about the same number of
parameters, on random tokens, as the sequence length T grows, for one sequence (B = 1: only the
positions can run in parallel) and a batch: the best time per step, tokens per second,
least-squares slopes of ms/step against T, and the speed-up from 1 to 2 intra-op threads at one
length. Timing on a shared machine is noisy; the load average is recorded.

Shapes: B batch, T length, D d_model.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch

from attnlab.config import ModelConfig
from attnlab.lab.charts import line_chart, save_chart
from attnlab.lab.fit import lm_loss
from attnlab.lab.registry import experiment
from attnlab.lab.report import Report, Table
from attnlab.models import build_model

VOCAB = 64
MODELS = {
    "RNN LM (000)": dict(kind="rnn_lm", d_model=208, n_layers=1),
    "Transformer LM": dict(kind="decoder_lm", d_model=64, n_heads=4, n_layers=2, d_ff=256,
                           positional="sinusoidal"),
}  # fmt: skip


def step_ms(name: str, t: int, batch: int, repeats: int, seed: int) -> float:
    """Best (minimum) wall time in ms of one forward + backward + AdamW step at length ``t``."""
    torch.manual_seed(seed)
    model = build_model(ModelConfig(vocab_size=VOCAB, max_len=max(t + 1, 16), **MODELS[name]))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, VOCAB, (batch, t + 1))
    times = []
    for i in range(repeats + 2):
        start = time.perf_counter()
        loss = lm_loss(model, (ids,))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= 2:  # two warm-up steps
            times.append(1000 * (time.perf_counter() - start))
    return min(times)


def n_params(name: str) -> int:
    model = build_model(ModelConfig(vocab_size=VOCAB, max_len=16, **MODELS[name]))
    return sum(p.numel() for p in model.parameters())


@experiment(
    "parallelism",
    claim="An RNN's serial dependency makes its training step time grow linearly with the "
    "sequence length and gain little from parallel hardware, while a Transformer processes "
    "all positions at once.",
    notes="000 'Parallelization issues with dependence on the sequence index'",
)
def run(quick: bool, out_dir: Path, seed: int) -> Report:
    lengths = (8, 16, 32) if quick else (32, 64, 128, 256, 512)
    batches = (1, 2) if quick else (1, 16)
    repeats = 1 if quick else 7
    load = _load()
    torch.set_num_threads(1)
    rows, ms = [], {}
    for b in batches:
        for t in lengths:
            for name in MODELS:
                value = step_ms(name, t, b, repeats, seed)
                ms.setdefault((name, b), []).append(value)
                rows.append({"model": name, "B": b, "T": t, "ms / step (1 thread)": value,
                             "tokens / s": b * t / (value / 1000),
                             "us / token": 1000 * value / (b * t)})  # fmt: skip
    big = batches[-1]
    t_mid = lengths[len(lengths) // 2 + (0 if quick else 1)]
    # Threads split each operator's work, so they test the claim best with one sequence (B = 1):
    # the RNN then has only a (1, D) x (D, D) product per time step to split, the Transformer T
    # rows. The 1-thread time is re-measured next to the 2-thread one, so both see the same load.
    thread_rows, b_one = [], batches[0]
    for name in MODELS:
        one = step_ms(name, t_mid, b_one, repeats, seed)
        torch.set_num_threads(2)
        two = step_ms(name, t_mid, b_one, repeats, seed)
        torch.set_num_threads(1)
        thread_rows.append({"model": name, "B": b_one, "T": t_mid, "ms / step, 1 thread": one,
                            "ms / step, 2 threads": two, "speed-up": one / two})  # fmt: skip
    fit_rows = []
    for (name, b), values in ms.items():
        fit_rows.append({"model": name, "B": b, "parameters": n_params(name),
                         "ms per extra position (slope)": float(np.polyfit(lengths, values, 1)[0]),
                         "tokens/s at shortest T": b * lengths[0] / values[0] * 1000,
                         "tokens/s at longest T": b * lengths[-1] / values[-1] * 1000,
                         "step-time growth": values[-1] / values[0],
                         "length ratio": lengths[-1] / lengths[0]})  # fmt: skip
    figures = [
        save_chart(line_chart({f"{n}, B = {b}": (lengths, ms[(n, b)]) for n, b in ms},
                              xlabel="sequence length T", ylabel="ms per training step",
                              title="training step (1 thread)", logx=True, logy=True),
                   out_dir, "step_time.png",
                   "Training-step time against T (log-log; slope 1 = linear growth)."),
        save_chart(line_chart({f"{n}, B = {b}": (lengths, [b * t / v * 1000 for t, v in
                                                         zip(lengths, ms[(n, b)])])
                               for n, b in ms}, xlabel="sequence length T",
                              ylabel="tokens per second", title="throughput (1 thread)",
                              logx=True), out_dir, "throughput.png",
                   "Tokens per second against T. With one sequence (B = 1) only the positions "
                   "can be processed in parallel."),
    ]  # fmt: skip
    rnn, tf = "RNN LM (000)", "Transformer LM"
    tps = {(r["model"], r["B"]): r for r in fit_rows}
    speed = {r["model"]: r["speed-up"] for r in thread_rows}
    one_rnn, one_tf = tps[(rnn, 1)], tps[(tf, 1)]
    checks = [
        one_tf["tokens/s at longest T"] > 1.2 * one_rnn["tokens/s at longest T"],
        one_rnn["tokens/s at longest T"] <= 1.1 * one_rnn["tokens/s at shortest T"],
        one_tf["tokens/s at longest T"] > 1.1 * one_tf["tokens/s at shortest T"],
    ]
    threads_conclusive = max(speed.values()) > 1.0  # both slower: the other core was busy
    if threads_conclusive:
        checks.append(speed[rnn] < speed[tf])
    verdict = "held" if all(checks) else ("did not hold" if not any(checks) else "mixed")
    reason = (
        f"with one sequence (B = 1) the RNN's throughput goes from "
        f"{one_rnn['tokens/s at shortest T']:,.0f} to {one_rnn['tokens/s at longest T']:,.0f} "
        f"tokens/s as T grows {lengths[0]} -> {lengths[-1]} (its step time grows "
        f"{one_rnn['step-time growth']:.1f}x for {lengths[-1] // lengths[0]}x the length) while "
        f"the Transformer's goes from {one_tf['tokens/s at shortest T']:,.0f} to "
        f"{one_tf['tokens/s at longest T']:,.0f}; at B = {big} they are "
        f"{tps[(rnn, big)]['tokens/s at longest T']:,.0f} vs "
        f"{tps[(tf, big)]['tokens/s at longest T']:,.0f} at T = {lengths[-1]}; a second thread "
        f"gives {speed[rnn]:.2f}x (RNN) and {speed[tf]:.2f}x (Transformer) at B = {b_one}, "
        f"T = {t_mid}"
        + (
            "."
            if threads_conclusive
            else " (inconclusive: both slowed down, the machine was "
            "busy; not counted in the verdict)."
        )
    )
    findings = [
        "Per step the RNN does T dependent (B, D) x (D, D) products forward and again backward; "
        "the Transformer does each layer's work for all T positions in a few large products, so "
        "with a single sequence it still has T rows to spread over the hardware.",
        "This CPU has 2 cores, so there is little parallel hardware to win; a GPU's thousands of "
        "lanes would widen the gap (not measured here).",
    ]
    if not threads_conclusive:
        findings.append(
            "A second thread made both models slower: the other core was busy (see the load "
            "average), and two spinning threads on one free core cost more than they give."
        )
    elif speed[rnn] < speed[tf]:
        findings.append(
            f"A second core speeds the Transformer's step up {speed[tf]:.2f}x and the RNN's "
            f"{speed[rnn]:.2f}x: each RNN time step is a product too small to split across "
            "threads, and the next step cannot start before it ends."
        )
    return Report(
        name="parallelism",
        title="Parallelism: the RNN's serial loop vs the Transformer's matmuls",
        claim="We can't compute h_2 until we know the value of h_1 [...] As the sequence gets "
        "longer, there is only so much we can parallelize the computation of the network on a "
        "GPU because of the number of serial dependencies.",
        source="000, 'Problems with RNN: Parallelization issues with dependence on the sequence "
        "index'",
        setup=[
            f"RNN LM: {MODELS[rnn]}; Transformer LM: {MODELS[tf]}; vocabulary {VOCAB}; "
            f"parameters {n_params(rnn):,} vs {n_params(tf):,}.",
            f"One step = forward + backward + AdamW update on random tokens, B = "
            f"{' and '.join(map(str, batches))}; best of {repeats} steps after 2 warm-up steps "
            "(the minimum is the least disturbed by other processes); 1 torch thread unless "
            "stated.",
            f"Load average when the run started: {load} (other processes share the 2 cores; "
            "timings are indicative).",
        ],
        tables=[
            Table("training-step time against sequence length", rows),
            Table("growth with T", fit_rows),
            Table("intra-op threads: 1 vs 2", thread_rows),
        ],
        figures=figures,
        verdict=verdict,
        verdict_reason=reason,
        metrics={
            "ms": {f"{n}, B={b}": v for (n, b), v in ms.items()},
            "speedup": speed,
            "lengths": list(lengths),
        },  # fmt: skip
        findings=findings,
    )


def _load() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "unknown"
