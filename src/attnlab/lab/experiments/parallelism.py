"""Experiment ``parallelism``: the RNN's serial dependency vs the Transformer's parallel
attention (000 "Parallelization issues with dependence on the sequence index").

000: "we can't compute h_2 until we know the value of h_1 [...] As the sequence gets longer, there
is only so much we can parallelize the computation of the network [...] because of the number of
serial dependencies." The recurrence h_t = sigma(W h_{t-1} + U x_t) is a loop of T small
(B, D) x (D, D) products; a Transformer layer does the same positions as a few large matmuls.

Measured: one training step (forward, backward, AdamW update) of an RNN LM (000's Elman
recurrence, both on ``torch.nn.RNN``'s fused kernel -- the serial baseline at its fastest -- and
as attnlab's ``kind="rnn_lm"``, a loop over t) and of a decoder-only Transformer LM with about
the same number of parameters, on random tokens, as the sequence length T grows, for one
sequence (B = 1: only the positions can run in parallel) and a batch: the best time per step,
tokens per second, least-squares slopes of ms/step against T, and the speed-up from 1 to 2
intra-op threads at every length, in three rounds for the spread. Timing on a shared machine is
noisy; the load average is recorded.

Shapes: B batch, T length, D d_model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.lab.kit.charts import save_chart, seeds_chart
from attnlab.lab.kit.fit import lm_loss
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Report, Table, outcome, spread, spread_text
from attnlab.lab.kit.seeds import bands, seed_list
from attnlab.models import build_model
from attnlab.runtime import load_average

VOCAB = 64
FUSED, LOOP, TF = "RNN LM, torch.nn.RNN (fused)", "RNN LM, attnlab (loop over t)", "Transformer LM"
D_RNN = 208  # about the Transformer's parameter count
MODELS = {
    FUSED: dict(d_model=D_RNN),
    LOOP: dict(kind="rnn_lm", d_model=D_RNN, n_layers=1),
    TF: dict(kind="decoder_lm", d_model=64, n_heads=4, n_layers=2, d_ff=256,
             positional="sinusoidal"),
}  # fmt: skip


class _Logits(NamedTuple):
    logits: torch.Tensor


class FusedRNNLM(nn.Module):
    """000's Elman LM h_t = tanh(W h_{t-1} + U x_t + b), y_t = softmax(V h_t), with the recurrence
    in ``torch.nn.RNN``'s fused kernel (the serial baseline at its fastest: one C++ loop over t,
    no Python per step). ids (B, T) -> logits (B, T, V)."""

    def __init__(self, vocab: int, d_model: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.rnn = nn.RNN(d_model, d_model, batch_first=True)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> _Logits:
        h, _ = self.rnn(self.embed(ids))  # (B, T, D)
        return _Logits(self.head(h))


def make_model(name: str, t: int) -> nn.Module:
    if name == FUSED:
        return FusedRNNLM(VOCAB, D_RNN)
    return build_model(ModelConfig(vocab_size=VOCAB, max_len=max(t + 1, 16), **MODELS[name]))


def step_ms(name: str, t: int, batch: int, repeats: int, seed: int) -> float:
    """Best (minimum) wall time in ms of one forward + backward + AdamW step at length ``t``."""
    torch.manual_seed(seed)
    model = make_model(name, t)
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
    return sum(p.numel() for p in make_model(name, 16).parameters())


@experiment(
    "parallelism",
    notes="000 'Parallelization issues with dependence on the sequence index'",
)
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """An RNN's serial dependency makes its training step time grow linearly with the sequence
    length and gain little from parallel hardware, while a Transformer processes all positions
    at once."""
    lengths = (8, 16, 32) if quick else (32, 64, 128, 256, 512)
    batches = (1, 2) if quick else (1, 16)
    threads = (1, 2)
    repeats = 1 if quick else 5
    rounds = seed_list(seed, quick)  # each round re-measures everything (its own seed)
    load = ", ".join(f"{x:.2f}" for x in load_average() or []) or "unknown"
    ms: dict[tuple, list[float]] = {}  # (name, B, threads, T) -> one best-of per round
    try:
        for r in rounds:
            for n_threads in threads:  # interleaved, so both thread counts see the same load
                torch.set_num_threads(n_threads)
                for b in batches:
                    for t in lengths:
                        for name in MODELS:
                            value = step_ms(name, t, b, repeats, r)
                            ms.setdefault((name, b, n_threads, t), []).append(value)
    finally:
        torch.set_num_threads(1)
    rows = []
    for (name, b, th, t), v in ms.items():
        if th == 1:
            rows.append(
                {
                    "model": name,
                    "B": b,
                    "T": t,
                    "ms / step (1 thread)": spread(v)["mean"],
                    "min-max over rounds": f"{min(v):.3g}-{max(v):.3g}",
                    "tokens / s": b * t / (spread(v)["mean"] / 1000),
                    "us / token": 1000 * spread(v)["mean"] / (b * t),
                }
            )
    tps = {}  # (name, B, threads) -> per round tokens/s at shortest and longest T
    fit_rows = []
    for name in MODELS:
        for b in batches:
            for th in threads:
                per_round = [[ms[(name, b, th, t)][i] for t in lengths] for i in range(len(rounds))]
                short = [b * lengths[0] / v[0] * 1000 for v in per_round]
                long = [b * lengths[-1] / v[-1] * 1000 for v in per_round]
                tps[(name, b, th)] = (short, long)
                if th == 1:
                    mean = bands(per_round)[0]
                    fit_rows.append(
                        {
                            "model": name,
                            "B": b,
                            "parameters": n_params(name),
                            "ms per extra position (slope)": float(np.polyfit(lengths, mean, 1)[0]),
                            "tokens/s at shortest T": spread_text(short),
                            "tokens/s at longest T": spread_text(long),
                            "step-time growth": mean[-1] / mean[0],
                            "length ratio": lengths[-1] / lengths[0],
                        }
                    )
    speedup = {}  # (name, B, T) -> per round 1-thread / 2-thread
    thread_rows = []
    for name in MODELS:
        for b in batches:
            for t in lengths:
                one, two = ms[(name, b, 1, t)], ms[(name, b, 2, t)]
                speedup[(name, b, t)] = [x / y for x, y in zip(one, two)]
                gain = spread_text(speedup[(name, b, t)])
                thread_rows.append({"model": name, "B": b, "T": t, "speed-up, 2 threads": gain})
    figures = _figures(out_dir, ms, lengths, batches, rounds, speedup)
    b1, big, t_max = batches[0], batches[-1], lengths[-1]
    rnn_long, tf_long = tps[(FUSED, b1, 1)][1], tps[(TF, b1, 1)][1]
    checks = {
        "Transformer above the fused RNN at B = 1, longest T (outside the spread)": min(tf_long)
        > max(rnn_long),
        "fused RNN throughput flat in T at B = 1 (<= 1.1x)": np.mean(rnn_long)
        <= 1.1 * np.mean(tps[(FUSED, b1, 1)][0]),
        "Transformer throughput grows with T at B = 1 (> 1.1x)": np.mean(tf_long)
        > 1.1 * np.mean(tps[(TF, b1, 1)][0]),
        "a second thread helps the Transformer more than the fused RNN (B = 1, longest T, "
        "outside the spread)": min(speedup[(TF, b1, t_max)]) > max(speedup[(FUSED, b1, t_max)]),
    }
    reason = (
        f"B = 1, T {lengths[0]} -> {t_max}, 1 thread, tokens/s (mean (min-max) over "
        f"{len(rounds)} rounds): fused RNN {spread_text(tps[(FUSED, b1, 1)][0])} -> "
        f"{spread_text(rnn_long)}, Transformer {spread_text(tps[(TF, b1, 1)][0])} -> "
        f"{spread_text(tf_long)} (attnlab's Python-loop RNN {spread_text(tps[(LOOP, b1, 1)][1])} "
        f"at T = {t_max}); at B = {big}, T = {t_max}: fused RNN "
        f"{spread_text(tps[(FUSED, big, 1)][1])} vs Transformer {spread_text(tps[(TF, big, 1)][1])}"
        f"; a second thread at B = {b1}, T = {t_max}: fused RNN "
        f"{spread_text(speedup[(FUSED, b1, t_max)])}x, Transformer "
        f"{spread_text(speedup[(TF, b1, t_max)])}x. Checks: "
        + "; ".join(f"{k}: {'yes' if v else 'no'}" for k, v in checks.items())
        + "."
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
            f"Serial baseline: an Elman RNN LM on torch.nn.RNN's fused kernel (d {D_RNN}); also "
            f"attnlab's own RNN LM ({MODELS[LOOP]}), whose Python loop over t adds per-step "
            f"overhead; Transformer LM: {MODELS[TF]}; vocabulary {VOCAB}; parameters "
            + ", ".join(f"{n} {n_params(n):,}" for n in MODELS)
            + ".",
            f"One step = forward + backward + AdamW update on random tokens, B = "
            f"{' and '.join(map(str, batches))}, T = {list(lengths)}, 1 and 2 intra-op threads; "
            f"best of {repeats} steps after 2 warm-up steps, measured in {len(rounds)} rounds "
            "(each a full sweep with its own seed, thread counts interleaved); tables give the "
            "mean over rounds with the min-max.",
            f"Load average when the run started: {load} (other processes share the 2 cores; "
            "timings are indicative, the thread sweep most of all).",
        ],
        tables=[
            Table("training-step time against sequence length", rows),
            Table("growth with T", fit_rows),
            Table("intra-op threads: speed-up of 2 threads over 1", thread_rows),
        ],
        figures=figures,
        **outcome(list(checks.values()), reason, [], rounds, quick),
        per_seed={"ms": {f"{n}, B={b}, threads={th}, T={t}": v for (n, b, th, t), v in ms.items()}},
        metrics={
            "ms": {
                f"{n}, B={b}, threads={th}": [spread(ms[(n, b, th, t)])["mean"] for t in lengths]
                for n in MODELS
                for b in batches
                for th in threads
            },
            "speedup": {f"{n}, B={b}, T={t}": v for (n, b, t), v in speedup.items()},
            "lengths": list(lengths),
        },
        findings=[
            "Per step an RNN does T dependent (B, D) x (D, D) products forward and again "
            "backward; the fused kernel removes Python's per-step cost but not the dependency. "
            "The Transformer does each layer's work for all T positions in a few large "
            "products, so with a single sequence it still has T rows to spread over the "
            "hardware.",
            "This CPU has 2 cores shared with other processes, so there is little parallel "
            "hardware to win; a GPU's thousands of lanes would widen the gap (not measured).",
        ],
    )


def _figures(out_dir, ms, lengths, batches, rounds, speedup) -> list:
    b1, runs = batches[0], range(len(rounds))
    step_ms = {
        f"{name}, B = {b}": (lengths, [[ms[(name, b, 1, t)][i] for t in lengths] for i in runs])
        for name in MODELS
        for b in batches
    }
    step = seeds_chart(
        step_ms,
        xlabel="sequence length T",
        ylabel="ms per training step",
        title="training step (1 thread)",
        logx=True,
        logy=True,
    )
    tput = seeds_chart(
        {
            k: (
                xs,
                [[float(k.split("B = ")[1]) * t / v * 1000 for t, v in zip(xs, run)] for run in ys],
            )
            for k, (xs, ys) in step_ms.items()
        },
        xlabel="sequence length T",
        ylabel="tokens per second",
        title="throughput (1 thread)",
        logx=True,
    )
    threads = seeds_chart(
        {
            f"{name}, B = {b1}": (
                lengths,
                [[speedup[(name, b1, t)][i] for t in lengths] for i in runs],
            )
            for name in MODELS
        },
        xlabel="sequence length T",
        ylabel="speed-up, 2 threads / 1",
        title="a second thread",
        logx=True,
        hline=1.0,
    )
    return [
        save_chart(
            step,
            out_dir,
            "step_time.png",
            "Training-step time against T (log-log; "
            "slope 1 = linear growth), mean over rounds with the min-max band.",
        ),
        save_chart(
            tput,
            out_dir,
            "throughput.png",
            "Tokens per second against T (mean over rounds, "
            "min-max band). With one sequence (B = 1) only the positions can run in parallel.",
        ),
        save_chart(
            threads,
            out_dir,
            "threads.png",
            "Speed-up of 2 intra-op threads over 1 at "
            "B = 1 (mean over rounds, min-max band); 1 = no gain.",
        ),
    ]
