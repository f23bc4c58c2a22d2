"""Experiment ``nonlinearity``: stacked attention without the feed-forward net collapses to one
linear map (000 "Elementwise nonlinearity"; corrected in docs/notes_errata.md E3).

Two stacked attention layers with weights A1, A2 and value maps V1, V2 (row form, y = x W^T):

    o = A2 (A1 X V1^T) V2^T = (A2 A1) X (V2 V1)^T = A* X V*^T,   A* = A2 A1 (row-stochastic)

(000 writes alpha*_ik = alpha_jk sum_j alpha_ij; the correct combined weight is
alpha*_ik = sum_j alpha2_ij alpha1_jk.) The identity is exact when the weights are given; in a real
stack A2 is computed from layer 1's output, so content-dependent softmax weights are themselves a
nonlinearity. The experiment separates the two:

(a) numerically: two and four stacked library ``SelfAttention`` layers (no W^O, no bias) equal one
    map A* X V*^T to float64 rounding; a ReLU between the layers breaks the identity.
(b) learning: the same stack (learned positions, residuals, 2 layers, no norms, a linear head on
    [cls]) with attention weights that are *fixed* with respect to the input (a learned
    position-only pattern, softmax(B)) or computed by softmax(QK^T/sqrt(d)), each with and
    without a ReLU feed-forward net, on XOR of the first two symbols and on the count of a's
    mod 3. Without the FFN and with fixed weights the model is affine in its embeddings (checked:
    f((X1 + X2)/2) = (f(X1) + f(X2))/2) and cannot learn either task.

Shapes: B batch, T length, D d_model, H heads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.lab.kit.charts import bar_chart, save_chart
from attnlab.lab.kit.fit import FitConfig, fit_classifier
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Competence, Report, Table, gated_fields, spread, spread_text
from attnlab.lab.kit.seeds import seed_list
from attnlab.lab.kit.tasks import TaskData
from attnlab.models.base import ModelOutput
from attnlab.nn import FeedForward, LearnedPositions, SelfAttention

VARIANTS = (("fixed", False), ("fixed", True), ("softmax", False), ("softmax", True))


class PositionalAttention(nn.Module):
    """Attention whose weights ignore the input: h = softmax(B) X V^T, B (T, T) learned."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(max_len, max_len))  # B
        self.v_proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        t = x.size(1)
        weights = self.logits[:t, :t].softmax(-1)  # (T, T), the same for every input
        return weights @ self.v_proj(x)  # (B, T, D)


class AttentionStack(nn.Module):
    """x = E w + P; per layer x += Attn(x) and, with ``ffn``, x += FFN(x); logits = W x_[cls].

    No norms: the only nonlinearities are the softmax of content-dependent weights and the FFN.
    """

    def __init__(
        self,
        vocab_size: int,
        n_classes: int,
        *,
        attention: str,
        ffn: bool,
        d_model: int = 32,
        n_heads: int = 4,
        n_layers: int = 2,
        max_len: int = 16,
    ):
        super().__init__()
        self.attention = attention
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_enc = LearnedPositions(max_len, d_model)
        self.attn = nn.ModuleList(
            SelfAttention(d_model, n_heads)
            if attention == "softmax"
            else PositionalAttention(d_model, max_len)
            for _ in range(n_layers)
        )
        self.ffn = nn.ModuleList(FeedForward(d_model, 4 * d_model) for _ in range(n_layers))
        self.use_ffn = ffn
        self.head = nn.Linear(d_model, n_classes)

    def embed(self, ids: Tensor) -> Tensor:
        return self.pos_enc(self.tok_emb(ids), torch.arange(ids.size(1)))  # (B, T, D)

    def from_embeddings(self, x: Tensor) -> Tensor:
        """Logits (B, C) from embedded inputs x (B, T, D)."""
        for attn, ffn in zip(self.attn, self.ffn):
            h = attn(x)
            x = x + (h.out if self.attention == "softmax" else h)
            if self.use_ffn:
                x = x + ffn(x)
        return self.head(x[:, 0])

    def forward(self, ids: Tensor) -> ModelOutput:
        return ModelOutput(self.from_embeddings(self.embed(ids)))


