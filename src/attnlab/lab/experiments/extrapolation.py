"""Experiment ``extrapolation``: can a model use positions it never saw in training? (004)

004 ("Position representations"): learned position vectors are free parameters, one per index,
so "in the case where unseen index can occur in test time, a pre-defined function might be
preferred" - sinusoids (Vaswani et al. 2017) are defined for every index. Rotary embeddings
(Su et al. 2021) rotate q and k so that q_i^T k_j depends on i - j only; a causal model without
any position signal ("none", NoPE) is included as a fourth point of comparison.

Task (a decoder-only LM, copy with a separator): ``<bos> x_1 .. x_n | x_1 .. x_n <eos>`` with
distinct random symbols x_i. The loss and the accuracy count only the copy half, which is fully
determined by the first half; the first half is unpredictable by design. Training uses
n <= N; testing uses n up to 2N, so test sequences are up to twice as long as any training one.

Every model is built with max_len >= the longest *test* sequence, so a learned table has rows
for the unseen positions, but those rows only ever received their random initialisation (no
gradient reaches an embedding row that is never looked up; weight decay does not apply to
embeddings here). Accuracy is per copied token under teacher forcing (the argmax at each copy
position is the right symbol) and exact match of the whole copy.

Shapes: N examples, B batch, T sequence length (2 n + 3), V vocabulary, H heads.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from attnlab.lab.kit.charts import (
    curves_chart,
    dodged,
    integer_xticks,
    save_chart,
    seeds_chart,
)
from attnlab.lab.kit.copy_task import (
    FIRST_SYMBOL,
    ROTARY_LARGE,
    build_arm,
    copy_accuracy,
    copy_examples,
    copy_loss,
    model_config,
    position_table,
    signal_scales,
)
from attnlab.lab.kit.fit import FitConfig, eval_loss, fit
from attnlab.lab.kit.gating import bracketed_sweep
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Report, Table, Threshold
from attnlab.lab.kit.seeds import bands, resolved, run_jobs, spread, spread_text, start_seeds
from attnlab.lab.kit.verdict import Competence, Doubling, LearningRate, gated_fields
from attnlab.viz import attention_maps, plot_attention

# Compared in the verdict: the notes' three, then the two modern relative schemes (ALiBi: Press
# et al. 2022).
ARMS = ("learned", "sinusoidal", "rotary", ROTARY_LARGE, "alibi")
# Reference arms, reported but not compared: no position signal at all (NoPE; the causal mask
# alone leaks order), and the raw-scale sinusoids (the measurement behind the rescaling).
REFERENCE_ARMS = ("none", "sinusoidal, unit")
REFERENCE_LR = 3e-3
THRESHOLD = 0.99  # competence: per-token copy accuracy on the training lengths


MAX_EXTRA = 2  # an edge choice extends an arm's grid by up to this many rates (x3 each)
TOLERANCE = 0.01  # step doubling: validation accuracy may move by at most this much
LRS = (1e-3, 3e-3, 1e-2)  # swept per compared arm on the first seed, chosen on validation
COST = (
    "Full run: 5 compared arms, each a 3-rate sweep on the first seed (+ up to 2 rates when a "
    "choice sits at a grid edge), 2 more seeds at the chosen rate and a 2x-steps doubling of "
    "the first seed; 2 reference arms on 3 seeds at one rate; 1500 steps of 64 per run. "
    "Estimated 25-35 min on 2 idle cores (41-51 run-equivalents of ~35 s each). Command: "
    "attnlab experiment extrapolation --seed 0"
)
THRESHOLDS = [
    Threshold(
        "per-token copy accuracy beyond the training length, sinusoidal and rotary vs learned",
        "higher, seed ranges apart",
        "004 'Position representations': 'in the case where unseen index can occur in test "
        "time, a pre-defined function might be preferred' (qualitative: no number in the note); "
        "ranges apart is the lab's rule for a resolved difference",
    ),
    Threshold(
        "competence: per-token copy accuracy on validation copies of the training lengths",
        f">= {THRESHOLD} on every seed",
        "the lab's competence bar (docs/experiments/README.md)",
    ),
]


def one_run(arm: str, lr: float, seed: int, quick: bool, scale: int = 1) -> dict:
    """One run on one thread: validation accuracy on the training lengths, per-token and exact
    accuracy per test length, the loss curve and (learned, rotary) the last layer's attention
    on the longest test copy."""
    data = make_data(quick, seed)
    torch.manual_seed(seed)
    model = build_arm(arm, data["vocab"], data["max_len"], quick)
    scales = signal_scales(model, data["max_len"])
    table = position_table(model)
    before = None if table is None else table.detach().clone()
    result = fit(model, data["train"], copy_loss, fit_config(quick, lr, scale), seed=seed)
    moved = None
    if table is not None and before is not None:  # rows at or past the longest training
        moved = float((table.detach() - before)[2 * data["n_max"] + 2 :].abs().max())
    scores = {k: copy_accuracy(model, *data["tests"][k]) for k in data["lengths"]}
    return {
        "lr": lr,
        "val": copy_accuracy(model, *data["val"])[0],
        "val_loss": math.inf if result.diverged else eval_loss(model, data["val"], copy_loss),
        "loss": result.final_loss(),
        "curve": result.losses,
        "token": [scores[k][0] for k in data["lengths"]],
        "exact": [scores[k][1] for k in data["lengths"]],
        "moved": moved,
        "scales": scales,
        "seconds": result.seconds,
        "diverged": result.diverged,
        "maps": last_layer_maps(model, data) if arm in MAPPED else None,
    }


MAPPED = ("rotary", "learned")  # the arms whose attention is drawn
ZOOM = 8  # copy steps in the zoomed attention panel


def last_layer_maps(model: torch.nn.Module, data: dict) -> list:
    """The last layer's self-attention (H, T, T) on the first copy of the longest test length."""
    longest = data["lengths"][-1]
    ids = data["tests"][longest][0][0]
    maps = attention_maps(model, ids[: 2 * longest + 2]).self_attn
    assert maps is not None, "a decoder LM returns self-attention weights"
    return maps[-1].tolist()


