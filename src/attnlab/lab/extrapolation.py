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

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.lab.charts import line_chart, save_chart
from attnlab.lab.fit import FitConfig, fit
from attnlab.lab.registry import experiment
from attnlab.lab.report import Report, Table
from attnlab.models import build_model
from attnlab.viz import attention_maps, plot_attention

KINDS = ("learned", "sinusoidal", "rotary", "none")
PAD, BOS, EOS, SEP = 0, 1, 2, 3
FIRST_SYMBOL = 4  # symbols are ids 4 .. 4 + n_symbols - 1


def copy_examples(n: int, lengths: np.ndarray | list[int], n_symbols: int,
                  rng: np.random.Generator) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``n`` copy sequences (ids (N, T), right-padded) and their targets (N, T - 1), -100
    everywhere except the copy half: target t is ids[t + 1] for t + 1 inside the copy."""
    lengths = np.asarray(lengths)
    longest = 2 * int(lengths.max()) + 3
    ids = np.full((n, longest), PAD, dtype=np.int64)
    targets = np.full((n, longest - 1), -100, dtype=np.int64)
    for row, k in enumerate(lengths[:n]):
        symbols = FIRST_SYMBOL + rng.permutation(n_symbols)[:k]  # distinct symbols
        seq = [BOS, *symbols, SEP, *symbols, EOS]
        ids[row, : len(seq)] = seq
        targets[row, k + 1 : 2 * k + 2] = seq[k + 2 : 2 * k + 3]  # x_1 .. x_n <eos> after SEP
    return torch.from_numpy(ids), torch.from_numpy(targets)


def copy_loss(model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
    """-log p(copy token | prefix), averaged over the copy half (000 LM loss, masked)."""
    ids, targets = batch
    logits = model(ids[:, :-1]).logits  # (B, T - 1, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


@torch.no_grad()
def copy_accuracy(model: nn.Module, ids: Tensor, targets: Tensor) -> tuple[float, float]:
    """(per-token accuracy on the copy half, exact match of whole copies), teacher-forced."""
    model.eval()
    pred = model(ids[:, :-1]).logits.argmax(-1)  # (N, T - 1)
    keep = targets != -100
    hit = (pred == targets) | ~keep
    return float((pred == targets)[keep].float().mean()), float(hit.all(dim=1).float().mean())


def model_config(kind: str, vocab_size: int, max_len: int, quick: bool) -> ModelConfig:
    d = 32 if quick else 64
    return ModelConfig(kind="decoder_lm", vocab_size=vocab_size, d_model=d, n_heads=4,
                       n_layers=2, d_ff=4 * d, max_len=max_len, positional=kind)  # fmt: skip


def position_table(model: nn.Module) -> Tensor | None:
    """The learned position table P (max_len, D) of a decoder LM, or None for other kinds."""
    table = getattr(model.embed.pos_enc, "table", None)
    return table.weight if isinstance(table, nn.Embedding) else None


@experiment(
    "extrapolation",
    claim="Learned position vectors exist only for indices seen in training, so a model with "
    "them fails on longer inputs; a pre-defined function (sinusoids) is defined everywhere "
    "and might be preferred; rotary (relative) positions are expected to degrade least.",
    notes="004 'Position representations'",
)
def run(quick: bool, out_dir: Path, seed: int) -> Report:
    torch.set_num_threads(1)  # small models: a second thread costs more than it gives
    n_train_max = 6 if quick else 16  # N
    test_lengths = [2, 4, 6, 9, 12] if quick else [4, 8, 12, 16, 20, 24, 28, 32]
    n_symbols = 2 * n_train_max + 8  # distinct symbols, even at n = 2N
    vocab, max_len = FIRST_SYMBOL + n_symbols, 2 * max(test_lengths) + 3
    rng = np.random.default_rng(seed)
    n_train = 2000 if quick else 30000
    train = copy_examples(n_train, rng.integers(1, n_train_max + 1, n_train), n_symbols, rng)
    tests = {k: copy_examples(200, [k] * 200, n_symbols, rng) for k in test_lengths}
    fit_cfg = FitConfig(steps=60 if quick else 1500, batch_size=32 if quick else 64, lr=3e-3,
                        warmup_steps=10 if quick else 100)  # fmt: skip
    token_acc: dict[str, list[float]] = {}
    exact: dict[str, list[float]] = {}
    rows, models, moved = [], {}, {}
    for i, kind in enumerate(KINDS):
        torch.manual_seed(seed + i)
        model = build_model(model_config(kind, vocab, max_len, quick))
        table = position_table(model)
        before = None if table is None else table.detach().clone()
        result = fit(model, train, copy_loss, fit_cfg, seed=seed)
        if table is not None:  # rows at or past the longest training sequence (2N + 2 tokens)
            moved[kind] = float((table.detach() - before)[2 * n_train_max + 2 :].abs().max())
        scores = [copy_accuracy(model, *tests[k]) for k in test_lengths]
        token_acc[kind] = [s[0] for s in scores]
        exact[kind] = [s[1] for s in scores]
        models[kind] = model
        rows.append({"positions": kind, "final train loss": result.final_loss(),
                     **{f"n={k}": a for k, a in zip(test_lengths, token_acc[kind])}})  # fmt: skip
    exact_rows = [{"positions": kind, **{f"n={k}": a for k, a in zip(test_lengths, exact[kind])}}
                  for kind in KINDS]  # fmt: skip
    seen = [j for j, k in enumerate(test_lengths) if k <= n_train_max]
    unseen = [j for j, k in enumerate(test_lengths) if k > n_train_max]
    inside = {k: float(np.mean([token_acc[k][j] for j in seen])) for k in KINDS}
    outside = {k: float(np.mean([token_acc[k][j] for j in unseen])) for k in KINDS}
    fig = line_chart({k: (test_lengths, token_acc[k]) for k in KINDS}, xlabel="copied length n "
                     f"(trained on n <= {n_train_max})", ylabel="copy accuracy per token",
                     title="Copying beyond the training length")  # fmt: skip
    fig.axes[0].axvline(n_train_max, color="gray", linestyle="--", linewidth=1)
    figures = [save_chart(fig, out_dir, "accuracy_vs_length.png", "Per-token copy accuracy "
                          "against the copied length n; the dashed line is the longest "
                          "training n.")]  # fmt: skip
    longest = test_lengths[-1]
    ids = tests[longest][0][0]
    labels = ["<bos>"] + [f"s{int(t) - FIRST_SYMBOL}" for t in ids[1 : longest + 1]]
    labels += ["|"] + labels[1:] + ["<eos>"]
    for kind in ("rotary", "learned"):
        maps = attention_maps(models[kind], ids[: 2 * longest + 2])
        fig = plot_attention(maps.self_attn[-1], labels[:-1], labels[:-1],  # (H, T, T)
                             title=f"positions={kind}, last layer, n={longest}")  # fmt: skip
        figures.append(save_chart(fig, out_dir, f"attention_{kind}.png", f"Last-layer "
                                  f"self-attention of the {kind} model on a copy of length "
                                  f"{longest} (twice the training length): a working copy "
                                  "attends from each copied token to the symbol after its "
                                  "first occurrence."))  # fmt: skip
    unlearned = [k for k in KINDS if inside[k] < 0.9]  # no extrapolation question to ask
    beats = [k for k in ("sinusoidal", "rotary")
             if k not in unlearned and outside[k] > outside["learned"] + 0.05]  # fmt: skip
    verdict = "held" if len(beats) == 2 else ("mixed" if beats else "did not hold")
    reason = ("per-token copy accuracy on lengths the model never saw (n > N = "
              f"{n_train_max}): " + ", ".join(f"{k} {outside[k]:.2f}" for k in KINDS)
              + "; on trained lengths: " + ", ".join(f"{k} {inside[k]:.2f}" for k in KINDS)
              + (f" (not learned within the budget: {', '.join(unlearned)})" if unlearned else "")
              + ".")  # fmt: skip
    return Report(
        name="extrapolation",
        title="Length extrapolation: learned vs sinusoidal vs rotary positions",
        claim="in the case where unseen index can occur in test time, a pre-defined function "
        "might be preferred",
        source="004, 'Position representations'",
        setup=[
            f"Task: a decoder-only LM copies n distinct symbols after a separator, <bos> x_1..x_n "
            f"| x_1..x_n <eos>; loss and accuracy on the copy half only. {n_train} training "
            f"sequences with n uniform in 1..{n_train_max} (N = {n_train_max}); 200 test "
            f"sequences per n in {test_lengths}.",
            f"Model: {model_config('rotary', vocab, max_len, quick).n_layers} layers, d_model "
            f"{model_config('rotary', vocab, max_len, quick).d_model}, 4 heads, max_len "
            f"{max_len} (>= the longest test sequence) for every position kind.",
            f"Learned rows for positions >= {2 * n_train_max + 2} exist but are never looked up "
            "in training: they keep their N(0, 0.02) initialisation (measured change after "
            "training: " + (", ".join(f"{k} {v:.1e}" for k, v in moved.items()) or "n/a") + ").",
            f"AdamW lr {fit_cfg.lr:g}, {fit_cfg.steps} steps of {fit_cfg.batch_size}, warm-up "
            f"{fit_cfg.warmup_steps} + cosine; one torch thread. 'none' = no position signal "
            "at all (a causal mask alone still leaks order).",
        ],
        tables=[
            Table("per-token copy accuracy by copied length n", rows),
            Table("exact match of the whole copy by n", exact_rows),
        ],  # fmt: skip
        figures=figures,
        verdict=verdict,
        verdict_reason=reason,
        metrics={
            "token_accuracy": token_acc,
            "exact_match": exact,
            "inside": inside,
            "outside": outside,
            "learned_rows_moved": moved,
            "lengths": test_lengths,
        },  # fmt: skip
        findings=[
            "Mean per-token accuracy beyond the training length: "
            + ", ".join(f"{k} {outside[k]:.3f}" for k in KINDS)
            + ".",
            "Learning speed differs by position kind: with the same budget the sinusoidal model "
            f"reaches {inside['sinusoidal']:.2f} per-token accuracy on trained lengths against "
            f"{inside['learned']:.2f} (learned) and {inside['rotary']:.2f} (rotary). Development "
            "probes (not repeated here): at N = 8 after 400 steps, sinusoids scaled down 50x to "
            "the size of the N(0, 0.02) token embeddings gave 0.61 per-token accuracy at n = 8 "
            "against 0.19 unscaled; Vaswani's sqrt(D)-scaled N(0, 1/D) tokens did not help at "
            "N = 16 (0.15 after 1000 steps). Unit-amplitude sinusoids next to small tokens slow "
            "this model down; we did not find the full cause.",
            "Sinusoids are defined at every index, but the network behind them was only trained "
            "on the first 2N + 2 of them: a pre-defined function is necessary, not sufficient, "
            "for extrapolation (Press et al. 2022 report the same for absolute sinusoids).",
        ],
    )
