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
intra-op threads at every length, in three rounds for the spread. Where a GPU is present (the
note's claim is about one) the same steps are timed on it too, and its checks join the verdict;
without one the verdict says "CPU only". Timing on a shared machine is noisy; the load average is
recorded.

Shapes: B batch, T length, D d_model.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.lab.kit.charts import save_chart, seeds_chart
from attnlab.lab.kit.fit import lm_loss
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Report, Table, Threshold
from attnlab.lab.kit.seeds import bands, resolved, seed_list, spread, spread_text
from attnlab.lab.kit.timing import CPU, best_ms, device_name, find_gpu
from attnlab.lab.kit.verdict import gated_fields, verdict_of
from attnlab.models import build_model
from attnlab.runtime import load_average

VOCAB = 64
GPU = "gpu"  # in the threads slot of a timing's key: timed on the GPU (threads do not apply)
FUSED, LOOP, TF = "RNN LM, torch.nn.RNN (fused)", "RNN LM, attnlab (loop over t)", "Transformer LM"
D_RNN = 208  # about the Transformer's parameter count
WARMUP = 2  # untimed steps before the timed ones
MODELS: dict[str, dict[str, Any]] = {
    FUSED: dict(d_model=D_RNN),
    LOOP: dict(kind="rnn_lm", d_model=D_RNN, n_layers=1),
    TF: dict(kind="decoder_lm", d_model=64, n_heads=4, n_layers=2, d_ff=256,
             positional="sinusoidal"),
}  # fmt: skip
CLAIM = (
    "We can't compute h_2 until we know the value of h_1 [...] As the sequence gets longer, "
    "there is only so much we can parallelize the computation of the network on a GPU because "
    "of the number of serial dependencies."
)


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


def step_ms(
    name: str, t: int, batch: int, repeats: int, seed: int, device: torch.device = CPU
) -> float:
    """Best (minimum) wall time in ms of one forward + backward + AdamW step at length ``t``
    on ``device``, after WARMUP untimed steps."""
    torch.manual_seed(seed)
    model = make_model(name, t).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, VOCAB, (batch, t + 1)).to(device)

    def step() -> None:
        loss = lm_loss(model, (ids,))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return best_ms(step, device, repeats, warmup=WARMUP)


def n_params(name: str) -> int:
    return sum(p.numel() for p in make_model(name, 16).parameters())


COST = (
    "Full run: 3 rounds of best-of-5 step timings, 3 models x 2 batch sizes x 5 lengths x 2 "
    "thread counts. About 1 min on 2 idle cores; where a GPU is present "
    "the same sweep runs there too (well under a minute more). Command: attnlab experiment "
    "parallelism --seed 0"
)


def setting(th: int | str) -> str:
    """How a timing ran: ``1 thread``, ``2 threads`` or ``GPU``."""
    return "GPU" if th == GPU else f"{th} thread{'s' if th != 1 else ''}"


CPU_ONLY = (
    "CPU only: no GPU was used, and the note's claim is about a GPU. On this CPU the run can "
    "show the serial dependency itself (the RNN's step time grows with T at every batch size, "
    "a Transformer's throughput grows with T) and what a second core gives each model; it "
    "cannot show how wide the gap becomes on a GPU's thousands of lanes."
)
THRESHOLDS = [
    Threshold(
        "each check's difference (tokens/s, throughput growth, thread speed-up)",
        "in the predicted direction with the rounds' min-max ranges apart",
        "000 'Parallelization issues with dependence on the sequence index' (qualitative: no "
        "number in the note); ranges apart is the lab's rule for a resolved difference",
    )
]


def measure(
    quick: bool, seed: int, data: Path | None = None, gpu: torch.device | None = None
) -> dict:
    """Best-of step times ``ms[(model, B, threads, T)]``, one per round (each round re-measures
    everything with its own seed, thread counts interleaved so both see the same load), and
    ``ms[(model, B, GPU, T)]`` on ``gpu`` (default: the machine's GPU, if any), with the machine
    it ran on. ``data`` is unused (random tokens)."""
    gpu = gpu if gpu is not None else find_gpu()
    lengths = (8, 16, 32) if quick else (32, 64, 128, 256, 512)
    batches = (1, 2) if quick else (1, 16)
    threads = (1, 2)
    repeats = 1 if quick else 5
    rounds = seed_list(seed, quick)
    load = load_average()
    ms: dict[tuple, list[float]] = {}  # (name, B, threads, T) -> one best-of per round
    try:
        for r in rounds:
            for n_threads in threads:
                torch.set_num_threads(n_threads)
                for b in batches:
                    for t in lengths:
                        for name in MODELS:
                            value = step_ms(name, t, b, repeats, r)
                            ms.setdefault((name, b, n_threads, t), []).append(value)
            if gpu is not None:
                for b, t, name in itertools.product(batches, lengths, MODELS):
                    value = step_ms(name, t, b, repeats, r, gpu)
                    ms.setdefault((name, b, GPU, t), []).append(value)
    finally:
        torch.set_num_threads(1)
    return {
        "lengths": list(lengths),
        "batches": list(batches),
        "threads": list(threads),
        "repeats": repeats,
        "warmup": WARMUP,
        "rounds": rounds,
        "ms": ms,
        "params": {name: n_params(name) for name in MODELS},
        "load_at_start": list(load) if load else None,
        "logical_cores": os.cpu_count(),
        "gpu": device_name(gpu) if gpu is not None else None,  # the GPU timed, if any
    }


