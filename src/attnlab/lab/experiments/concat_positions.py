"""Experiment ``concat_positions``: concatenated vs added position encodings (004 eq. 15).

004 (eq. 15): the query input is q~_n = f(q_n, PE(n)), with f "often set to be simple operations
such as summation and concatenation". Its author's hypothesis: with concatenation, [q_n, PE(n)]
"multiplied by learnable weight matrices, the sinusoid embedding allows the network to learn a
very flexible position encoding function as a combination of many sine/cosine waves of
different frequencies (think about the Fourier series)". attnlab has both:

    added               x~_n = x_n + c PE(n)          (c = sqrt(2) RMS(E): the token scale, see
                                                       the ``extrapolation`` report for why)
    concatenated        x~_n = W [x_n; c PE(n)] + b   (the same c, so both halves of the input
                                                       of W start on a common scale)
    concatenated, unit  x~_n = W [x_n; PE(n)] + b     (raw sinusoids: a reference arm; at init
                                                       W maps the N(0, 0.02) tokens to a small
                                                       share of the output and the position half
                                                       swamps them: the report measures it)

Two decoder-LM tasks on the copy layout of ``extrapolation`` (loss on the output half only):
"copy" (output x_1..x_n: a fixed relative offset, which sums of sinusoids make easy) and
"permute" (output x_{pi(1)}..x_{pi(n)} for a fixed random permutation pi of 1..n, n = 12: each
output position must find an arbitrary input position, a position function with no simple
relative form). Each compared arm (input x task) is trained at every peak lr of ``LRS`` on every
seed; one lr per arm is chosen on the validation sets (``choose_lr``); a choice at an edge of the
grid extends it by one rate (x3 past that edge) on every seed, up to ``MAX_EXTRA`` times, so the
chosen rate is bracketed. At that lr every seed is measured on a separate test set from the same
distribution: accuracy every 100 steps, steps to 0.99 and final accuracy (the competence
criterion), and the first seed is trained again at twice the steps (the step doubling: its test
accuracy may move by at most ``TOLERANCE``). Both inputs can stall at an lr that suits the other
(see ``steps``), so a shared lr would compare recipes, not inputs.

Shapes: N examples, B batch, T = 2 n + 3.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlab.lab.kit.charts import save_chart, seeds_chart
from attnlab.lab.kit.copy_task import (
    BOS,
    EOS,
    FIRST_SYMBOL,
    PAD,
    SEP,
    build_arm,
    copy_accuracy,
    copy_examples,
    copy_loss,
    rms,
    signal_scales,
)
from attnlab.lab.kit.fit import FitConfig, fit
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import FigureRef, Report, Table, Threshold
from attnlab.lab.kit.seeds import resolved, run_jobs, spread_text, start_seeds
from attnlab.lab.kit.verdict import Competence, Doubling, LearningRate, gated_fields, verdict_of
from attnlab.nn.positional import ConcatPositions

ARMS = {"added": "sinusoidal", "concatenated": "concat", "concatenated, unit": "concat"}
COMPARED = ("added", "concatenated")
TASKS = ("copy", "permute")
THRESHOLD = 0.99
N_MAX = 12  # the longest sequence: copy n in 1..N_MAX, permute n = N_MAX (quick: 6)
LRS = (1e-3, 3e-3, 1e-2)  # peak lrs swept for each compared arm and task, on every seed
REFERENCE_LR = 3e-3  # the raw-sinusoid reference arm is not swept
MAX_EXTRA = 2  # an edge choice extends an arm's grid by up to this many rates (x3 each)
TOLERANCE = 0.01  # step doubling: the test accuracy may move by at most this much
COST = (
    "Full run: 2 compared arms x 2 tasks x 3 peak lrs x 3 seeds (+ 3 seeds per grid extension, "
    "of which there are usually about 2), the reference arm on 3 seeds, and a 2x-steps doubling "
    "of the first seed per compared arm and task. Estimated 25-35 min on 2 idle cores. "
    "Command: attnlab experiment concat_positions --seed 0"
)
THRESHOLDS = [
    Threshold(
        "steps to 0.99 held-out accuracy, concatenated vs added",
        "fewer for concatenated, seed ranges apart ('flexible' measured as learning speed)",
        "004 eq. 15-16: concatenation lets the network 'learn a very flexible position encoding "
        "function' (qualitative: no number in the note); ranges apart is the lab's rule",
    ),
    Threshold(
        "competence: held-out accuracy on the arm's own task",
        f">= {THRESHOLD} on every seed",
        "the lab's competence bar (docs/experiments/README.md)",
    ),
]


def permuted_examples(
    n: int, length: int, perm: np.ndarray, n_symbols: int, rng: np.random.Generator
) -> tuple[Tensor, Tensor]:
    """``<bos> x_1..x_n | x_pi(1)..x_pi(n) <eos>`` (ids (N, T)) and targets (N, T - 1) that are
    -100 outside the output half."""
    t = 2 * length + 3
    ids = np.full((n, t), PAD, dtype=np.int64)
    targets = np.full((n, t - 1), -100, dtype=np.int64)
    for row in range(n):
        symbols = FIRST_SYMBOL + rng.permutation(n_symbols)[:length]
        seq = [BOS, *symbols, SEP, *symbols[perm], EOS]
        ids[row] = seq
        targets[row, length + 1 : 2 * length + 2] = seq[length + 2 : 2 * length + 3]
    return torch.from_numpy(ids), torch.from_numpy(targets)


def task_data(task: str, quick: bool, seed: int) -> dict:
    n_max = 6 if quick else N_MAX
    n_symbols = 2 * n_max + 8
    rng = np.random.default_rng(seed)
    n_train = 2000 if quick else 20000
    if task == "copy":
        train = copy_examples(n_train, rng.integers(1, n_max + 1, n_train), n_symbols, rng)
        val = copy_examples(400, rng.integers(1, n_max + 1, 400), n_symbols, rng)
        test = copy_examples(400, rng.integers(1, n_max + 1, 400), n_symbols, rng)
    else:
        perm = rng.permutation(n_max)
        train = permuted_examples(n_train, n_max, perm, n_symbols, rng)
        val = permuted_examples(400, n_max, perm, n_symbols, rng)
        test = permuted_examples(400, n_max, perm, n_symbols, rng)
    return {
        "train": train,
        "val": val,
        "test": test,
        "vocab": FIRST_SYMBOL + n_symbols,
        "max_len": 2 * n_max + 3,
        "n_max": n_max,
        "n_train": n_train,
    }


class ScaledConcat(ConcatPositions):
    """x~_n = W [x_n; c PE(n)] + b: the concatenated sinusoids at a fixed scale c (not trained);
    shares ``inner``'s learned map W, b."""

    def __init__(self, inner: ConcatPositions, scale: float):
        super().__init__(inner.proj.out_features, inner.d_pos, inner.base)
        self.proj, self.scale = inner.proj, scale

    def signal(self, positions: Tensor, x: Tensor) -> Tensor:
        return self.scale * super().signal(positions, x)  # (T|B,T, d_pos)