def arm_job(job: tuple) -> dict:
    """One arm on every seed: a compared arm's bracketed sweep on the first seed (validation
    accuracy, then final training loss), the other seeds at the chosen rate and the step
    doubling of the first seed; a reference arm at REFERENCE_LR on every seed."""
    arm, quick, seed = job
    seeds = start_seeds(seed, quick)
    if arm not in ARMS:
        return {"runs": [one_run(arm, REFERENCE_LR, s, quick) for s in seeds]}
    sweep = bracketed_sweep(
        lambda lr: one_run(arm, lr, seeds[0], quick),
        LRS,
        lambda r: r["val_loss"],
        chosen_on=f"validation loss, seed {seeds[0]}",
        max_extra=MAX_EXTRA,
    )
    runs = [sweep.best] + [one_run(arm, sweep.chosen, s, quick) for s in seeds[1:]]
    return {
        "runs": runs,
        "sweep": {lr: (r["val_loss"], r["val"]) for lr, r in sorted(sweep.runs.items())},
        "chosen_on": sweep.chosen_on,
        "doubled": one_run(arm, sweep.chosen, seeds[0], quick, scale=2)["val"],
    }


def make_data(quick: bool, seed: int) -> dict:
    """Training, validation (training lengths) and test sets (per length n) of one seed."""
    n_max = 6 if quick else 16  # N
    lengths = [2, 4, 6, 9, 12] if quick else [4, 8, 12, 16, 20, 24, 28, 32]
    n_symbols = 2 * n_max + 8  # distinct symbols, even at n = 2N
    rng = np.random.default_rng(seed)
    n_train = 2000 if quick else 30000
    train = copy_examples(n_train, rng.integers(1, n_max + 1, n_train), n_symbols, rng)
    val = copy_examples(400, rng.integers(1, n_max + 1, 400), n_symbols, rng)
    tests = {k: copy_examples(200, [k] * 200, n_symbols, rng) for k in lengths}
    return {
        "n_max": n_max,
        "lengths": lengths,
        "vocab": FIRST_SYMBOL + n_symbols,
        "max_len": 2 * max(lengths) + 3,
        "train": train,
        "val": val,
        "tests": tests,
        "n_train": n_train,
    }