def tokens_per_s(m: dict, name: str, b: int, th: int | str, t: int) -> list[float]:
    """Per round tokens/s of one (model, B, threads, T)."""
    return [b * t / v * 1000 for v in m["ms"][(name, b, th, t)]]


def speedups(m: dict) -> dict[tuple, list[float]]:
    """(model, B, T) -> per round 1-thread time / 2-thread time."""
    return {
        (name, b, t): [x / y for x, y in zip(m["ms"][(name, b, 1, t)], m["ms"][(name, b, 2, t)])]
        for name in MODELS
        for b in m["batches"]
        for t in m["lengths"]
    }


def step_rows(m: dict, where: int | str = 1) -> list[dict]:
    """Step times, one row per (model, B, T), timed with ``where`` (1 thread, or GPU)."""
    rows = []
    for (name, b, th, t), v in m["ms"].items():
        if th == where:
            mean = spread(v)["mean"]
            rows.append(
                {
                    "model": name,
                    "B": b,
                    "T": t,
                    f"ms / step ({setting(where)})": mean,
                    "min-max over rounds": f"{min(v):.3g}-{max(v):.3g}",
                    "tokens / s": b * t / (mean / 1000),
                    "us / token": 1000 * mean / (b * t),
                }
            )
    return rows


def growth_rows(m: dict, where: int | str = 1) -> list[dict]:
    """How each model's step time and throughput change from the shortest T to the longest."""
    lengths, rounds, rows = m["lengths"], m["rounds"], []
    for name in MODELS:
        for b in m["batches"]:
            per_round = [
                [m["ms"][(name, b, where, t)][i] for t in lengths] for i in range(len(rounds))
            ]
            mean = bands(per_round)[0]
            rows.append(
                {
                    "model": name,
                    "B": b,
                    "parameters": m["params"][name],
                    "ms per extra position (slope)": float(np.polyfit(lengths, mean, 1)[0]),
                    "tokens/s at shortest T": spread_text(
                        tokens_per_s(m, name, b, where, lengths[0])
                    ),
                    "tokens/s at longest T": spread_text(
                        tokens_per_s(m, name, b, where, lengths[-1])
                    ),
                    "step-time growth": mean[-1] / mean[0],
                    "length ratio": lengths[-1] / lengths[0],
                }
            )
    return rows


def checks(m: dict) -> dict[str, tuple[list[float], list[float]]]:
    """The claim's checks, each (the side predicted higher, the other), per round: on the CPU
    with one thread, the gain from a second thread, and on the GPU where one was timed."""
    b1, short, long = m["batches"][0], m["lengths"][0], m["lengths"][-1]

    def growth(name: str, where: int | str) -> list[float]:
        a, z = tokens_per_s(m, name, b1, where, short), tokens_per_s(m, name, b1, where, long)
        return [y / x for x, y in zip(a, z)]

    def on(where: int | str, label: str) -> dict[str, tuple[list[float], list[float]]]:
        return {
            f"{label}: Transformer tokens/s above the fused RNN's at B = {b1}, T = {long}": (
                tokens_per_s(m, TF, b1, where, long),
                tokens_per_s(m, FUSED, b1, where, long),
            ),
            f"{label}: Transformer throughput at B = {b1} grows from T = {short} to {long}": (
                tokens_per_s(m, TF, b1, where, long),
                tokens_per_s(m, TF, b1, where, short),
            ),
            f"{label}: that growth (tokens/s at T = {long} over T = {short}) larger for the "
            "Transformer than for the fused RNN": (growth(TF, where), growth(FUSED, where)),
        }

    gain = speedups(m)
    found = on(1, "CPU, 1 thread")
    threads = "CPU: a second thread helps the Transformer more than the fused RNN"
    found[f"{threads} (B = {b1}, T = {long})"] = (gain[(TF, b1, long)], gain[(FUSED, b1, long)])
    if m["gpu"]:
        found.update(on(GPU, "GPU"))
    return found