def build(arm: str, vocab: int, max_len: int, quick: bool) -> torch.nn.Module:
    """The model of one arm; "concatenated" scales PE to the token scale before the map."""
    model = build_arm(ARMS[arm], vocab, max_len, quick)
    embed: Any = model.embed
    if arm == "concatenated":
        tokens = rms(embed.tok_emb.weight)
        embed.pos_enc = ScaledConcat(embed.pos_enc, tokens * math.sqrt(2.0))
    return model


def steps(quick: bool, task: str = "copy") -> int:
    """Training steps: 'permute' (an arbitrary position map) gets more than 'copy'. Whether
    they suffice is the step doubling's to say (each compared arm is trained again at twice the
    steps); which peak lr suits each input is the sweep's (:data:`LRS`, extended at an edge)."""
    return 40 if quick else (2000 if task == "permute" else 1200)


def fit_config(quick: bool, task: str, lr: float, scale: int = 1) -> FitConfig:
    """AdamW at peak ``lr``, warm-up (120 steps: 6-10% of a run) + cosine to 0; ``scale`` = 2
    is the step doubling (warm-up and schedule stretched)."""
    cfg = FitConfig.sized(quick, steps(quick, task), warmup_steps=120, lr=lr)
    return dataclasses.replace(cfg, steps=cfg.steps * scale, warmup_steps=cfg.warmup_steps * scale)