def fit_config(quick: bool, lr: float, scale: int = 1) -> FitConfig:
    """AdamW at peak ``lr``, warm-up + cosine; ``scale`` = 2 is the step doubling."""
    steps, warmup = (60, 10) if quick else (1500, 150)
    return FitConfig(
        steps=steps * scale,
        batch_size=32 if quick else 64,
        lr=lr,
        warmup_steps=warmup * scale,
    )


def measure(quick: bool, seed: int, data: Path | None = None) -> dict:
    """Every arm (:func:`arm_job`), two arms at a time, the costliest (swept) first. ``data``
    is unused: the task is generated."""
    arms = ARMS + (REFERENCE_ARMS[:1] if quick else REFERENCE_ARMS)
    jobs = [(a, quick, seed) for a in arms]
    done = run_jobs(arm_job, jobs, 1 if quick else 2, cost=lambda j: 3.0 if j[0] in ARMS else 1.0)
    return {
        "seeds": start_seeds(seed, quick),
        "quick": quick,
        "arms": list(arms),
        "results": {a: done[(a, quick, seed)] for a in arms},
    }


def competence(m: dict, n_max: int) -> list[Competence]:
    """Validation accuracy >= THRESHOLD per arm; the compared arms with their bracketed sweep
    and step doubling (first seed), the reference arms without (not compared)."""
    out = []
    for a in m["arms"]:
        res = m["results"][a]
        lr, doubling = None, None
        if a in ARMS:
            lr = LearningRate(res["runs"][0]["lr"], list(res["sweep"]), chosen_on=res["chosen_on"])
            doubling = Doubling(
                fit_config(m["quick"], 1.0).steps,
                [res["runs"][0]["val"]],
                [res["doubled"]],
                TOLERANCE,
                seeds=m["seeds"][:1],
                metric="validation accuracy (training lengths)",
            )
        out.append(
            Competence(
                a,
                "per-token copy accuracy on validation copies of the training lengths "
                f"n <= {n_max}",
                THRESHOLD,
                [r["val"] for r in res["runs"]],
                in_verdict=a in ARMS,
                lr=lr,
                doubling=doubling,
            )
        )
    return out


def accuracy_rows(m: dict, lengths: list[int]) -> tuple[list[dict], list[dict]]:
    """Per-token and exact-match rows by copied length n, one per arm."""
    rows, exact_rows = [], []
    for a in m["arms"]:
        runs = m["results"][a]["runs"]
        mean, lo, hi = bands([r["token"] for r in runs])
        rows.append(
            {
                "positions": a,
                "lr": runs[0]["lr"],
                "val acc (n <= N)": spread_text([r["val"] for r in runs]),
                "final train loss": spread_text([r["loss"] for r in runs]),
                **{
                    f"n={k}": f"{x:.3f} ({y:.2f}-{z:.2f})" if len(runs) > 1 else x
                    for k, x, y, z in zip(lengths, mean, lo, hi)
                },
            }
        )
        exact_rows.append(
            {
                "positions": a,
                **{
                    f"n={k}": spread_text([r["exact"][j] for r in runs])
                    for j, k in enumerate(lengths)
                },
            }
        )
    return rows, exact_rows