def verdict(m: dict) -> tuple[str, str, dict[str, bool]]:
    """A check holds when its predicted side is higher with the ranges apart; "no effect
    resolved" when no check's difference is resolved; without a GPU the verdict says "CPU
    only"."""
    found = checks(m)
    held = {k: resolved(hi, lo) and min(hi) > max(lo) for k, (hi, lo) in found.items()}
    word = (
        "no effect resolved"
        if not any(resolved(hi, lo) for hi, lo in found.values())
        else verdict_of(list(held.values()))
    )
    b1, short, long, gain = m["batches"][0], m["lengths"][0], m["lengths"][-1], speedups(m)

    def tokens(where: int | str) -> str:
        return ", ".join(
            f"{label} {spread_text(tokens_per_s(m, name, b1, where, short))} -> "
            f"{spread_text(tokens_per_s(m, name, b1, where, long))}"
            for label, name in (("fused RNN", FUSED), ("Transformer", TF))
        )

    scope = (
        f"GPU: {m['gpu']}, and the CPU ({m['logical_cores']} logical cores)"
        if m["gpu"]
        else f"CPU only ({m['logical_cores']} logical cores, no GPU used; the claim is about a GPU)"
    )
    reason = (
        f"{scope}. B = {b1}, T {short} -> {long}, tokens/s (mean (min-max) over "
        f"{len(m['rounds'])} rounds), CPU with 1 thread: {tokens(1)}"
        + (f"; GPU: {tokens(GPU)}" if m["gpu"] else "")
        + f"; a second CPU thread: fused RNN {spread_text(gain[(FUSED, b1, long)])}x, "
        f"Transformer {spread_text(gain[(TF, b1, long)])}x. Checks (resolved = ranges apart): "
        + "; ".join(f"{k}: {'yes' if v else 'no'}" for k, v in held.items())
        + "."
    )
    return word, reason, held


def gpu_finding(m: dict) -> str:
    """What the GPU timing shows at B = 1 and the longest T (measured, not assumed)."""
    b1, long = m["batches"][0], m["lengths"][-1]
    tf, rnn = tokens_per_s(m, TF, b1, GPU, long), tokens_per_s(m, FUSED, b1, GPU, long)
    cpu_tf, cpu_rnn = tokens_per_s(m, TF, b1, 1, long), tokens_per_s(m, FUSED, b1, 1, long)
    ratio = spread(tf)["mean"] / spread(rnn)["mean"]
    cpu_ratio = spread(cpu_tf)["mean"] / spread(cpu_rnn)["mean"]
    return (
        f"On the GPU ({m['gpu']}), at B = {b1} and T = {long}, the Transformer trains "
        f"{ratio:.3g}x as many tokens per second as the fused RNN (on one CPU thread: "
        f"{cpu_ratio:.3g}x): "
        + (
            f"the GPU widens the Transformer's lead, its lanes taking the {long} positions at "
            f"once while the RNN's {long} dependent steps still run one after another."
            if ratio > cpu_ratio
            else "the GPU does not widen the Transformer's lead in this run."
        )
    )