def arm_lrs(arm: str) -> tuple[float, ...]:
    """The peak learning rates an arm is trained at: the sweep for a compared arm, the one
    reference rate otherwise."""
    return LRS if arm in COMPARED else (REFERENCE_LR,)


def first_reach(curve: list[tuple[int, float]]) -> float:
    """The first checked step at which accuracy is >= THRESHOLD (inf if never)."""
    return next((s for s, a in curve if a >= THRESHOLD), math.inf)


def train_job(job: tuple) -> dict:
    """One (arm, task, peak lr, seed) run: validation accuracy (which chooses the lr) and
    held-out test accuracy (which measures competence and speed) every ``every`` steps."""
    arm, task, lr, seed, quick, scale = job
    data = task_data(task, quick, seed)
    torch.manual_seed(seed)
    model = build(arm, data["vocab"], data["max_len"], quick)
    embed: Any = model.embed
    every = (20 if quick else 100) * scale
    cfg = fit_config(quick, task, lr, scale)
    test_curve: list[tuple[int, float]] = []  # (step, test accuracy), filled alongside

    def evaluate(m: torch.nn.Module) -> float:  # the validation accuracy; test on the side
        test_curve.append((len(test_curve) * every + every, copy_accuracy(m, *data["test"])[0]))
        return copy_accuracy(m, *data["val"])[0]

    result = fit(
        model, data["train"], copy_loss, cfg, seed=seed, evaluate=evaluate, eval_every=every
    )
    val_curve = list(result.evals)
    val = copy_accuracy(model, *data["val"])[0]
    scales = signal_scales(model, data["max_len"])
    if arm.startswith("concatenated"):  # what the learned map does with each half, after training
        w = embed.pos_enc.proj.weight  # (D, D + d_pos)
        d = w.size(0)
        c = getattr(embed.pos_enc, "scale", 1.0)
        scales["mapped tokens (|W_x| x RMS(E))"] = rms(w[:, :d]) * rms(embed.tok_emb.weight)
        scales["mapped positions (|W_p| x RMS(c PE))"] = rms(w[:, d:]) * c * math.sqrt(0.5)
    return {
        "lr": lr,
        "val": val,
        "val_steps": first_reach(val_curve),
        "final": copy_accuracy(model, *data["test"])[0],
        "steps": first_reach(test_curve),
        "curve": test_curve,
        "loss": result.final_loss(),
        "scales": scales,
    }


def choose_lr(runs: dict[float, list[dict]]) -> float:
    """The peak lr (``{lr: one run per seed}``) whose seeds do best on *validation* data: most
    seeds ending >= THRESHOLD, then fewest steps to it (mean over seeds), then the best
    worst-seed accuracy, then the lowest final training loss. The test set is not looked at."""

    def key(lr: float) -> tuple:
        val = [r["val"] for r in runs[lr]]
        mean_steps = float(np.mean([r["val_steps"] for r in runs[lr]]))
        mean_loss = float(np.mean([r["loss"] for r in runs[lr]]))
        return sum(v >= THRESHOLD for v in val), -mean_steps, min(val), -mean_loss

    return max(runs, key=key)


def job_cost(job: tuple) -> float:
    return steps(job[4], job[1]) * job[5]


def job(key: tuple[str, str], lr: float, seed: int, quick: bool, scale: int = 1) -> tuple:
    """The :func:`train_job` tuple of (arm, task) ``key`` at ``lr`` on ``seed``."""
    return (key[0], key[1], lr, seed, quick, scale)


def chosen_lrs(grids: dict, done: dict, seeds: list[int], quick: bool) -> dict:
    """{(arm, task): the lr :func:`choose_lr` picks from the runs of its grid}."""
    return {
        k: choose_lr({lr: [done[job(k, lr, s, quick)] for s in seeds] for lr in grid})
        for k, grid in grids.items()
    }