def collapse_gaps(n_layers: int, relu: bool, seed: int) -> tuple[float, float]:
    """max |stack(X) - A* X V*^T| for ``n_layers`` library SelfAttention layers (float64), and
    max |row sums of A* - 1|. With ``relu`` a ReLU sits between the layers."""
    with torch.no_grad():
        return _collapse_gaps(n_layers, relu, seed)


def _collapse_gaps(n_layers: int, relu: bool, seed: int) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(seed)
    d, t = 16, 6
    x = torch.randn(1, t, d, generator=gen, dtype=torch.float64)  # (1, T, D)
    h, a_star, v_star = x, torch.eye(t, dtype=torch.float64), torch.eye(d, dtype=torch.float64)
    torch.manual_seed(seed)
    for i in range(n_layers):
        layer = SelfAttention(d, 1, bias=False, out_proj=False).double()
        layer.qkv_proj.weight.normal_(0.0, 0.5)
        out, weights = layer(h, need_weights=True)  # (1, T, D), (1, 1, T, T)
        h = torch.relu(out) if relu and i < n_layers - 1 else out
        w_v = layer.qkv_proj.weight[2 * d :]  # (D, D): v = x W_v^T
        a_star = weights[0, 0] @ a_star  # A* = A_L ... A_1
        v_star = v_star @ w_v.T  # V*^T = W_v1^T ... W_vL^T
    collapsed = a_star @ x[0] @ v_star  # (T, D)
    gap = float((h[0] - collapsed).abs().max())
    return gap, float((a_star.sum(-1) - 1).abs().max())


def xor_task(n: int, length: int, rng: np.random.Generator) -> TaskData:
    """[cls] then ``length`` symbols from {a, b}; label = [first is a] XOR [second is a]."""
    symbols = rng.integers(1, 3, size=(n, length))
    labels = (symbols[:, 0] == 1) ^ (symbols[:, 1] == 1)
    ids = np.concatenate([np.zeros((n, 1), dtype=np.int64), symbols], axis=1)
    return TaskData(torch.from_numpy(ids), torch.from_numpy(labels.astype(np.int64)), 3, 2)


def mod3_task(n: int, length: int, rng: np.random.Generator) -> TaskData:
    """[cls] then ``length`` symbols from {a, b}; label = (number of a's) mod 3."""
    p = rng.random((n, 1))  # spread the counts over 0..length
    symbols = np.where(rng.random((n, length)) < p, 1, 2)
    labels = (symbols == 1).sum(axis=1) % 3
    ids = np.concatenate([np.zeros((n, 1), dtype=np.int64), symbols], axis=1)
    return TaskData(torch.from_numpy(ids), torch.from_numpy(labels.astype(np.int64)), 3, 3)


def affine_gap(model: AttentionStack, ids: Tensor) -> float:
    """max |f((X1 + X2)/2) - (f(X1) + f(X2))/2| over pairs of embedded inputs (float64)."""
    model = model.double()
    with torch.no_grad():
        x = model.embed(ids)  # (N, T, D)
        x1, x2 = x[0::2], x[1::2]
        n = min(len(x1), len(x2))
        x1, x2 = x1[:n], x2[:n]
        mid = model.from_embeddings((x1 + x2) / 2)
        avg = (model.from_embeddings(x1) + model.from_embeddings(x2)) / 2
    model.float()
    return float((mid - avg).abs().max())


N_CLASSES = {"XOR of first two": 2, "count of a mod 3": 3}
TASK_MAKERS = {"XOR of first two": xor_task, "count of a mod 3": mod3_task}