def gate_rows(m: dict) -> list[dict]:
    """The sweep (validation loss and accuracy per rate, first seed) and the doubling per arm."""
    seed = m["seeds"][0]
    return [
        {
            "positions": a,
            f"val loss / acc per lr (seed {seed})": ", ".join(
                f"{lr:g}: {loss:.3g} / {acc:.3f}" for lr, (loss, acc) in res["sweep"].items()
            ),
            "chosen lr": res["runs"][0]["lr"],
            "val acc, first seed -> 2x steps": (
                f"{res['runs'][0]['val']:.4g} -> {res['doubled']:.4g}"
            ),
        }
        for a in ARMS
        for res in [m["results"][a]]
    ]


def write_up(measured: dict, out_dir: Path, quick: bool) -> Report:
    """Tables, figures and the gated verdict from :func:`measure`'s runs (no training)."""
    m, seeds = measured, measured["seeds"]
    data = make_data(quick, seeds[0])
    n_max, lengths, arms = data["n_max"], data["lengths"], m["arms"]
    runs = {a: m["results"][a]["runs"] for a in arms}
    token = {a: [r["token"] for r in runs[a]] for a in arms}  # [seed][length]
    val = {a: [r["val"] for r in runs[a]] for a in arms}
    unseen = [j for j, k in enumerate(lengths) if k > n_max]
    outside = {a: [float(np.mean([t[j] for j in unseen])) for t in token[a]] for a in arms}
    rows, exact_rows = accuracy_rows(m, lengths)
    scales = {a: runs[a][0]["scales"] for a in arms}
    moved = {a: max(r["moved"] for r in runs[a]) for a in arms if runs[a][0]["moved"] is not None}
    verdict, reason = _verdict(outside, val, n_max, lengths)
    comp = competence(m, n_max)
    cfg = model_config("rotary", data["vocab"], data["max_len"], quick)
    fit_cfg = fit_config(quick, LRS[0])
    return Report(
        name="extrapolation",
        title="Length extrapolation: learned vs sinusoidal vs rotary positions",
        claim="in the case where unseen index can occur in test time, a pre-defined function "
        "might be preferred",
        source="004, 'Position representations'",
        setup=[
            f"Task: a decoder-only LM copies n distinct symbols after a separator, <bos> x_1..x_n "
            f"| x_1..x_n <eos>; loss and accuracy on the copy half only. {data['n_train']} "
            f"training sequences per seed with n uniform in 1..{n_max} (N = {n_max}); 400 "
            f"validation sequences from the same distribution; 200 test sequences per n in "
            f"{lengths}.",
            f"Model: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, max_len "
            f"{data['max_len']} (>= the longest test sequence) for every position kind.",
            "Position-signal scale, measured at initialisation (RMS per coordinate): "
            + "; ".join(
                f"{a}: tokens {scales[a]['tokens']:.3f}, positions {scales[a]['positions']:.3f}"
                for a in arms
            )
            + ". The 'sinusoidal' arm scales the sinusoids to the token RMS (x~_i = x_i + c "
            "PE(i), c = sqrt(2) RMS(E)); the 'sinusoidal, unit' arm keeps them raw (a reference "
            "arm).",
            f"Learned rows for positions >= {2 * n_max + 2} exist but are never looked up "
            "in training: they keep their N(0, 0.02) initialisation (largest change after "
            "training over seeds: "
            + (", ".join(f"{k} {v:.1e}" for k, v in moved.items()) or "n/a")
            + ").",
            f"AdamW, {fit_cfg.steps} steps of {fit_cfg.batch_size}, warm-up "
            f"{fit_cfg.warmup_steps} + cosine; peak lr per compared arm chosen from "
            f"{list(LRS)} on validation loss of seed {seeds[0]}, a choice at a grid edge adding "
            f"the rate x3 past it (up to {MAX_EXTRA} times), then used for every seed; step "
            f"doubling: seed {seeds[0]} trained again at twice the steps, its validation "
            f"accuracy may move by at most {TOLERANCE:g}. Reference arms run at "
            f"{REFERENCE_LR:g}: 'none' = no position signal at all (a causal mask alone still "
            "leaks order), 'sinusoidal, unit' = raw sinusoids. One torch thread per run, two "
            "arms at a time.",
        ],
        thresholds=THRESHOLDS,
        tables=[
            Table("per-token copy accuracy by copied length n (mean (min-max) over seeds)", rows),
            Table("exact match of the whole copy by n", exact_rows),
            Table("gate: learning-rate sweep (first seed) and step doubling", gate_rows(m)),
        ],
        figures=_figures(out_dir, arms, lengths, token, n_max, seeds, runs, data, quick),
        **gated_fields(verdict, reason, comp, seeds, quick, arms=list(ARMS)),
        per_seed={"outside": outside, "val": val},
        metrics={
            "token_accuracy": {a: bands(token[a])[0] for a in arms},
            "token_accuracy_per_seed": token,
            "exact_match": {a: bands([r["exact"] for r in runs[a]])[0] for a in arms},
            "outside": {a: spread(outside[a]) for a in arms},
            "best_lr": {a: runs[a][0]["lr"] for a in arms},
            "learned_rows_moved": moved,
            "signal_rms": scales,
            "lengths": lengths,
        },
        findings=findings(outside, val, arms, n_max),
        quick=quick,
        seed=seeds[0],
    )