def train_all(seeds: list[int], quick: bool) -> dict:
    """Every arm x task x lr x seed, two single-threaded runs at a time (the longest first); a
    compared arm's choice at a grid edge extends its grid (x3 past the edge, every seed), up to
    MAX_EXTRA times; then the step doubling of the first seed at each chosen lr."""
    grids = {(a, t): list(arm_lrs(a)) for a in ARMS for t in TASKS}
    workers, done = 1 if quick else 2, {}
    for extension in range(MAX_EXTRA + 1):
        jobs = [job(k, lr, s, quick) for k, grid in grids.items() for lr in grid for s in seeds]
        done.update(run_jobs(train_job, [j for j in jobs if j not in done], workers, job_cost))
        chosen = chosen_lrs(grids, done, seeds, quick)
        edge = [
            k for k in grids if k[0] in COMPARED and chosen[k] in (min(grids[k]), max(grids[k]))
        ]
        if not edge or extension == MAX_EXTRA:
            break
        for k in edge:
            grids[k].append(chosen[k] * 3 if chosen[k] == max(grids[k]) else chosen[k] / 3)
    doubling = [(a, t, chosen[(a, t)], seeds[0], quick, 2) for a in COMPARED for t in TASKS]
    doubled = run_jobs(train_job, doubling, workers, job_cost)
    return {
        "seeds": seeds,
        "quick": quick,
        "grids": {k: sorted(g) for k, g in grids.items()},
        "chosen": chosen,
        "sweep": {
            (k[0], k[1], lr): [done[job(k, lr, s, quick)] for s in seeds]
            for k, g in grids.items()
            for lr in g
        },
        "doubled": {
            (a, t): doubled[(a, t, chosen[(a, t)], seeds[0], quick, 2)]
            for a in COMPARED
            for t in TASKS
        },
    }


def measure(quick: bool, seed: int, data: Path | None = None) -> dict:
    """:func:`train_all` on the run's seeds (``data`` is unused: the tasks are generated)."""
    return train_all(start_seeds(seed, quick), quick)


def sweep_rows(m: dict) -> list[dict]:
    """One row per compared arm, task and peak lr: the validation numbers the choice rests on."""
    return [
        {
            "task": t,
            "position input": a,
            "peak lr": lr,
            "val accuracy per seed": ", ".join(f"{r['val']:.3f}" for r in rs),
            f"seeds >= {THRESHOLD}": sum(r["val"] >= THRESHOLD for r in rs),
            f"steps to {THRESHOLD} (val)": spread_text([r["val_steps"] for r in rs]),
            "final train loss": spread_text([r["loss"] for r in rs]),
            "chosen": lr == m["chosen"][(a, t)],
        }
        for t in TASKS
        for a in COMPARED
        for lr in m["grids"][(a, t)]
        for rs in [m["sweep"][(a, t, lr)]]
    ]


def misses_text(m: dict) -> str:
    """The runs of the sweep that end below THRESHOLD on validation."""
    parts = [
        f"{t}, {a}, lr {lr:g}, seed {s}: {r['val']:.3f}"
        for (a, t, lr), rs in m["sweep"].items()
        if a in COMPARED
        for s, r in zip(m["seeds"], rs)
        if r["val"] < THRESHOLD
    ]
    return "; ".join(parts) if parts else "none"


def per_arm(m: dict) -> dict:
    """{(arm, task): the runs of every seed at the chosen lr}."""
    return {(a, t): m["sweep"][(a, t, m["chosen"][(a, t)])] for a in ARMS for t in TASKS}


def competence(m: dict) -> list[Competence]:
    """Held-out accuracy >= THRESHOLD per arm and task; the compared arms with their bracketed
    sweep and their step doubling (first seed), the reference arm without (not compared)."""
    out = []
    for (a, t), runs in per_arm(m).items():
        lr, doubling = None, None
        if a in COMPARED:
            lr = LearningRate(
                m["chosen"][(a, t)],
                m["grids"][(a, t)],
                chosen_on="validation accuracy and steps to 0.99, every seed",
            )
            doubling = Doubling(
                fit_config(m["quick"], t, 1.0).steps,
                [runs[0]["final"]],
                [m["doubled"][(a, t)]["final"]],
                TOLERANCE,
                seeds=m["seeds"][:1],
                metric="test accuracy",
            )
        out.append(
            Competence(
                f"{a}, {t}",
                "held-out accuracy on its own task (training distribution; test set, not used "
                "to choose the lr)",
                THRESHOLD,
                [r["final"] for r in runs],
                in_verdict=a in COMPARED,
                lr=lr,
                doubling=doubling,
            )
        )
    return out