def _one_seed(seed: int, length: int, n_train: int, fit_cfg: FitConfig) -> dict:
    """Every (task, variant) trained on one seed: {(task, model name): numbers}."""
    rng = np.random.default_rng(seed)
    out = {}
    for task_name, make in TASK_MAKERS.items():
        train, test = make(n_train, length, rng), make(2000, length, rng)
        majority = test.majority_rate()
        for attention, ffn in VARIANTS:
            torch.manual_seed(seed)
            model = AttentionStack(train.vocab_size, train.n_classes, attention=attention, ffn=ffn)
            result, test_acc = fit_classifier(model, train, test, fit_cfg, seed=seed)
            name = f"{attention} weights, {'with' if ffn else 'no'} FFN"
            out[(task_name, name)] = {
                "test accuracy": test_acc,
                "majority class": majority,
                "final train loss": result.final_loss(),
                "affine gap": affine_gap(model, test.ids[:64]),
                "train s": result.seconds,
            }
    return out


@experiment("nonlinearity", notes="000 'Elementwise nonlinearity' (errata E3)")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Stacked self-attention without the feed-forward net is one linear map of the values
    (alpha* = A2 A1, V* = V2 V1), so it cannot learn what needs an elementwise nonlinearity;
    the FFN adds it."""
    torch.set_num_threads(1)
    collapse_rows = []
    for n_layers, relu in ((2, False), (4, False), (2, True)):
        gap, rows_gap = collapse_gaps(n_layers, relu, seed)
        collapse_rows.append(
            {
                "layers": n_layers,
                "between layers": "ReLU" if relu else "nothing",
                "max |stack(X) - A* X V*^T|": gap,
                "max |rowsum(A*) - 1|": rows_gap,
            }
        )
    seeds = seed_list(seed, quick)
    length, n_train = 12, (1000 if quick else 10_000)
    fit_cfg = FitConfig(steps=25 if quick else 1500, batch_size=64, lr=3e-3, warmup_steps=30)
    runs = [_one_seed(s, length, n_train, fit_cfg) for s in seeds]
    acc_seeds = {key: [r[key]["test accuracy"] for r in runs] for key in runs[0]}
    rows, accs = [], {}
    for key in runs[0]:
        per = [r[key] for r in runs]
        accs[key] = spread(acc_seeds[key])["mean"]
        rows.append(
            {
                "task": key[0],
                "model": key[1],
                "test accuracy": accs[key],
                "min-max": spread_text(acc_seeds[key]),
                "majority class": per[0]["majority class"],
                "final train loss": spread(p["final train loss"] for p in per)["mean"],
                "affine gap": max(p["affine gap"] for p in per),
                "train s": spread(p["train s"] for p in per)["mean"],
            }
        )
    chance = {t: 1 / n for t, n in N_CLASSES.items()}
    labels = {(t, m): f"{t.split()[0]}: {m.replace(' weights', '')}" for t, m in accs}
    figures = [
        save_chart(
            bar_chart(
                {labels[k]: a for k, a in accs.items()},
                ylabel="test accuracy",
                title=f"attention stacks with and without FFN ({len(seeds)} seed(s))",
                errors={labels[k]: (min(v), max(v)) for k, v in acc_seeds.items()},
                references={labels[k]: chance[k[0]] for k in accs},
                reference_label="chance (1/2 XOR, 1/3 mod 3)",
            ),
            out_dir,
            "accuracy.png",
            "Test accuracy of each variant on both tasks (mean "
            "over seeds, min-max bars); the dashed segments are chance: 1/2 for XOR, 1/3 "
            "for the count mod 3.",
        ),
    ]
    competence = [
        Competence(f"{m}, {t}", "test accuracy (training distribution)", 0.99, acc_seeds[(t, m)])
        for t, m in accs
        if "with FFN" in m
    ]
    tasks = N_CLASSES
    exact = all(r["max |stack(X) - A* X V*^T|"] < 1e-10 for r in collapse_rows[:2])
    broken = collapse_rows[2]["max |stack(X) - A* X V*^T|"] > 1e-3
    by = {(r["task"], r["model"]): r for r in rows}
    fixed_fails = all(
        by[(t, "fixed weights, no FFN")]["test accuracy"]
        < by[(t, "fixed weights, no FFN")]["majority class"] + 0.1
        for t in tasks
    )
    ffn_learns = all(by[(t, "fixed weights, with FFN")]["test accuracy"] > 0.95 for t in tasks)
    softmax_learns = [
        t for t in tasks if by[(t, "softmax weights, no FFN")]["test accuracy"] > 0.95
    ]
    verdict = "held" if exact and broken and fixed_fails and ffn_learns else "did not hold"
    if verdict == "held" and softmax_learns:
        verdict = "mixed"
    spread_note = "; per seed (min-max): " + ", ".join(
        f"{m}, {t} {spread_text(v)}" for (t, m), v in acc_seeds.items() if "no FFN" in m
    )

    def accs_of(model_name: str) -> str:
        return " and ".join(f"{by[(t, model_name)]['test accuracy']:.3f}" for t in tasks)

    reason = (
        f"two and four stacked attention layers equal one map A* X V*^T to "
        f"{max(r['max |stack(X) - A* X V*^T|'] for r in collapse_rows[:2]):.1e}; with fixed "
        f"weights and no FFN the trained stack is affine (gap "
        f"{by[(next(iter(tasks)), 'fixed weights, no FFN')]['affine gap']:.0e}) and reaches "
        f"{accs_of('fixed weights, no FFN')} on {' and '.join(tasks)} (majority "
        + " and ".join(f"{by[(t, 'fixed weights, no FFN')]['majority class']:.3f}" for t in tasks)
        + f"), with the FFN {accs_of('fixed weights, with FFN')}; softmax weights without any "
        f"FFN reach {accs_of('softmax weights, no FFN')} (means over {len(seeds)} seed(s))"
        + spread_note
        + "."
    )
    softmax_note = (
        f"Softmax weights computed from the input are a nonlinearity of their own: without any "
        f"FFN they learn {', '.join(softmax_learns)} (> 0.95), so the collapse argument only "
        "covers weights that do not depend on the input."
        if softmax_learns
        else "Softmax weights computed from the input did not learn either task without the FFN "
        "in this run (> 0.95 needed)."
    )
    return Report(
        name="nonlinearity",
        title="Nonlinearity: attention without the feed-forward net",
        claim="If we stack two self-attention layers, we get something that looks a lot like a "
        "single self-attention layer [...] So, this is just a linear combination of a linear "
        "transformation of the input, much like a single layer of self-attention! Is this good "
        "enough?",
        source="000, 'Elementwise nonlinearity' (combined weight corrected: docs/notes_errata.md "
        "E3)",
        setup=[
            "(a) library SelfAttention layers, 1 head, no W^O, no bias, float64, T = 6, D = 16, "
            "weights ~ N(0, 0.25); A_l read from each layer (need_weights).",
            f"(b) [cls] + {length} symbols from {{a, b}}; {n_train} training / 2000 test "
            "examples. 2 layers, d_model 32, 4 softmax heads or one position-only pattern, "
            "residuals, no norms, ReLU FFN of width 128 when present, linear head on [cls].",
            f"AdamW lr 3e-3, {fit_cfg.steps} steps of 64, warm-up 30 + cosine; one torch thread; "
            "each seed draws its own data and initialisation.",
            "Affine gap: max |f((X1+X2)/2) - (f(X1)+f(X2))/2| over 32 pairs of embedded test "
            "inputs in float64 (0 = the network is one affine map of its embeddings).",
        ],
        tables=[
            Table("(a) stacked attention vs the collapsed single map", collapse_rows),
            Table("(b) learning with and without the feed-forward net", rows),
        ],
        figures=figures,
        **gated_fields(verdict, reason, competence, seeds, quick),
        per_seed={"test_accuracy": {f"{t}, {m}": v for (t, m), v in acc_seeds.items()}},
        metrics={
            "collapse": [r["max |stack(X) - A* X V*^T|"] for r in collapse_rows],
            "rows": rows,
        },
        findings=[
            "000's combined weight alpha*_ik = alpha_jk sum_j alpha_ij is ill-formed (j is bound "
            "and free); the measured identity is alpha* = A2 A1 (errata E3).",
            softmax_note,
        ],
    )
