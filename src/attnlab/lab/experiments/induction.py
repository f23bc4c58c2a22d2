"""Experiment ``induction``: induction heads in a 2-layer attention-only model.

A repeated random segment, ``<bos> x_1 .. x_L g_1 .. g_m x_1 .. x_L ..``, is predictable only in
its second copy and only from the context: at the second x_i the next token x_{i+1} is the one
that followed the previous occurrence of the current token. Olsson et al. (2022) found that
attention-only Transformers learn this with two heads in series: a *previous-token head* in
layer 1 (each position attends to t - 1, so it carries "the token before me") and an *induction
head* in layer 2 that attends from x_i (second copy) to the position *after* its first
occurrence -- the head's *keys* read the previous-token information written there
(K-composition, Elhage et al. 2021) -- and copies that token. This is 000's attention as a soft
lookup, composed over two layers. The gap of m random tokens varies per sequence, so no fixed
positional offset finds the repeat.

Measured per seed on a 2-layer, 4-head attention-only decoder LM (the FFNs removed):

- in-context loss: the loss on the first copy (unpredictable: log V) and on the repeat, and the
  repeat loss during training (the phase change);
- per head: the *induction score* (mean attention from the repeat's x_i to the first copy's
  x_{i+1}) and the *previous-token score* (mean attention from t to t - 1);
- mean-ablation (``attnlab.inspect.ablate_heads``): the repeat loss with the layer-2 heads of
  induction score > SCORE mean-ablated, against as many other layer-2 heads where they exist, as
  the fraction of the in-context gain (first-copy loss - repeat loss) that the ablation removes;
- the copying control (it can fail): one token of the first copy, x_{j+1}, is replaced by
  another token y; a model that copies what followed the previous occurrence predicts y at the
  second copy's x_j, a model that found the answer some other way does not;
- layer 1 by *path patching*: a layer-1 head's output is replaced by its mean only along the
  path into the layer-2 induction heads' keys (their keys are computed from the residual stream
  with that head mean-ablated, everything else clean: ``inspect.ablate_heads`` +
  ``inspect.run_with_cache`` give the patched keys, ``inspect.intervene`` puts them in), for
  the previous-token heads and for the other layer-1 heads; the same along the queries' path.

Shapes: N sequences, B batch, T = 2 L + M + 1, V vocabulary, H heads, Dh head width.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.ticker import MaxNLocator
from torch import Tensor, nn

from attnlab import inspect
from attnlab.config import ModelConfig
from attnlab.lab.kit.charts import save_chart, seeds_bars, seeds_chart
from attnlab.lab.kit.fit import FitConfig, fit, lm_loss
from attnlab.lab.kit.gating import recorded_competence, train_gated
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Report, Table, Threshold
from attnlab.lab.kit.seeds import resolved, spread, spread_text, start_seeds
from attnlab.lab.kit.verdict import Competence, outcome
from attnlab.models import build_model

BOS = 0
SCORE = 0.3  # an induction (previous-token) head puts at least this much weight on its target
REPEAT_LOSS = 0.5  # competence: loss on the repeat (nats), the only learnable part of the data
TOLERANCE = 0.05  # step doubling: the repeat loss (validation) moves by at most this (nats)
GAIN = 1.0  # the repeat's loss at least this far below the first copy's (nats)
REMOVED = 0.5  # ablation "removes the effect": at least half the in-context gain is lost
COPY = 0.5  # copying control: the substituted token predicted at least this often
PATHS = ("K", "Q")  # the layer-2 inputs a layer-1 head's output is patched along
LRS = (3e-4, 1e-3, 3e-3)  # swept on the first seed (up to three extensions past an edge)
MAX_EXTENSIONS = 3
STEPS = 2000
ARM = "2-layer attention-only LM"
COST = (
    "Full run: `PYTHONPATH=src python -m attnlab experiment induction` (no text data: the "
    "sequences are generated). 3 seeds; the learning-rate sweep of 3 rates on seed 0, seeds 1 "
    "and 2 at the chosen rate, seed 0 again at twice the steps, two jobs at a time. Estimated "
    "~10 min on 2 idle cores (a 2000-step job with its analysis ~2-3 min; ~3 min more for "
    "each rate the sweep adds past an edge, at most 3)."
)
THRESHOLDS = [
    Threshold(
        "an induction head: its induction score (attention from the repeat's x_i to the first "
        "copy's x_{i+1})",
        f"> {SCORE}",
        "lab choice: Olsson et al. 2022 define induction heads by this prefix-matching "
        "behaviour (with copying) without a fixed cut-off",
    ),
    Threshold(
        "in-context learning: the repeat's loss below the first copy's",
        f"by more than {GAIN} nats on every seed",
        "lab choice (Olsson et al. 2022 measure the in-context learning score as a loss "
        "difference between late and early tokens)",
    ),
    Threshold(
        "ablating the induction heads removes the effect",
        f">= {REMOVED} of the in-context gain on every seed",
        "Olsson et al. 2022, Argument 4 (ablations): in small attention-only models, "
        "ablating the induction heads at test time removes most of the in-context learning",
    ),
    Threshold(
        "the heads copy: with x_{j+1} of the first copy replaced by y, the model predicts y at "
        "the second copy's x_j",
        f">= {COPY} of the sequences on every seed (chance 1/(V-1))",
        "Olsson et al. 2022, the definition of an induction head (prefix matching and "
        "copying); the rate is a lab choice",
    ),
    Threshold(
        "the previous-token heads help through the induction heads' keys: the repeat loss "
        "with their output mean-ablated along the key path only, against as many other "
        "layer-1 heads along the same path",
        "more of the in-context gain removed, the seed ranges not overlapping (resolved)",
        "Olsson et al. 2022 and Elhage et al. 2021 ('A Mathematical Framework for "
        "Transformer Circuits'): induction heads use K-composition with a previous-token head",
    ),
]


class NoFeedForward(nn.Module):
    """The feed-forward sublayer removed: f(x) = 0, so h + f(LN(h)) = h (attention only)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)