def verdict(m: dict) -> tuple[str, str]:
    """Per task: concatenated reaches THRESHOLD in fewer steps than added with the seed ranges
    apart (held), added does (did not hold), or neither (no effect resolved)."""
    per, chosen = per_arm(m), m["chosen"]
    reach = {k: [r["steps"] for r in v] for k, v in per.items()}
    outcomes, parts = [], []
    for t in TASKS:
        add, cat = reach[("added", t)], reach[("concatenated", t)]
        lrs = f"lr {chosen[('added', t)]:g} vs {chosen[('concatenated', t)]:g}"
        if resolved(add, cat):
            outcomes.append(max(cat) < min(add))
            faster = "concatenated" if outcomes[-1] else "added"
            parts.append(
                f"{t}: {faster} is faster, steps to {THRESHOLD} added {spread_text(add)}, "
                f"concatenated {spread_text(cat)} ({lrs}; seed ranges apart)"
            )
        else:
            parts.append(
                f"{t}: steps to {THRESHOLD} added {spread_text(add)}, concatenated "
                f"{spread_text(cat)} ({lrs}; inside the seed spread)"
            )
    word = verdict_of(outcomes) if outcomes else "no effect resolved"
    if outcomes and len(outcomes) < len(TASKS) and all(outcomes):
        word = "mixed"  # held on one task, unresolved on the other
    final = {k: [r["final"] for r in v] for k, v in per.items()}
    unit = {t: spread_text(final[("concatenated, unit", t)]) for t in TASKS}
    rescued = all(min(final[("concatenated, unit", t)]) >= THRESHOLD for t in TASKS)
    every = 20 if m["quick"] else 100
    reason = (
        "; ".join(parts) + f" (mean (min-max) over {len(m['seeds'])} seeds, each arm at the "
        f"peak lr it does best with on validation data, held-out accuracy checked every {every} "
        f"steps). Concatenated raw (unit) sinusoids (lr {REFERENCE_LR:g}, a reference arm) "
        f"reach {unit['copy']} (copy) and {unit['permute']} (permute): the learned map alone "
        + ("makes" if rescued else "does not make")
        + " raw sinusoids usable."
    )
    return word, reason


def figures(m: dict, out_dir: Path) -> list[FigureRef]:
    per, out = per_arm(m), []
    for t in TASKS:
        curves = {
            f"{a} (lr {m['chosen'][(a, t)]:g})": (
                [s for s, _ in per[(a, t)][0]["curve"]],
                [[v for _, v in r["curve"]] for r in per[(a, t)]],
            )
            for a in ARMS
        }
        fig = seeds_chart(
            curves,
            xlabel="training step",
            ylabel="held-out accuracy per token",
            title=f"{t}: added vs concatenated sinusoids ({len(m['seeds'])} seed(s))",
            hline=THRESHOLD,
        )
        out.append(
            save_chart(
                fig,
                out_dir,
                f"learning_{t}.png",
                f"Held-out (test) accuracy during training on '{t}', each arm at its chosen "
                f"peak lr (mean over seeds, min-max band); the dashed line is {THRESHOLD}.",
            )
        )
    return out


