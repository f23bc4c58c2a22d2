"""Experiment ``induction``: induction heads in a 2-layer attention-only model.

A repeated random segment, ``<bos> x_1 .. x_L x_1 .. x_L``, is predictable only in its second
half and only from the context: at position L + i the next token x_{i+1} is the one that
followed the previous occurrence of the current token x_i. Olsson et al. (2022) found that
attention-only Transformers learn this with two heads in series: a *previous-token head* in
layer 1 (each position attends to t - 1, so it carries "the token before me") and an *induction
head* in layer 2 that attends from x_i (second copy) to the position *after* its first
occurrence -- the head's query matches the previous-token information written there -- and
copies that token. This is 000's attention as a soft lookup, composed over two layers.

Measured per seed on a 2-layer, 4-head attention-only decoder LM (the FFNs removed):

- in-context loss: the loss on the first half (unpredictable: log V) and on the repeat;
- per head: the *induction score* (mean attention from position L + i to position i + 1, the
  token after the previous occurrence) and the *previous-token score* (mean attention to t - 1);
- ablation with ``attnlab.inspect.ablate_heads``: the loss on the repeat with the layer-2 heads
  of induction score > 0.3 zeroed, against zeroing the same number of other layer-2 heads.

Shapes: N sequences, B batch, T = 2 L + 1, V vocabulary, H heads.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import inspect
from attnlab.config import ModelConfig
from attnlab.lab.charts import bar_chart, curves_chart, save_chart
from attnlab.lab.fit import FitConfig, fit, lm_loss
from attnlab.lab.registry import experiment
from attnlab.lab.report import (
    Competence,
    Report,
    Table,
    gated_fields,
    spread,
    spread_text,
    verdict_of,
)
from attnlab.lab.seeds import run_jobs, start_seeds
from attnlab.models import build_model

BOS = 0
SCORE = 0.3  # an induction head puts at least this much weight on the token after the match
REPEAT_LOSS = 0.5  # competence: loss on the repeat (nats) once the model uses the context


class NoFeedForward(nn.Module):
    """The feed-forward sublayer removed: f(x) = 0, so h + f(LN(h)) = h (attention only)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)


def repeated_segments(n: int, length: int, vocab: int, rng: np.random.Generator,
                      max_gap: int = 0) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``<bos> x_1..x_L g_1..g_m x_1..x_L r_1..r_{M-m}`` with every token uniform over 1..V-1
    and a gap of m ~ U{0..M} random tokens between the copies (so the repeat's offset varies and
    only matching content finds it): ids (N, 2 L + M + 1), and the index of each row's second
    x_1, s = L + m + 1 (N,)."""
    width = 2 * length + max_gap + 1
    ids = rng.integers(1, vocab, size=(n, width))
    ids[:, 0] = BOS
    gaps = rng.integers(0, max_gap + 1, size=n)
    for row, m in enumerate(gaps):
        ids[row, length + m + 1 : 2 * length + m + 1] = ids[row, 1 : length + 1]
    return torch.from_numpy(ids).long(), torch.from_numpy(length + gaps + 1).long()


def make_model(vocab: int, width: int, quick: bool) -> nn.Module:
    cfg = ModelConfig(kind="decoder_lm", vocab_size=vocab, d_model=32 if quick else 64,
                      n_heads=4, n_layers=2, max_len=width)  # fmt: skip
    model = build_model(cfg)
    for block in model.blocks:
        block.ffn = NoFeedForward()
    return model


def _repeat_queries(second: Tensor, length: int) -> tuple[Tensor, Tensor]:
    """Row and position indices (N, L - 1) of the second copy's x_1..x_{L-1} (each predicts the
    next token of the copy)."""
    rows = torch.arange(second.size(0))[:, None]
    return rows, second[:, None] + torch.arange(length - 1)


@torch.no_grad()
def half_losses(model: nn.Module, ids: Tensor, second: Tensor, length: int) -> tuple[float, float]:
    """(loss on predicting x_2..x_L in the first copy, loss on predicting x_2..x_L in the
    repeat), nats per token."""
    model.eval()
    logits = model(ids[:, :-1]).logits  # (N, T - 1, V): position t predicts ids[t + 1]
    nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (N, T - 1)
    rows, q = _repeat_queries(second, length)
    return float(nll[:, 1:length].mean()), float(nll[rows, q].mean())


@torch.no_grad()
def head_scores(model: nn.Module, ids: Tensor, second: Tensor,
                length: int) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(induction scores (L, H), previous-token scores (L, H)) from the attention weights A:
    the mean weight from the repeat's x_i to the token after the first x_i (index i + 1), and
    from every position to the one before it."""
    _, cache = inspect.run_with_cache(model, ids, names="*.A")
    rows, q = _repeat_queries(second, length)  # (N, L - 1)
    keys = torch.arange(2, length + 1).expand_as(q)  # the first copy's x_2..x_L
    ind, prev = [], []
    for i in range(len(model.blocks)):
        a = cache[f"blocks.{i}.self_attn.A"]  # (N, H, T, T)
        ind.append(a[rows, :, q, keys].mean(dim=(0, 1)))  # (H,)
        t = torch.arange(1, a.size(-1))
        prev.append(a[:, :, t, t - 1].mean(dim=(0, 2)))
    return torch.stack(ind), torch.stack(prev)