def write_up(measured: dict, out_dir: Path, quick: bool) -> Report:
    """Tables, figures and the verdict from :func:`measure`'s timings (nothing is re-timed)."""
    m = measured
    gain = speedups(m)
    word, reason, _ = verdict(m)
    load = ", ".join(f"{x:.2f}" for x in m["load_at_start"] or []) or "unknown"
    thread_rows = [
        {"model": n, "B": b, "T": t, "speed-up, 2 threads": spread_text(v)}
        for (n, b, t), v in gain.items()
    ]
    return Report(
        name="parallelism",
        title="Parallelism: the RNN's serial loop vs the Transformer's matmuls",
        claim=CLAIM,
        source="000, 'Problems with RNN: Parallelization issues with dependence on the sequence "
        "index'",
        setup=[
            f"Serial baseline: an Elman RNN LM on torch.nn.RNN's fused kernel (d {D_RNN}); also "
            f"attnlab's own RNN LM ({MODELS[LOOP]}), whose Python loop over t adds per-step "
            f"overhead; Transformer LM: {MODELS[TF]}; vocabulary {VOCAB}; parameters "
            + ", ".join(f"{n} {p:,}" for n, p in m["params"].items())
            + ".",
            f"One step = forward + backward + AdamW update on random tokens, B = "
            f"{' and '.join(map(str, m['batches']))}, T = {m['lengths']}, 1 and 2 intra-op "
            f"threads; best of {m['repeats']} steps after {m['warmup']} warm-up steps, measured in "
            f"{len(m['rounds'])} rounds (each a full sweep with its own seed, thread counts "
            "interleaved); tables give the mean over rounds with the min-max.",
            f"Machine: {m['logical_cores']} logical cores; load average when the run started: "
            f"{load} (other processes may share the cores: timings are indicative, the thread "
            "sweep most of all).",
            "Timings only: no trained arms are compared (the models train for a few steps on "
            "random tokens to be timed, not to learn), so there is no competence gate.",
            (
                f"GPU: {m['gpu']}: the same steps (models, B, T, rounds, best of "
                f"{m['repeats']} after {m['warmup']} warm-ups) timed there too, each between two "
                "torch.cuda.synchronize() calls; threads do not apply."
                if m["gpu"]
                else CPU_ONLY
            ),
        ],
        thresholds=THRESHOLDS,
        tables=[
            Table("training-step time against sequence length", step_rows(m)),
            Table("growth with T", growth_rows(m)),
            Table("intra-op threads: speed-up of 2 threads over 1", thread_rows),
            *(
                [
                    Table("training-step time against sequence length, GPU", step_rows(m, GPU)),
                    Table("growth with T, GPU", growth_rows(m, GPU)),
                ]
                if m["gpu"]
                else []
            ),
        ],
        figures=_figures(out_dir, m, gain),
        **gated_fields(word, reason, [], m["rounds"], quick, arms=[]),
        per_seed={
            "ms": {f"{n}, B={b}, {setting(th)}, T={t}": v for (n, b, th, t), v in m["ms"].items()}
        },
        metrics={
            "ms": {
                f"{n}, B={b}, {setting(th)}": [
                    spread(m["ms"][(n, b, th, t)])["mean"] for t in m["lengths"]
                ]
                for n in MODELS
                for b in m["batches"]
                for th in [*m["threads"], *([GPU] if m["gpu"] else [])]
            },
            "speedup": {f"{n}, B={b}, T={t}": v for (n, b, t), v in gain.items()},
            "lengths": m["lengths"],
            "logical_cores": m["logical_cores"],
            "gpu": m["gpu"],
        },
        findings=[
            "Per step an RNN does T dependent (B, D) x (D, D) products forward and again "
            "backward; the fused kernel removes Python's per-step cost but not the dependency. "
            "The Transformer does each layer's work for all T positions in a few large "
            "products, so with a single sequence it still has T rows to spread over the "
            "hardware.",
            *([gpu_finding(m)] if m["gpu"] else []),
            f"The CPU has {m['logical_cores']} logical cores, shared with other processes: "
            "little parallel hardware to win"
            + ("." if m["gpu"] else "; a GPU would widen the gap (not measured here)."),
        ],
        quick=quick,
        seed=m["rounds"][0],
    )


@experiment(
    "parallelism",
    notes="000 'Parallelization issues with dependence on the sequence index'",
)
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """An RNN's serial dependency makes its training step time grow linearly with the sequence
    length and gain little from parallel hardware, while a Transformer processes all positions
    at once."""
    return write_up(measure(quick, seed, data), out_dir, quick)


def _step_chart(m: dict, where: int | str):
    """ms per training step against T, one curve per (model, B), timed with ``where``."""
    lengths, runs = m["lengths"], range(len(m["rounds"]))
    curves = {
        f"{name}, B = {b}": (
            lengths,
            [[m["ms"][(name, b, where, t)][i] for t in lengths] for i in runs],
        )
        for name in MODELS
        for b in m["batches"]
    }
    chart = seeds_chart(
        curves,
        xlabel="sequence length T",
        ylabel="ms per training step",
        title=f"training step ({m['gpu'] if where == GPU else setting(where)})",
        logx=True,
        logy=True,
    )
    return curves, chart


def _figures(out_dir: Path, m: dict, speedup: dict) -> list:
    lengths, b1, runs = m["lengths"], m["batches"][0], range(len(m["rounds"]))
    step_ms, step = _step_chart(m, 1)
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
        *(
            [
                save_chart(
                    _step_chart(m, GPU)[1],
                    out_dir,
                    "step_time_gpu.png",
                    f"Training-step time on the GPU ({m['gpu']}) against T (log-log), mean "
                    "over rounds with the min-max band: a flat curve is a step whose positions "
                    "run in parallel.",
                )
            ]
            if m["gpu"]
            else []
        ),
    ]