def repeated_segments(
    n: int, length: int, vocab: int, rng: np.random.Generator, max_gap: int = 0
) -> tuple[Tensor, Tensor]:
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
    """2 pre-norm layers, 4 heads, rotary positions, the feed-forward sublayers removed."""
    cfg = ModelConfig(
        kind="decoder_lm",
        vocab_size=vocab,
        d_model=32 if quick else 64,
        n_heads=4,
        n_layers=2,
        max_len=width,
        positional="rotary",
    )
    model = build_model(cfg)
    for block in cast(nn.ModuleList, model.blocks):
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
def head_scores(
    model: nn.Module, ids: Tensor, second: Tensor, length: int
) -> tuple[Tensor, Tensor]:
    """(induction scores (layers, H), previous-token scores (layers, H)) from the attention
    weights A: the mean weight from the repeat's x_i to the first copy's x_{i+1} (index i + 1,
    the token after the previous occurrence), and from every position t >= 1 to t - 1."""
    model.eval()
    _, cache = inspect.run_with_cache(model, ids, names="*.A")
    rows, q = _repeat_queries(second, length)  # (N, L - 1)
    keys = torch.arange(2, length + 1).expand_as(q)  # the first copy's x_2..x_L
    ind, prev = [], []
    for i in range(len(cast(nn.ModuleList, model.blocks))):
        a = cache[f"blocks.{i}.self_attn.A"]  # (N, H, T, T)
        ind.append(a[rows, :, q, keys].mean(dim=(0, 1)))  # (N, L - 1, H) -> (H,)
        t = torch.arange(1, a.size(-1))
        prev.append(a[:, :, t, t - 1].mean(dim=(0, 2)))  # (N, H, T - 1) -> (H,)
    return torch.stack(ind), torch.stack(prev)


def _ablated(
    model: nn.Module, heads: list[tuple[int, int]], data: tuple[Tensor, Tensor], length: int, means
) -> tuple[float, float]:
    """(first-copy loss, repeat loss) with ``heads`` mean-ablated: each head's output A_h V_h
    replaced by its mean over the reference sequences ``means`` (the heads' average
    contribution stays, what they read from this sequence is gone)."""
    with inspect.ablate_heads(model, heads, mode="mean", means=means):
        return half_losses(model, *data, length)


