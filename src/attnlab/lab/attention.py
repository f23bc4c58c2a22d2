"""Experiment ``attention``: soft vs hard attention (004 Sec. 1.2, "soft attention ... hard
attention").

004 eq. 9: Attention(Q, K, V; a) = a(Q K^T / sqrt(d_q)) V with a(.) applied row-wise; soft attention
uses the softmax, hard attention "returns a one-hot vector for each row with the j* = argmax_j
<q_i, k_j> element equal to 1 ... exactly an information retrieval system". So hard attention
should suffice when the answer is *one* value looked up by key, and fail when the answer needs
an *average* of many values. Hard attention's argmax has zero gradient; ``straight_through=True``
backpropagates the softmax's gradient instead (the straight-through estimator), ``False`` leaves
the queries and keys without any gradient.

Tasks (:mod:`attnlab.lab.tasks`): key-value lookup (query key at position 0, then (key, value)
pair tokens; predict the value) and counting (a [cls] token then a/b symbols; predict how many
a's). Models: ``ModelConfig(kind="classifier", attention="softmax" | "hardmax",
straight_through=...)`` reading position 0.

Shapes: N examples, T length, D d_model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from attnlab.config import ModelConfig
from attnlab.lab.charts import bar_chart, save_chart
from attnlab.lab.fit import FitConfig, accuracy, classification_loss, fit
from attnlab.lab.registry import experiment
from attnlab.lab.report import Report, Table
from attnlab.lab.tasks import counting, kv_lookup
from attnlab.models import build_model

VARIANTS = (
    ("soft (softmax)", "softmax", True),
    ("hard, straight-through", "hardmax", True),
    ("hard, no gradient to q, k", "hardmax", False),
)
LOOKUP, COUNT = "key-value lookup", "count the a's"
TASKS = (LOOKUP, COUNT)


def make_task(name: str, n: int, rng: np.random.Generator):
    if name == LOOKUP:
        return kv_lookup(n, n_pairs=8, n_keys=12, n_values=10, rng=rng)
    return counting(n, length=10, rng=rng)


@experiment(
    "attention",
    claim="Hard (argmax) attention is a retrieval of one value: it suffices for key-value lookup "
    "but not for a task that needs an average of many values, where soft attention succeeds.",
    notes="004 Sec. 1.2 (soft vs hard attention), eq. 9",
)
def run(quick: bool, out_dir: Path, seed: int) -> Report:
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    fit_cfg = FitConfig(steps=25 if quick else 1500, batch_size=64, lr=3e-3, warmup_steps=50)
    rows, accs = [], {}
    for task in TASKS:
        train = make_task(task, 1000 if quick else 20_000, rng)
        test = make_task(task, 500 if quick else 2000, rng)
        majority = float(torch.bincount(test.labels).max()) / len(test.labels)
        for label, activation, ste in VARIANTS:
            torch.manual_seed(seed)
            cfg = ModelConfig(kind="classifier", vocab_size=train.vocab_size,
                              n_classes=train.n_classes, d_model=32, n_heads=4, n_layers=2,
                              d_ff=128, max_len=16, pooling="cls", attention=activation,
                              straight_through=ste)  # fmt: skip
            model = build_model(cfg)
            result = fit(model, (train.ids, train.labels), classification_loss, fit_cfg,
                         seed=seed)  # fmt: skip
            acc = accuracy(model, test.ids, test.labels)
            accs[(task, label)] = acc
            rows.append({"task": task, "attention": label, "test accuracy": acc,
                         "majority class": majority, "final train loss": result.final_loss(),
                         "train s": result.seconds})  # fmt: skip
    figures = [save_chart(
        bar_chart({f"{t.split()[0]}: {v}": accs[(t, v)] for t in TASKS for v, _, _ in VARIANTS},
                  ylabel="test accuracy", title="soft vs hard attention"),
        out_dir, "accuracy.png", "Test accuracy per task and attention kind.")]  # fmt: skip
    lookup_hard = accs[(LOOKUP, "hard, straight-through")]
    lookup_soft = accs[(LOOKUP, "soft (softmax)")]
    count_hard = accs[(COUNT, "hard, straight-through")]
    count_soft = accs[(COUNT, "soft (softmax)")]
    checks = [lookup_hard > 0.9, count_soft > 0.9, count_hard < count_soft - 0.2]
    verdict = "held" if all(checks) else ("did not hold" if not any(checks) else "mixed")
    no_ste = {t: accs[(t, "hard, no gradient to q, k")] for t in TASKS}
    reason = (
        f"on key-value lookup hard attention (straight-through) reaches {lookup_hard:.3f} vs "
        f"{lookup_soft:.3f} soft; on counting, which needs an average, hard reaches "
        f"{count_hard:.3f} vs {count_soft:.3f} soft; without the straight-through gradient "
        f"hard attention reaches {no_ste[LOOKUP]:.3f} and "
        f"{no_ste[COUNT]:.3f}."
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
            "Classifier reading position 0: 2 pre-norm layers, d_model 32, 4 heads, d_ff 128, "
            f"learned positions; AdamW lr 3e-3, {fit_cfg.steps} steps of 64, warm-up 50 + "
            "cosine; the same seed for every variant; one torch thread.",
        ],
        tables=[Table("test accuracy per task and attention kind", rows)],
        figures=figures,
        verdict=verdict,
        verdict_reason=reason,
        metrics={"accuracy": {f"{t} / {v}": a for (t, v), a in accs.items()}},
    )
