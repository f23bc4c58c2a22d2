"""Experiment ``parallelism``: the RNN's serial dependency vs the Transformer's parallel
attention (000 "Parallelization issues with dependence on the sequence index").

000: "we can't compute h_2 until we know the value of h_1 [...] As the sequence gets longer, there
is only so much we can parallelize the computation of the network [...] because of the number of
serial dependencies." The recurrence h_t = sigma(W h_{t-1} + U x_t) is a loop of T small
(B, D) x (D, D) products; a Transformer layer does the same positions as a few large matmuls.

Measured: one training step (forward, backward, AdamW update) of the RNN LM (``kind="rnn_lm"``,
000's Elman recurrence) and of a decoder-only Transformer LM with about the same number of
parameters, on random tokens, as the sequence length T grows; the median time per step, tokens
per second, least-squares slopes of ms/step against T, and the speed-up from 1 to 2 intra-op
threads at one length. Timing on a shared machine is noisy; the load average is recorded.

Shapes: B batch, T length, D d_model.
"""

from __future__ import annotations

import os
import statistics
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
    """Median wall time (ms) of one forward + backward + AdamW step at length ``t``."""
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
    return statistics.median(times)


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
    batch, repeats = (2, 1) if quick else (16, 7)
    load = _load()
    torch.set_num_threads(1)
    rows, ms = [], {name: [] for name in MODELS}
    for t in lengths:
        for name in MODELS:
            value = step_ms(name, t, batch, repeats, seed)
            ms[name].append(value)
            rows.append({"model": name, "T": t, "ms / step (1 thread)": value,
                         "tokens / s": batch * t / (value / 1000),
                         "us / token": 1000 * value / (batch * t)})  # fmt: skip
    t_mid = lengths[len(lengths) // 2 + (0 if quick else 1)]
    thread_rows = []
    for name in MODELS:
        one = ms[name][lengths.index(t_mid)]
        torch.set_num_threads(2)
        two = step_ms(name, t_mid, batch, repeats, seed)
        torch.set_num_threads(1)
        thread_rows.append({"model": name, "T": t_mid, "ms / step, 1 thread": one,
                            "ms / step, 2 threads": two, "speed-up": one / two})  # fmt: skip
    slopes = {name: float(np.polyfit(lengths, ms[name], 1)[0]) for name in MODELS}
    fit_rows = [{"model": name, "parameters": n_params(name), "ms per extra position (slope)":
                 slopes[name], "ms at shortest T": ms[name][0], "ms at longest T": ms[name][-1],
                 "growth longest/shortest": ms[name][-1] / ms[name][0],
                 "length ratio": lengths[-1] / lengths[0]} for name in MODELS]  # fmt: skip
    figures = [
        save_chart(line_chart({n: (lengths, ms[n]) for n in MODELS}, xlabel="sequence length T",
                              ylabel="ms per training step", title=f"training step, B = {batch}",
                              logx=True, logy=True), out_dir, "step_time.png",
                   "Training-step time against T (log-log; slope 1 = linear growth)."),
        save_chart(line_chart({n: (lengths, [r["us / token"] for r in rows if r["model"] == n])
                               for n in MODELS}, xlabel="sequence length T",
                              ylabel="microseconds per token", title="cost per token",
                              logx=True), out_dir, "per_token.png",
                   "Time per token against T: flat = the step time is linear in T."),
    ]  # fmt: skip
    rnn, tf = "RNN LM (000)", "Transformer LM"
    speed = {r["model"]: r["speed-up"] for r in thread_rows}
    rnn_growth = fit_rows[0]["growth longest/shortest"]
    tf_growth = fit_rows[1]["growth longest/shortest"]
    checks = [ms[rnn][-1] > ms[tf][-1], speed[rnn] < speed[tf], rnn_growth > tf_growth]
    verdict = "held" if all(checks) else ("did not hold" if not any(checks) else "mixed")
    reason = (
        f"from T = {lengths[0]} to {lengths[-1]} the RNN's step time grows {rnn_growth:.1f}x "
        f"({ms[rnn][0]:.1f} to {ms[rnn][-1]:.1f} ms) and the Transformer's {tf_growth:.1f}x "
        f"({ms[tf][0]:.1f} to {ms[tf][-1]:.1f} ms); a second thread speeds the RNN up "
        f"{speed[rnn]:.2f}x and the Transformer {speed[tf]:.2f}x at T = {t_mid}."
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
            f"parameters {fit_rows[0]['parameters']:,} vs {fit_rows[1]['parameters']:,}.",
            f"One step = forward + backward + AdamW update on random tokens, B = {batch}; median "
            f"of {repeats} steps after 2 warm-up steps; 1 torch thread unless stated.",
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
        metrics={"ms": ms, "slopes": slopes, "speedup": speed, "lengths": list(lengths)},
        findings=[
            "This CPU has 2 cores, so the Transformer's advantage here comes mostly from doing "
            "the T positions as a few large kernels instead of T small ones; a GPU's thousands "
            "of lanes would widen the gap (not measured here).",
        ],
    )


def _load() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "unknown"