def ablation(
    model: nn.Module,
    layer: int,
    scores: list[float],
    data: tuple[Tensor, Tensor],
    length: int,
    rng: np.random.Generator,
    means,
) -> dict:
    """Mean-ablate the heads of ``layer`` whose score exceeds SCORE, then as many heads drawn at
    random from the layer's other heads: {"heads", "others", "loss", "first", "other loss"}
    (losses on the repeat, and on the first copy with the chosen heads ablated; None where
    there is no head to ablate)."""
    chosen = [h for h, s in enumerate(scores) if s > SCORE]
    rest = [h for h in range(len(scores)) if h not in chosen]
    others = sorted(rng.permutation(rest)[: len(chosen)].tolist()) if chosen else []
    out: dict[str, Any] = {
        "heads": chosen,
        "others": others,
        "loss": None,
        "first": None,
        "other loss": None,
    }
    if chosen:
        out["first"], out["loss"] = _ablated(
            model, [(layer, h) for h in chosen], data, length, means
        )
    if others:
        out["other loss"] = _ablated(model, [(layer, h) for h in others], data, length, means)[1]
    return out


@torch.no_grad()
def single_and_cumulative(
    model: nn.Module, induction: list[float], data: tuple[Tensor, Tensor], length: int, means
) -> tuple[list[list[float]], list[float]]:
    """(repeat loss with each head mean-ablated alone, [layer][head]; repeat loss with the k
    best layer-2 induction heads mean-ablated together, k = 1..H)."""
    layers, n_heads = len(cast(nn.ModuleList, model.blocks)), len(induction)
    single = [
        [_ablated(model, [(layer, h)], data, length, means)[1] for h in range(n_heads)]
        for layer in range(layers)
    ]
    order = sorted(range(n_heads), key=lambda h: -induction[h])
    cumulative = [
        _ablated(model, [(layers - 1, h) for h in order[:k]], data, length, means)[1]
        for k in range(1, n_heads + 1)
    ]
    return single, cumulative


def sizes(quick: bool) -> tuple[int, int, int]:
    """(segment length L, vocabulary V, largest gap M)."""
    return (8, 16, 4) if quick else (20, 64, 10)


def fit_config(quick: bool, lr: float, steps: int) -> FitConfig:
    return FitConfig(steps=steps, batch_size=64, lr=lr, warmup_steps=10 if quick else 100)


