"""Experiment ``attention``: soft vs hard attention (004 Sec. 1.2, "soft attention ... hard
attention").

004 eq. 9: Attention(Q, K, V; a) = a(Q K^T / sqrt(d_q)) V with a(.) applied row-wise; soft attention
uses the softmax, hard attention "returns a one-hot vector for each row with the j* = argmax_j
<q_i, k_j> element equal to 1 ... exactly an information retrieval system". So hard attention
should suffice when the answer is *one* value looked up by key, and fail when the answer needs
an *average* of many values. Hard attention's argmax has zero gradient; ``straight_through=True``
backpropagates the softmax's gradient instead (the straight-through estimator), ``False`` leaves
the queries and keys without any gradient.

Tasks (:mod:`attnlab.lab.kit.tasks`): key-value lookup (query key at position 0, then (key, value)
pair tokens; predict the value) and counting (a [cls] token then a/b symbols; predict how many
a's). Models: ``ModelConfig(kind="classifier", attention="softmax" | "hardmax",
straight_through=...)`` reading position 0.

Shapes: N examples, T length, D d_model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from attnlab.lab.kit.charts import bar_chart, save_chart
from attnlab.lab.kit.fit import FitConfig, fit_classifier
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Competence, Report, Table, outcome, spread, spread_text
from attnlab.lab.kit.seeds import start_seeds
from attnlab.lab.kit.tasks import counting, kv_lookup
from attnlab.models import build_model

VARIANTS = (
    ("soft (softmax)", "softmax", True),
    ("hard, straight-through", "hardmax", True),
    ("hard, no gradient to q, k", "hardmax", False),
)
SHAPES = (("1 layer, 1 head", 1, 1), ("2 layers, 4 heads", 2, 4))
LOOKUP, COUNT = "key-value lookup", "count the a's"
TASKS = (LOOKUP, COUNT)


def make_task(name: str, n: int, rng: np.random.Generator):
    if name == LOOKUP:
        return kv_lookup(n, n_pairs=8, n_keys=12, n_values=10, rng=rng)
    return counting(n, length=10, rng=rng)


PLATEAU = 0.05  # nats: the most the training loss may still fall over the last quarter


def _one_seed(seed: int, quick: bool, fit_cfg: FitConfig) -> dict:
    """Every (task, shape, variant) trained on one seed: {key: numbers}."""
    rng = np.random.default_rng(seed)
    out = {}
    for task in TASKS:
        train = make_task(task, 1000 if quick else 10_000, rng)
        test = make_task(task, 500 if quick else 2000, rng)
        majority = test.majority_rate()
        for shape, n_layers, n_heads in SHAPES:
            for label, activation, ste in VARIANTS:
                torch.manual_seed(seed)
                size = dict(d_model=32, n_heads=n_heads, n_layers=n_layers, d_ff=128, max_len=16)
                cfg = train.classifier(attention=activation, straight_through=ste, **size)
                model = build_model(cfg)
                result, test_acc = fit_classifier(model, train, test, fit_cfg, seed=seed)
                out[(task, shape, label)] = {
                    "test accuracy": test_acc,
                    "majority class": majority,
                    "final train loss": result.final_loss(),
                    "late drop": result.loss_at(0.75, 50) - result.final_loss(50),
                    "train s": result.seconds,
                }
    return out


@experiment("attention", notes="004 Sec. 1.2 (soft vs hard attention), eq. 9")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Hard (argmax) attention is a retrieval of one value: it suffices for key-value lookup
    but not for a task that needs an average of many values, where soft attention succeeds."""
    seeds = start_seeds(seed, quick)
    fit_cfg = FitConfig(steps=20 if quick else 1000, batch_size=64, lr=3e-3, warmup_steps=50)
    runs = [_one_seed(s, quick, fit_cfg) for s in seeds]
    acc_seeds = {key: [r[key]["test accuracy"] for r in runs] for key in runs[0]}
    accs = {key: spread(v)["mean"] for key, v in acc_seeds.items()}
    rows = []
    for key in runs[0]:
        task, shape, label = key
        per = [r[key] for r in runs]
        rows.append(
            {
                "task": task,
                "model": shape,
                "attention": label,
                "test accuracy": accs[key],
                "min-max": spread_text(acc_seeds[key]),
                "majority class": per[0]["majority class"],
                "final train loss": spread_text([p["final train loss"] for p in per]),
                "loss drop, last quarter": max(p["late drop"] for p in per),
                "train s": spread(p["train s"] for p in per)["mean"],
            }
        )
    one = SHAPES[0][0]
    soft, hard = VARIANTS[0][0], VARIANTS[1][0]
    competence = [
        Competence(
            f"soft, {sh}, {t}",
            "test accuracy (training distribution)",
            0.99,
            acc_seeds[(t, sh, soft)],
        )
        for t in TASKS
        for sh, _, _ in SHAPES
    ]
    competence += [
        Competence(
            f"hard (straight-through), {one}, {t}",
            "trained to a plateau: training-loss drop over the last quarter of training (nats)",
            PLATEAU,
            [r[(t, one, hard)]["late drop"] for r in runs],
            higher_is_better=False,
        )
        for t in TASKS
    ]
    one, deep = SHAPES[0][0], SHAPES[1][0]
    short = {soft: "soft", hard: "hard ST", VARIANTS[2][0]: "hard, no grad"}
    keys = [(t, sh, v) for t in TASKS for sh, _, _ in SHAPES for v, _, _ in VARIANTS]
    labels = {
        (t, sh, v): f"{'lookup' if t == LOOKUP else 'count'}, {sh.split(',')[0]}, {short[v]}"
        for t, sh, v in keys
    }
    figures = [
        save_chart(
            bar_chart(
                {labels[k]: accs[k] for k in labels},
                ylabel="test accuracy",
                title=f"soft vs hard attention ({len(seeds)} seed(s), min-max bars)",
                errors={labels[k]: (min(acc_seeds[k]), max(acc_seeds[k])) for k in labels},
            ),
            out_dir,
            "accuracy.png",
            "Test accuracy per task, model size and attention kind (mean over seeds, min-max "
            "bars; ST = straight-through gradient).",
        )
    ]
    hard, soft, frozen = VARIANTS[1][0], VARIANTS[0][0], VARIANTS[2][0]
    lo, hi = min, max
    checks = [
        lo(acc_seeds[(LOOKUP, one, hard)]) > 0.9,
        lo(acc_seeds[(COUNT, one, soft)]) > 0.9,
        hi(acc_seeds[(COUNT, one, hard)]) < lo(acc_seeds[(COUNT, one, soft)]) - 0.2,
    ]
    spread_note = (
        f" Over seeds: hard counting {spread_text(acc_seeds[(COUNT, one, hard)])}, "
        f"hard lookup {spread_text(acc_seeds[(LOOKUP, one, hard)])}."
    )
    reason = (
        f"with one layer and one head, hard attention (straight-through) reaches "
        f"{accs[(LOOKUP, one, hard)]:.3f} on key-value lookup (soft "
        f"{accs[(LOOKUP, one, soft)]:.3f}) and {accs[(COUNT, one, hard)]:.3f} on counting, "
        f"which needs an average (soft "
        f"{accs[(COUNT, one, soft)]:.3f}); with 2 layers of 4 hard heads counting reaches "
        f"{accs[(COUNT, deep, hard)]:.3f}; without the straight-through gradient hard attention "
        f"reaches {accs[(LOOKUP, one, frozen)]:.3f} on lookup (means over seeds)." + spread_note
    )
    return Report(
        name="attention",
        title="Soft vs hard attention: retrieval vs averaging",
        claim="In soft attention, a(.) is the softmax function [...] This is in contrast with "
        "hard attention where a(.) returns a one-hot vector for each row with the j* = "
        "argmax_j <q_i, k_j> element equals to 1. Hard attention can be interpreted exactly as "
        "an information retrieval system since it returns the corresponding value for the best "
        "key match to the query.",
        source="004, Sec. 1.2 'Single-head attention' (eq. 9)",
        setup=[
            "Key-value lookup: query key at position 0, then 8 (key, value) pair tokens with "
            "distinct keys out of 12, values out of 10; predict the queried value.",
            "Counting: [cls] then 10 symbols from {a, b} (the rate of a's varies per example); "
            "predict the number of a's (11 classes).",
            "Classifier reading position 0: 1 layer with 1 head (one attention operation, as in "
            "004) or 2 pre-norm layers with 4 heads; d_model 32, d_ff 128, "
            f"learned positions; AdamW lr 3e-3, {fit_cfg.steps} steps of 64, warm-up 50 + "
            "cosine; per seed, fresh data and the same initialisation seed for every variant; "
            "one torch thread.",
        ],
        tables=[Table("test accuracy per task, model and attention kind", rows)],
        figures=figures,
        **outcome(checks, reason, competence, seeds, quick),
        per_seed={"accuracy": {" / ".join(k): a for k, a in acc_seeds.items()}},
        metrics={"accuracy": {" / ".join(k): a for k, a in accs.items()}},
        findings=[
            f"Hard attention on counting: {accs[(COUNT, one, hard)]:.3f} with one head, "
            f"{accs[(COUNT, deep, hard)]:.3f} with 2 layers x 4 heads: "
            + (
                "several one-position lookups together approximate a count."
                if accs[(COUNT, deep, hard)] > accs[(COUNT, one, hard)] + 0.1
                else "more hard heads did not help."
            ),
            "Without the straight-through estimator the argmax passes no gradient to W_q and "
            "W_k, so the model can only change where it looks indirectly, through the embeddings "
            "that the values also train: "
            + ", ".join(
                f"{t}, {sh}: {accs[(t, sh, frozen)]:.3f}" for t in TASKS for sh, _, _ in SHAPES
            )
            + ".",
        ],
    )