def sizes(quick: bool) -> tuple[int, int, int]:
    """(segment length L, vocabulary V, largest gap M)."""
    return (8, 16, 4) if quick else (20, 64, 10)


def train_job(job: tuple) -> dict:
    seed, quick = job
    torch.set_num_threads(1)
    length, vocab, gap = sizes(quick)
    rng = np.random.default_rng(seed)
    train, _ = repeated_segments(2000 if quick else 50_000, length, vocab, rng, gap)
    test, second = repeated_segments(200 if quick else 1000, length, vocab, rng, gap)
    torch.manual_seed(seed)
    model = make_model(vocab, train.size(1), quick)
    cfg = FitConfig(steps=40 if quick else 2000, batch_size=64, lr=1e-3 if quick else 3e-3,
                    warmup_steps=10 if quick else 200)  # fmt: skip
    every = max(1, cfg.steps // 20)
    probe = (test[:200], second[:200])
    result = fit(model, (train,), lm_loss, cfg, seed=seed,
                 eval_at=range(every, cfg.steps + 1, every),
                 evaluate=lambda m: half_losses(m, *probe, length)[1])  # fmt: skip
    first, repeat = half_losses(model, test, second, length)
    ind, prev = head_scores(model, test[:200], second[:200], length)
    last = len(model.blocks) - 1
    chosen = [h for h in range(ind.size(1)) if ind[last, h] > SCORE]
    others = [h for h in range(ind.size(1)) if h not in chosen][: max(1, len(chosen))]
    ablated = {}
    for name, heads in (("induction heads", chosen), ("other heads", others)):
        if heads:
            with inspect.ablate_heads(model, [(last, h) for h in heads]):
                ablated[name] = half_losses(model, test, second, length)[1]
        else:
            ablated[name] = math.nan
    return {"first": first, "repeat": repeat, "induction": ind.tolist(), "previous": prev.tolist(),
            "chosen": chosen, "ablated": ablated, "curve": [v for _, v in result.evals],
            "losses": result.losses, "log V": math.log(vocab - 1)}  # fmt: skip


@experiment(
    "induction",
    claim="A 2-layer attention-only model trained on repeated random segments develops "
    "induction heads (attending to the token after the previous occurrence); the loss drops on "
    "the repeat, and ablating those heads removes the effect.",
    notes="000 'The key-query-value self-attention mechanism'; Olsson et al. 2022",
)
def run(quick: bool, out_dir: Path, seed: int) -> Report:
    seeds = start_seeds(seed, quick)
    res = run_jobs(train_job, [(s, quick) for s in seeds], 1 if quick else 2)
    runs = [res[(s, quick)] for s in seeds]
    log_v = runs[0]["log V"]
    first, repeat = [r["first"] for r in runs], [r["repeat"] for r in runs]
    top_ind = [max(r["induction"][-1]) for r in runs]
    top_prev = [max(r["previous"][0]) for r in runs]
    abl_ind = [r["ablated"]["induction heads"] for r in runs]
    abl_other = [r["ablated"]["other heads"] for r in runs]
    what = "loss on the repeated half (nats), test sequences"
    competence = [Competence("2-layer attention-only LM", what, REPEAT_LOSS, repeat,
                             higher_is_better=False)]  # fmt: skip
    found = all(r["chosen"] for r in runs)
    drops = max(repeat) < min(first) - 1.0
    removed = found and all(a > o + 1.0 for a, o in zip(abl_ind, abl_other))
    checks = [found, drops, removed]
    verdict = verdict_of(checks)
    reason = (
        f"over {len(seeds)} seeds: loss on the first half {spread_text(first)} nats (log V = "
        f"{log_v:.2f}), on the repeat {spread_text(repeat)}; the best layer-2 induction score "
        f"{spread_text(top_ind)} (layer-1 previous-token score {spread_text(top_prev)}); heads "
        f"with induction score > {SCORE}: " + "; ".join(
            f"seed {s}: {r['chosen']}" for s, r in zip(seeds, runs))
        + f"; zeroing them raises the repeat loss to {spread_text(abl_ind)}, zeroing as many "
        f"other layer-2 heads to {spread_text(abl_other)}."
    )  # fmt: skip
    rows = [{"seed": s, "loss, first half": r["first"], "loss, repeat": r["repeat"],
             "induction heads (layer 2)": str(r["chosen"]),
             "repeat loss, induction heads zeroed": r["ablated"]["induction heads"],
             "repeat loss, other heads zeroed": r["ablated"]["other heads"]}
            for s, r in zip(seeds, runs)]  # fmt: skip
    score_rows = [{"seed": s, "layer": layer + 1, "head": h + 1,
                   "induction score": r["induction"][layer][h],
                   "previous-token score": r["previous"][layer][h]}
                  for s, r in zip(seeds, runs) for layer in range(2)
                  for h in range(len(r["induction"][0]))]  # fmt: skip
    length, vocab, gap = sizes(quick)
    r0 = runs[0]
    labels = {f"L{layer + 1} H{h + 1}": r0["induction"][layer][h] for layer in range(2)
              for h in range(len(r0["induction"][0]))}  # fmt: skip
    figures = [
        save_chart(bar_chart(labels, ylabel="induction score", title=f"attention to the token "
                             f"after the previous occurrence (seed {seeds[0]})",
                             reference=1 / (1.5 * length), reference_label="uniform over "
                             "the prefix (about 1/(1.5 L))"),
                   out_dir, "induction_scores.png", "Induction score of every head (layer, "
                   "head) of the first seed; the per-seed scores are in the table."),
        save_chart(curves_chart({"loss on the repeat": [r["curve"] for r in runs]},
                                title="in-context loss on the repeat during training",
                                ylabel="nats per token", smooth=1),
                   out_dir, "repeat_loss.png", "Test loss on the repeated half, evaluated 20 "
                   "times during training (mean over seeds, min-max band): it drops when the "
                   "induction circuit forms."),
        save_chart(bar_chart({"clean": spread(repeat)["mean"],
                              "induction heads zeroed": spread(abl_ind)["mean"],
                              "other heads zeroed": spread(abl_other)["mean"]},
                             ylabel="loss on the repeat (nats)", title="ablation",
                             errors={"clean": (min(repeat), max(repeat)),
                                     "induction heads zeroed": (min(abl_ind), max(abl_ind)),
                                     "other heads zeroed": (min(abl_other), max(abl_other))},
                             reference=log_v, reference_label=f"log V = {log_v:.2f} (no context)"),
                   out_dir, "ablation.png", "Loss on the repeated half with the induction heads "
                   "zeroed (attnlab.inspect.ablate_heads) vs as many other layer-2 heads, mean "
                   "over seeds with min-max bars."),
    ]  # fmt: skip
    return Report(
        name="induction",
        title="Induction heads: in-context copying in a 2-layer attention-only model",
        claim="(Olsson et al. 2022, on the key-query-value attention of 000) Two-layer "
        "attention-only Transformers learn induction heads: a head that attends to the token "
        "after the previous occurrence of the current token and copies it, with the help of a "
        "previous-token head in the layer below; they make in-context copying possible.",
        source="000, 'The key-query-value self-attention mechanism' (the lookup composed over "
        "two layers); Olsson et al. 2022",
        setup=[
            f"Sequences <bos> x_1..x_L g_1..g_m x_1..x_L r.., L = {length}, a gap of m ~ "
            f"U{{0..{gap}}} random tokens between the copies (so the repeat's offset varies and "
            "no fixed positional offset finds it), every token uniform over "
            f"{vocab - 1}; LM loss on every position (only the repeat is predictable).",
            f"Decoder-only, 2 pre-norm layers, 4 heads, d_model {32 if quick else 64}, learned "
            "positions, the feed-forward sublayers removed (attention only).",
            f"AdamW, {40 if quick else 2000} steps of 64, warm-up + cosine; the repeat loss on "
            "test sequences every 5% of training; two single-threaded runs at a time.",
            f"Ablation: attnlab.inspect.ablate_heads zeroes head outputs A_h V_h before W^O; "
            f"'induction heads' = layer-2 heads with induction score > {SCORE}.",
        ],
        tables=[
            Table("in-context loss and ablation per seed", rows),
            Table("head scores per seed", score_rows),
        ],  # fmt: skip
        figures=figures,
        **gated_fields(verdict, reason, competence, seeds, quick),
        per_seed={
            "first": first,
            "repeat": repeat,
            "top_induction": top_ind,
            "ablated_induction": abl_ind,
            "ablated_other": abl_other,
        },  # fmt: skip
        metrics={
            "log_v": log_v,
            "induction": [r["induction"] for r in runs],
            "previous": [r["previous"] for r in runs],
        },  # fmt: skip
    )