def findings(outside: dict, val: dict, arms: list[str], n_max: int) -> list[str]:
    out = [
        "Modern relative schemes against rotary (base 10 000) beyond N: "
        + ", ".join(f"{a} {spread_text(outside[a])}" for a in ARMS[3:])
        + f" vs rotary {spread_text(outside['rotary'])}"
        + ".",
        "Mean per-token accuracy beyond the training length (mean (min-max) over seeds): "
        + ", ".join(f"{a} {spread_text(outside[a])}" for a in arms)
        + ".",
        "Sinusoids are defined at every index, but the network behind them was only trained "
        f"on the first 2N + 2 = {2 * n_max + 2} of them: a pre-defined function is "
        "necessary, not sufficient, for extrapolation (Press et al. 2022 report the same for "
        "absolute sinusoids).",
    ]
    if "sinusoidal, unit" in val:
        out.insert(
            2,
            "The scale of the sinusoids: validation accuracy on the training lengths with raw "
            f"(unit) sinusoids {spread_text(val['sinusoidal, unit'])} (lr {REFERENCE_LR:g}) vs "
            f"sinusoids at the token scale {spread_text(val['sinusoidal'])}.",
        )
    return out


@experiment("extrapolation", notes="004 'Position representations'")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Learned position vectors exist only for indices seen in training, so a model with them
    fails on longer inputs; a pre-defined function (sinusoids) is defined everywhere and might
    be preferred; rotary (relative) positions are expected to degrade least."""
    return write_up(measure(quick, seed, data), out_dir, quick)


def _verdict(outside: dict, val: dict, n_max: int, lengths: list[int]) -> tuple[str, str]:
    """Held when sinusoidal and rotary each beat learned beyond N by more than the seed spread."""
    beats, inside_spread = [], []
    for a in ("sinusoidal", "rotary"):
        if resolved(outside[a], outside["learned"]) and min(outside[a]) > max(outside["learned"]):
            beats.append(a)
        elif not resolved(outside[a], outside["learned"]):
            inside_spread.append(a)
    if len(inside_spread) == 2:
        verdict = "no effect resolved"
    else:
        verdict = "held" if len(beats) == 2 else ("mixed" if beats else "did not hold")
    reason = (
        f"per-token copy accuracy on lengths never seen in training (n > N = {n_max}, "
        "mean (min-max) over seeds): "
        + ", ".join(f"{a} {spread_text(outside[a])}" for a in outside if a in ARMS)
        + "; on validation copies of the training lengths: "
        + ", ".join(f"{a} {spread_text(val[a])}" for a in val if a in ARMS)
        + "."
        + (
            f" {', '.join(inside_spread)} differs from learned only inside the seed spread."
            if inside_spread
            else ""
        )
    )
    return verdict, reason


def _figures(out_dir, arms, lengths, token, n_max, seeds, runs, data, quick) -> list:
    fig = seeds_chart(
        {a: (dodged(lengths, k, len(arms)), token[a]) for k, a in enumerate(arms)},
        xlabel=f"copied length n (trained on n <= {n_max}; series offset sideways)",
        ylabel="copy accuracy per token",
        title=f"Copying beyond the training length ({len(seeds)} "
        f"seed{'s' if len(seeds) > 1 else ''}, min-max band)",
        vline=n_max,
    )
    figures = [
        save_chart(
            integer_xticks(fig, lengths),
            out_dir,
            "accuracy_vs_length.png",
            "Per-token copy accuracy against the copied length n, mean over seeds with the "
            "min-max band; the dashed line is the longest training n; the series are offset "
            "sideways so that overlapping ones (several arms at accuracy 1) stay visible.",
        )
    ]
    figures.append(
        save_chart(
            curves_chart(
                {a: [r["curve"] for r in runs[a]] for a in arms},
                title="Training loss on the copy half",
                logy=True,
            ),
            out_dir,
            "training.png",
            "Training loss per arm (mean over seeds, "
            "min-max band), at each arm's chosen learning rate.",
        )
    )
    return figures + attention_figures(out_dir, runs, data, quick, seeds)


def attention_figures(out_dir, runs, data, quick, seeds) -> list:
    """The last layer's self-attention of the rotary and learned models (first seed) on a copy
    of the longest test length."""
    figures = []
    longest = data["lengths"][-1]
    ids = data["tests"][longest][0][0]
    labels = ["<bos>"] + [f"s{int(t) - FIRST_SYMBOL}" for t in ids[1 : longest + 1]]
    labels += ["|"] + labels[1:] + ["<eos>"]
    cfg_layers = model_config("rotary", data["vocab"], data["max_len"], quick).n_layers
    for kind in MAPPED:
        maps = np.asarray(runs[kind][0]["maps"])  # (H, T, T), first seed at the chosen lr
        fig = plot_attention(
            maps,
            labels[:-1],
            labels[:-1],  # (H, T, T)
            title=f"positions={kind}, layer {cfg_layers} of {cfg_layers} (last), n={longest}",
            first_layer=cfg_layers,
        )
        figures.append(
            save_chart(
                fig,
                out_dir,
                f"attention_{kind}.png",
                f"Self-attention of "
                f"layer {cfg_layers} (the last) of the {kind} model (seed "
                f"{seeds[0]}) on a copy of length {longest} (twice the "
                "training length): a working copy attends from each copied "
                "token to the symbol after its first occurrence.",
            )
        )
        # zoom, every cell labelled: the first ZOOM copy queries ('|' and the copied symbols)
        # against the first ZOOM + 1 keys (<bos> and x_1 .. x_ZOOM), where a copy reads
        rows = slice(longest + 1, longest + 1 + ZOOM)
        fig = plot_attention(
            maps[:, rows, : ZOOM + 1],
            labels[rows],
            labels[: ZOOM + 1],
            title=f"positions={kind}, layer {cfg_layers} (last), zoom: first {ZOOM} copy steps",
            first_layer=cfg_layers,
        )
        figures.append(
            save_chart(
                fig,
                out_dir,
                f"attention_{kind}_zoom.png",
                f"Zoom of attention_{kind}.png, every row and column labelled: the first "
                f"{ZOOM} queries of the copy half against the first {ZOOM + 1} keys.",
            )
        )
    return figures