def setup(m: dict) -> list[str]:
    quick, seeds = m["quick"], m["seeds"]
    data = {t: task_data(t, quick, 0) for t in TASKS}
    cfg = {t: fit_config(quick, t, LRS[0]) for t in TASKS}
    scales = per_arm(m)[("concatenated", "permute")][0]["scales"]
    return [
        f"Decoder-only LM, 2 layers, d_model {32 if quick else 64}, 4 heads; the same model "
        "but the position input: added sinusoids at the token scale c = sqrt(2) RMS(E); "
        "sinusoids at the same scale concatenated and mapped back to d_model by a learned "
        "linear layer (ConcatPositions, PE width = d_model); concatenated raw sinusoids "
        "(reference).",
        f"Tasks: 'copy' with n uniform in 1..{data['copy']['n_max']}; 'permute' with n = "
        f"{data['permute']['n_max']} and a fixed random permutation per seed; loss and "
        f"accuracy on the output half only; {data['copy']['n_train']} training, 400 "
        "validation and 400 test sequences per seed, all from the training distribution.",
        f"AdamW, {cfg['copy'].steps} (copy) and {cfg['permute'].steps} (permute) steps of "
        f"{cfg['copy'].batch_size}, warm-up {cfg['copy'].warmup_steps} steps + cosine to 0. "
        f"Peak lr swept over {', '.join(f'{lr:g}' for lr in LRS)} for each compared arm and "
        "task on every seed; one lr per arm and task is chosen on the validation sets (most "
        f"seeds ending >= {THRESHOLD}, then fewest steps to it, then the worst seed's "
        f"accuracy); a choice at a grid edge adds the rate x3 past it (up to {MAX_EXTRA} times). "
        "All seeds are reported at the chosen lr; competence and steps are measured on the "
        f"test sets. Step doubling: seed {seeds[0]} trained again at twice the steps, its test "
        f"accuracy may move by at most {TOLERANCE:g}. The reference arm runs at lr "
        f"{REFERENCE_LR:g} only. One torch thread per run, two runs at a time.",
        "The concatenated arm's learned map after training (seed "
        f"{seeds[0]}, permute): " + ", ".join(f"{k} {v:.3g}" for k, v in scales.items()) + ".",
    ]


def write_up(measured: dict, out_dir: Path, quick: bool) -> Report:
    """Tables, figures and the gated verdict from :func:`measure`'s runs (no training)."""
    m, per = measured, per_arm(measured)
    final = {k: [r["final"] for r in v] for k, v in per.items()}
    reach = {k: [r["steps"] for r in v] for k, v in per.items()}
    rows = [
        {
            "task": t,
            "position input": a,
            "peak lr": m["chosen"][(a, t)],
            "test accuracy": spread_text(final[(a, t)]),
            f"steps to {THRESHOLD}": spread_text(reach[(a, t)]),
            "seeds reaching it": sum(math.isfinite(x) for x in reach[(a, t)]),
            "final train loss": spread_text([r["loss"] for r in per[(a, t)]]),
        }
        for t in TASKS
        for a in ARMS
    ]
    word, reason = verdict(m)
    comp = competence(m)
    return Report(
        name="concat_positions",
        title="Concatenated vs added sinusoidal positions",
        claim="in the case of using concatenation to construct the new query [...] which is then "
        "multiplied by learnable weight matrices, the sinusoid embedding allows the network to "
        "learn a very flexible position encoding function as a combination of many sine/cosine "
        "waves of different frequencies",
        source="004, 'Position representations' (eq. 15-16; the author's hypothesis)",
        setup=setup(m),
        thresholds=THRESHOLDS,
        tables=[
            Table("accuracy and learning speed per task and position input", rows),
            Table("learning-rate sweep (validation sets, every seed)", sweep_rows(m)),
        ],
        figures=figures(m, out_dir),
        **gated_fields(
            word, reason, comp, m["seeds"], quick, arms=[c.arm for c in comp if c.in_verdict]
        ),
        per_seed={
            "final": {f"{a}, {t}": v for (a, t), v in final.items()},
            "steps": {f"{a}, {t}": v for (a, t), v in reach.items()},
            "sweep_val": {
                f"{a}, {t}, lr {lr:g}": [r["val"] for r in rs]
                for (a, t, lr), rs in m["sweep"].items()
            },
        },
        metrics={
            "final": {f"{a}, {t}": float(np.mean(v)) for (a, t), v in final.items()},
            "lr": {f"{a}, {t}": lr for (a, t), lr in m["chosen"].items()},
        },
        findings=[
            "Learning speed is the measurable side of 'flexible': both inputs can in principle "
            "represent any position function at this width; the question is how fast training "
            "finds it.",
            f"The peak lr is part of each input's recipe. Sweep runs ending below {THRESHOLD} on "
            f"validation: {misses_text(m)}.",
        ],
        quick=quick,
        seed=m["seeds"][0],
    )


@experiment("concat_positions", notes="004 eq. 15-16 (the author's hypothesis)")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Concatenating sinusoids to the input and mapping [x; PE] with learned weights lets the
    network build a flexible position function (a Fourier series), compared with adding them."""
    return write_up(measure(quick, seed, data), out_dir, quick)