def substituted(
    ids: Tensor, second: Tensor, length: int, vocab: int, rng: np.random.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """The copying control's input: per row, the first copy's x_{j+1} (j ~ U{1..L-1}) replaced
    by another token y; returns (ids (N, T), the index of the second copy's x_j (N,), y (N,))."""
    rows = torch.arange(ids.size(0))
    j = torch.from_numpy(rng.integers(1, length, size=ids.size(0))).long()
    old = ids[rows, j + 1]
    shift = torch.from_numpy(rng.integers(1, vocab - 1, size=ids.size(0))).long()
    y = 1 + (old - 1 + shift) % (vocab - 1)  # another of the tokens 1..V-1
    out = ids.clone()
    out[rows, j + 1] = y
    return out, second + j - 1, y


@torch.no_grad()
def copy_rate(model: nn.Module, ids: Tensor, query: Tensor, y: Tensor) -> float:
    """How often the prediction at ``query`` is ``y`` (the token after the previous occurrence)."""
    model.eval()
    logits = model(ids[:, :-1]).logits  # (N, T - 1, V)
    return float((logits[torch.arange(ids.size(0)), query].argmax(-1) == y).float().mean())


@torch.no_grad()
def path_patched(
    model: nn.Module,
    sources: list[int],
    targets: list[int],
    path: str,
    data: tuple[Tensor, Tensor],
    length: int,
    means: Any,
) -> float:
    """The repeat loss with the layer-1 heads ``sources`` mean-ablated only along the path into
    the ``path`` ("K" or "Q") of the layer-2 heads ``targets``: that input is computed from the
    residual stream with the sources ablated, everything else from the clean one."""
    ids, second = data
    if not sources or not targets:  # nothing patched
        return half_losses(model, ids, second, length)[1]
    name = f"blocks.1.self_attn.{path}"  # (N, H, T, Dh), before the rotation
    with inspect.ablate_heads(model, [(0, h) for h in sources], mode="mean", means=means):
        patched = inspect.run_with_cache(model, ids[:, :-1], names=name)[1][name]

    def swap(value: Tensor) -> Tensor:
        value = value.clone()
        value[:, targets] = patched[:, targets]
        return value

    with inspect.intervene(model, {name: swap}):
        return half_losses(model, ids, second, length)[1]


def layer1_paths(
    model: nn.Module,
    prev: dict,
    targets: list[int],
    n_heads: int,
    data: tuple[Tensor, Tensor],
    length: int,
    means: Any,
) -> dict[str, Any]:
    """Path patching of layer 1: each head alone along each of PATHS, and the previous-token
    heads (``prev["heads"]``) against as many other layer-1 heads (``prev["others"]``) along
    the key path."""
    return {
        "per head": {
            p: [path_patched(model, [h], targets, p, data, length, means) for h in range(n_heads)]
            for p in PATHS
        },
        "prev K": path_patched(model, prev["heads"], targets, "K", data, length, means)
        if prev["heads"]
        else None,
        "other K": path_patched(model, prev["others"], targets, "K", data, length, means)
        if prev["others"]
        else None,
        "targets": targets,
    }


def analyse(model: nn.Module, seed: int, quick: bool, sets: dict[str, Tensor]) -> dict:
    """Scores, ablations, the copying control and the path patching of one trained model."""
    length, vocab, _ = sizes(quick)
    data = (sets["test"], sets["second"])
    ind, prev = head_scores(model, sets["test"][:200], sets["second"][:200], length)
    pick = np.random.default_rng(seed + 1000)  # the control heads, drawn once per seed
    _, means = inspect.run_with_cache(model, sets["train"][:500], names="*.heads")  # reference
    ablate_ind = ablation(model, 1, ind[1].tolist(), data, length, pick, means)
    ablate_prev = ablation(model, 0, prev[0].tolist(), data, length, pick, means)
    targets = ablate_ind["heads"] or [int(ind[1].argmax())]
    cf, query, y = substituted(*data, length, vocab, np.random.default_rng(seed + 2000))
    with inspect.ablate_heads(model, [(1, h) for h in targets], mode="mean", means=means):
        copy_ablated = copy_rate(model, cf, query, y)
    return {
        "induction": ind.tolist(),
        "previous": prev.tolist(),
        "ablate induction": ablate_ind,
        "ablate previous": ablate_prev,
        "single and cumulative": single_and_cumulative(model, ind[1].tolist(), data, length, means),
        "copy": copy_rate(model, cf, query, y),
        "copy ablated": copy_ablated,
        "paths": layer1_paths(model, ablate_prev, targets, ind.size(1), data, length, means),
    }


def train_job(job: tuple) -> dict:
    """One (seed, lr, steps) run: the losses on the first copy and the repeat (test), the
    repeat loss on the validation set, and, when ``analyse``, the curves and the analysis."""
    seed, lr, steps, analyse_it, quick = job
    torch.set_num_threads(1)
    length, vocab, gap = sizes(quick)
    rng = np.random.default_rng(seed)
    train, _ = repeated_segments(2000 if quick else 50_000, length, vocab, rng, gap)
    test, second = repeated_segments(200 if quick else 1000, length, vocab, rng, gap)
    valid = repeated_segments(200 if quick else 1000, length, vocab, rng, gap)
    torch.manual_seed(seed)
    model = make_model(vocab, train.size(1), quick)
    cfg = fit_config(quick, lr, steps)
    track: list[tuple[float, float]] = []  # (best layer-2 induction, best layer-1 prev) per eval

    def evaluate(m: nn.Module) -> float:
        ind, prev = head_scores(m, test[:200], second[:200], length)
        track.append((float(ind[-1].max()), float(prev[0].max())))
        return half_losses(m, test[:200], second[:200], length)[1]

    every = max(1, steps // 40) if analyse_it else 0
    result = fit(model, (train,), lm_loss, cfg, seed=seed, eval_every=every, evaluate=evaluate)
    first, repeat = half_losses(model, test, second, length)
    out = {"first": first, "repeat": repeat, "valid": half_losses(model, *valid, length)[1]}
    if not analyse_it:
        return out
    sets = {"train": train, "test": test, "second": second}
    return (
        out
        | analyse(model, seed, quick, sets)
        | {
            "steps": [s for s, _ in result.evals],
            "curve": [v for _, v in result.evals],
            "track": track,
            "log V": math.log(vocab - 1),
        }
    )


def measure(quick: bool, seed: int, data: Path | None = None) -> dict[str, Any]:
    """Train (the sweep on the first seed, the other seeds at the chosen rate, the first seed
    again at twice the steps) and analyse: plain numbers. ``data`` is unused (generated
    sequences)."""
    seeds = start_seeds(seed, quick)
    steps = 40 if quick else STEPS
    workers = 1 if quick else 2
    runs = train_gated(
        train_job,
        [ARM],
        lambda _, lr, n, s: (s, lr, n, n == steps, quick),  # the doubling run is not analysed
        _valid,
        grid=LRS,
        steps=steps,
        seeds=seeds,
        higher_is_better=False,
        workers=workers,
        chosen_on=f"repeat loss on validation sequences, seed {seeds[0]}",
        step=LRS[1] / LRS[0],
        max_extra=MAX_EXTENSIONS,
    )
    return {"seeds": seeds, "steps": steps, **runs.record(ARM, _valid)}


def _valid(run: dict[str, Any]) -> float:
    return run["valid"]


def removed_fraction(loss: float | None, clean: float, first: float) -> float | None:
    """The fraction of the in-context gain (first - clean) an ablation removes."""
    return None if loss is None else (loss - clean) / (first - clean)


def _text(values: list[float | None]) -> str:
    """spread_text over the seeds that have a value; says so when a seed has none."""
    have = [v for v in values if v is not None]
    if not have:
        return "not measured (no qualifying head on any seed)"
    missing = len(values) - len(have)
    return spread_text(have) + (f" ({missing} seed(s) without a head to ablate)" if missing else "")


def _cell(value: float | None) -> float | str:
    return "none to ablate" if value is None else value


def _competence(m: dict[str, Any]) -> Competence:
    return recorded_competence(
        m,
        ARM,
        "loss on the repeated half (nats), test sequences",
        REPEAT_LOSS,
        [r["repeat"] for r in m["runs"]],
        value=_valid,
        tolerance=TOLERANCE,
        metric="repeat loss on validation sequences (nats)",
    )


def _fractions(runs: list[dict]) -> dict[str, list[float | None]]:
    """Fractions of the in-context gain removed, per seed (None: nothing to ablate)."""
    out: dict[str, list[float | None]] = {}
    for kind in ("induction", "previous"):
        for key, label in (("loss", kind), ("other loss", f"other ({kind})")):
            out[label] = [
                removed_fraction(r[f"ablate {kind}"][key], r["repeat"], r["first"]) for r in runs
            ]
    for key in ("prev K", "other K"):
        out[key] = [removed_fraction(r["paths"][key], r["repeat"], r["first"]) for r in runs]
    return out


def _checks(m: dict[str, Any]) -> tuple[list[bool], dict[str, Any]]:
    """The claim's checks (a check that cannot be measured is left out and said so)."""
    runs = m["runs"]
    gone = _fractions(runs)
    first, repeat = [r["first"] for r in runs], [r["repeat"] for r in runs]
    found = all(r["ablate induction"]["heads"] for r in runs)
    ind, other = gone["induction"], gone["other (induction)"]
    removed = found and all(v is not None and v >= REMOVED for v in ind)
    k_prev = [v for v in gone["prev K"] if v is not None]
    k_other = [v for v in gone["other K"] if v is not None]
    k_ok = len(k_prev) == len(k_other) == len(runs)
    checks = {
        "induction heads found": found,
        "in-context gain": max(repeat) < min(first) - GAIN,
        "ablation removes it": removed,
        "the model copies": min(r["copy"] for r in runs) >= COPY,
        "layer-1 previous-token heads act through the keys": k_ok
        and resolved(k_prev, k_other)
        and spread(k_prev)["mean"] > spread(k_other)["mean"],
    }
    if all(o is not None for o in other):  # other layer-2 heads exist on every seed
        checks["specific to the induction heads"] = removed and all(
            v is not None and o is not None and v > o for v, o in zip(ind, other)
        )
    return list(checks.values()), {"checks": checks, "gone": gone}


def _reason(m: dict[str, Any], checks: dict[str, bool], gone: dict[str, Any]) -> str:
    runs, seeds = m["runs"], m["seeds"]
    log_v = runs[0]["log V"]
    first, repeat = [r["first"] for r in runs], [r["repeat"] for r in runs]
    heads_text = "; ".join(
        f"seed {s}: {[h + 1 for h in r['ablate induction']['heads']] or 'none'}"
        for s, r in zip(seeds, runs)
    )
    cum = _cumulative(runs)
    other = gone["other (induction)"]
    failed = [name for name, ok in checks.items() if not ok]
    return (
        f"over {len(seeds)} seed(s): loss on the first copy {spread_text(first)} nats (log V = "
        f"{log_v:.2f}), on the repeat {spread_text(repeat)}; layer-2 heads with induction score "
        f"> {SCORE}: {heads_text}. Mean-ablating them removes {_text(gone['induction'])} of the "
        "in-context gain (first-copy loss - repeat loss); as many other layer-2 heads: "
        + (
            _text(other)
            if any(o is not None for o in other)
            else "not measurable (no layer-2 head outside the induction heads on some seed), "
            "so specificity among layer-2 heads is not a check here"
        )
        + "; the k best induction heads together remove, for k = 1.."
        f"{len(cum)}: "
        + ", ".join(spread_text([v for v in c if v is not None]) for c in cum)
        + ". Copying control: with one token of the first copy replaced, the model predicts "
        f"the replacement at the repeat {spread_text([r['copy'] for r in runs])} of the time "
        f"(with the induction heads ablated {spread_text([r['copy ablated'] for r in runs])}). "
        "Layer 1 by path patching (mean-ablated only along the path into the induction heads' "
        f"keys): the previous-token heads remove {_text(gone['prev K'])} of the gain, as many "
        f"other layer-1 heads {_text(gone['other K'])}"
        + (
            " (resolved)."
            if checks["layer-1 previous-token heads act through the keys"]
            else " (not measured on every seed: a seed lacks a previous-token head or another "
            "layer-1 head)."
            if None in gone["prev K"] + gone["other K"]
            else " (no effect resolved: the previous-token heads' key path is not shown to "
            "matter more than other layer-1 heads')."
        )
        + f" Full mean-ablation of layer-1 heads, for reference: previous-token heads "
        f"{_text(gone['previous'])}, others {_text(gone['other (previous)'])}."
        + (f" Checks that failed: {', '.join(failed)}." if failed else "")
    )


def _cumulative(runs: list[dict]) -> list[list[float | None]]:
    return [
        [removed_fraction(r["single and cumulative"][1][k], r["repeat"], r["first"]) for r in runs]
        for k in range(len(runs[0]["induction"][1]))
    ]


def _tables(m: dict[str, Any]) -> list[Table]:
    runs, seeds = m["runs"], m["seeds"]
    rows = []
    for s, r in zip(seeds, runs):
        ai, ap = r["ablate induction"], r["ablate previous"]
        rows.append(
            {
                "seed": s,
                "loss, first copy": r["first"],
                "loss, repeat": r["repeat"],
                "L2 induction heads": str([h + 1 for h in ai["heads"]]),
                "repeat, those ablated": _cell(ai["loss"]),
                "random other L2 heads": str([h + 1 for h in ai["others"]]),
                "repeat, others ablated": _cell(ai["other loss"]),
                "L1 previous-token heads": str([h + 1 for h in ap["heads"]]),
                "repeat, L1 heads ablated": _cell(ap["loss"]),
                "random other L1 heads": str([h + 1 for h in ap["others"]]),
                "repeat, other L1 ablated": _cell(ap["other loss"]),
                "copying control": r["copy"],
                "copying, induction heads ablated": r["copy ablated"],
            }
        )
    n_heads = len(runs[0]["induction"][0])
    score_rows = [
        {
            "seed": s,
            "layer": layer + 1,
            "head": h + 1,
            "induction score": r["induction"][layer][h],
            "previous-token score": r["previous"][layer][h],
            "repeat loss, this head ablated alone": r["single and cumulative"][0][layer][h],
        }
        for s, r in zip(seeds, runs)
        for layer in range(2)
        for h in range(n_heads)
    ]
    path_rows = [
        {
            "seed": s,
            "layer-1 head": h + 1,
            "previous-token score": r["previous"][0][h],
            **{
                f"repeat loss, patched along the {p} path": r["paths"]["per head"][p][h]
                for p in PATHS
            },
            "repeat loss, fully mean-ablated": r["single and cumulative"][0][0][h],
        }
        for s, r in zip(seeds, runs)
        for h in range(n_heads)
    ]
    cumulative = [
        {"seed": s, **{f"k = {k + 1}": v for k, v in enumerate(r["single and cumulative"][1])}}
        for s, r in zip(seeds, runs)
    ]
    sweep = [{"lr": float(k), "repeat loss (validation)": v} for k, v in m["sweep"].items()]
    return [
        Table("in-context loss and ablation per seed (loss on the repeat, nats)", rows),
        Table("head scores per seed", score_rows),
        Table(
            "layer 1 by path patching: repeat loss with one layer-1 head mean-ablated only along "
            "the path into the layer-2 induction heads' keys (K) or queries (Q), and fully",
            path_rows,
        ),
        Table(
            "the k best layer-2 induction heads mean-ablated together: loss on the repeat",
            cumulative,
        ),
        Table(f"learning-rate sweep (seed {seeds[0]})", sweep),
    ]


def _figures(m: dict[str, Any], gone: dict[str, Any], out_dir: Path) -> list:
    runs, seeds = m["runs"], m["seeds"]
    log_v = runs[0]["log V"]
    steps = runs[0]["steps"]
    loss_fig = seeds_chart(
        {"loss on the repeat": (steps, [r["curve"] for r in runs])},
        xlabel="training step",
        ylabel="nats per token",
        title=f"in-context loss on the repeat ({len(seeds)} seed(s), min-max band)",
        hline=log_v,
    )
    tracks = {
        label: (steps, [[t[i] for t in r["track"]] for r in runs])
        for i, label in enumerate(
            ("best layer-2 induction score", "best layer-1 previous-token score")
        )
    }
    n_heads = len(runs[0]["induction"][0])
    per_head = {
        f"L{layer + 1} H{h + 1}": [r["induction"][layer][h] for r in runs]
        for layer in range(2)
        for h in range(n_heads)
    }
    cum = _cumulative(runs)
    ks = list(range(1, len(cum) + 1))
    cum_fig = seeds_chart(
        {"fraction of the in-context gain removed": (ks, [list(seed) for seed in zip(*cum)])},
        xlabel="layer-2 induction heads mean-ablated (best first)",
        ylabel="fraction of the gain removed",
        title="ablating induction heads one more at a time (min-max band)",
    )
    cum_fig.axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    bars = {
        label: [v for v in gone[key] if v is not None]
        for label, key in (
            ("L2 induction heads, ablated", "induction"),
            ("other L2 heads, ablated", "other (induction)"),
            ("L1 prev-token heads, K path", "prev K"),
            ("other L1 heads, K path", "other K"),
            ("L1 prev-token heads, ablated", "previous"),
            ("other L1 heads, ablated", "other (previous)"),
        )
    }
    bars = {k: v for k, v in bars.items() if v}
    return [
        save_chart(
            loss_fig,
            out_dir,
            "repeat_loss.png",
            f"Test loss on the repeated half during training, evaluated every {steps[0]} steps "
            f"(mean over seeds, min-max band); dashed: log V = {log_v:.2f}, the loss without "
            "context. The drop is the phase change where the induction circuit forms.",
        ),
        save_chart(
            seeds_chart(
                tracks,
                xlabel="training step",
                ylabel="attention weight",
                title="the heads form at the phase change (min-max band)",
            ),
            out_dir,
            "scores_during_training.png",
            "The best layer-2 induction score and the best layer-1 previous-token score during "
            "training (mean over seeds, min-max band), on the same steps as the loss.",
        ),
        save_chart(
            seeds_bars(
                per_head,
                ylabel="induction score",
                title="attention to the token after the previous occurrence (mean over seeds)",
                reference=SCORE,
                reference_label=f"threshold {SCORE}",
            ),
            out_dir,
            "induction_scores.png",
            "Induction score of every head (layer, head), mean over seeds with min-max bars "
            "(head numbers differ between seeds; the per-seed scores are in the table).",
        ),
        save_chart(
            cum_fig,
            out_dir,
            "cumulative.png",
            "Fraction of the in-context gain (first-copy loss - repeat loss) removed when the "
            "k layer-2 heads with the highest induction scores are mean-ablated together; 1 = "
            "back to no context (mean over seeds, min-max band).",
        ),
        save_chart(
            seeds_bars(
                bars,
                ylabel="fraction of the in-context gain removed",
                title="ablation and path patching",
                reference=1.0,
                reference_label="1 = no context",
            ),
            out_dir,
            "ablation.png",
            "Fraction of the in-context gain removed: the layer-2 induction heads mean-ablated "
            "vs as many other layer-2 heads (where they exist); the layer-1 previous-token "
            "heads vs as many other layer-1 heads, patched only along the path into the "
            "induction heads' keys (K path) and fully mean-ablated; mean over the seeds that "
            "have such heads, min-max bars.",
        ),
    ]


def write_up(m: dict[str, Any], out_dir: Path, quick: bool) -> Report:
    """Tables, figures, verdict and prose from :func:`measure`'s numbers."""
    runs, seeds = m["runs"], m["seeds"]
    checks, info = _checks(m)
    gone = info["gone"]
    length, vocab, gap = sizes(quick)
    competence = [_competence(m)]
    lr = competence[0].lr
    assert lr is not None
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
            f"no fixed positional offset finds it), every token uniform over {vocab - 1}; LM "
            "loss on every position (only the repeat is predictable).",
            f"Decoder-only, 2 pre-norm layers, 4 heads, d_model {32 if quick else 64}, rotary "
            "positions, the feed-forward sublayers removed (attention only).",
            f"AdamW, {m['steps']} steps of 64, warm-up + cosine; {lr.describe()} ({lr.chosen_on}); "
            f"seed {seeds[0]} also trained for {2 * m['steps']} steps (the step doubling). "
            f"The repeat loss and the head scores on 200 test sequences every "
            f"{runs[0]['steps'][0]} steps; each seed one single-threaded process.",
            "Scores on 200 test sequences: induction = mean weight from the repeat's x_i to the "
            "first copy's x_{i+1}; previous-token = mean weight from t to t - 1.",
            "Ablation: attnlab.inspect.ablate_heads(mode='mean') replaces a head's output "
            "A_h V_h (before W^O) by its mean over 500 training sequences; 'induction heads' = "
            f"layer-2 heads with induction score > {SCORE}, compared with as many other layer-2 "
            "heads drawn at random where layer 2 has them.",
            "Copying control: per test sequence one token x_{j+1} of the first copy is replaced "
            "by another token y; the check is how often the model predicts y at the second "
            "copy's x_j. A model that got the repeat right by any means other than copying what "
            "followed the previous occurrence fails it.",
            "Path patching of layer 1: the layer-2 induction heads' keys (or queries) are "
            "recomputed from the residual stream with the chosen layer-1 heads mean-ablated "
            "(ablate_heads + run_with_cache of blocks.1.self_attn.K), and put into an otherwise "
            "clean run (inspect.intervene); the previous-token heads (score > "
            f"{SCORE}) against as many other layer-1 heads drawn at random.",
        ],
        thresholds=THRESHOLDS,
        tables=_tables(m),
        figures=_figures(m, gone, out_dir),
        **outcome(checks, _reason(m, info["checks"], gone), competence, seeds, quick, arms=[ARM]),
        per_seed={
            "first": [r["first"] for r in runs],
            "repeat": [r["repeat"] for r in runs],
            "top_induction": [max(r["induction"][1]) for r in runs],
            "top_previous": [max(r["previous"][0]) for r in runs],
            "removed": gone,
            "removed_cumulative": _cumulative(runs),
            "copy": [r["copy"] for r in runs],
        },
        metrics={
            "log_v": runs[0]["log V"],
            "checks": info["checks"],
            "induction": [r["induction"] for r in runs],
            "previous": [r["previous"] for r in runs],
            "curve_steps": runs[0]["steps"],
            "curves": [r["curve"] for r in runs],
            "lr": lr.chosen,
        },
    )


@experiment(
    "induction",
    notes="000 'The key-query-value self-attention mechanism'; Olsson et al. 2022",
)
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """A 2-layer attention-only model trained on repeated random segments develops induction
    heads (attending to the token after the previous occurrence); the loss drops on the repeat,
    ablating those heads removes the effect, the model copies what followed the previous
    occurrence, and the layer-1 previous-token heads act through the induction heads' keys."""
    return write_up(measure(quick, seed, data), out_dir, quick)
