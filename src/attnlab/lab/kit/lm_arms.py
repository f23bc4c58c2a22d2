"""Character-LM arms that differ in one architectural setting, and the checks that compare them.

Shared by ``lm_extrapolation`` (position kinds scored at 1x-8x the training length) and ``table3``
(Vaswani et al.'s Table 3 rows): both train the same small decoder-only character LM
(:func:`lm_config`) with :func:`attnlab.lab.kit.fit.fit` on every window of the training text
(each training example starts at a random character), change one setting per arm, and score
validation **bits per character**

    bpc = -(1 / N) sum_t log2 p(w_{t+1} | w_{<=t})        over the N scored characters

on *non-overlapping* windows of the validation text (:func:`bits_per_char`): every position of
every window is scored (Press et al. 2022's "nonoverlapping evaluation"), and every window length
scores the same stretch of text, so lengths differ only in how much context each prediction has.

A check of a claim compares per-seed values and lets the seed spread decide (:func:`worse`,
:func:`not_worse`, :func:`alike`): a predicted difference whose seed ranges overlap is
"unresolved", and a claim none of whose checks held, all for lack of resolution, reads "no effect
resolved" (:func:`judged`).

Shapes: N windows, B batch, T context, L evaluation length, V characters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.config import ModelConfig
from attnlab.lab.kit.corpus import text_windows, unigram_bigram
from attnlab.lab.kit.fit import FitConfig, fit, lm_loss
from attnlab.lab.kit.gating import Gated, Sweep
from attnlab.lab.kit.seeds import resolved, spread
from attnlab.lab.kit.verdict import Competence, verdict_of
from attnlab.models import build_model

LN2 = math.log(2.0)
METRIC = "validation bits/char at the training length"
TOLERANCE = round(0.05 / LN2, 3)  # doubling: 0.05 nats/char (char_lm's tolerance) in bits/char
TIE = 0.01  # bits/char: sweep scores this close to the best are tied (kit.gating.choose)
SWEEPS = {  # the gate of every arm (kit.gating): full size, and the CI-sized --quick form
    False: Sweep(grid=(1e-3, 3e-3, 1e-2), tolerance=TOLERANCE, metric=METRIC, metric_key="val",
                 factor=3.0, max_extensions=2, tie=TIE),
    True: Sweep(grid=(3e-3, 1e-2), tolerance=TOLERANCE, metric=METRIC, metric_key="val",
                max_extensions=1, tie=TIE),
}  # fmt: skip


@dataclass(frozen=True)
class LMSize:
    """The char LM and its training budget (``steps`` at scale 1; the doubling runs 2x)."""

    context: int  # T, the training length
    d_model: int
    n_layers: int
    n_heads: int
    batch: int
    steps: int
    warmup: int

    def describe(self) -> str:
        return (
            f"decoder-only pre-norm char LM, {self.n_layers} layers, d_model {self.d_model}, "
            f"{self.n_heads} heads unless the arm changes them, d_ff {4 * self.d_model}; token "
            "embeddings drawn from N(0, 1/d_model) and multiplied by sqrt(d_model) (Vaswani et "
            "al. 3.4: unit entries, like the sinusoids'), tied to the output layer; "
            f"training length T = {self.context}; AdamW (weight decay 0.01 on weight "
            f"matrices, none on embeddings), batches of {self.batch} windows drawn at random "
            f"offsets, warm-up {self.warmup} steps then cosine to lr/10"
        )


def lm_config(vocab: int, size: LMSize, max_len: int, **changes: Any) -> ModelConfig:
    """The arms' common model (token embeddings scaled by sqrt(d_model), Vaswani et al. 3.4);
    ``changes`` set the arm's own fields (n_heads, d_head, d_v, positional)."""
    fields: dict[str, Any] = dict(
        d_model=size.d_model,
        n_heads=size.n_heads,
        n_layers=size.n_layers,
        dropout=0.0,
        embed_scale=True,
    )
    fields.update(changes)
    return ModelConfig(kind="decoder_lm", vocab_size=vocab, max_len=max_len, **fields)


@torch.no_grad()
def bits_per_char(model: torch.nn.Module, ids: Tensor, length: int, batch: int = 16) -> float:
    """Validation bits/char of ``ids`` (S + 1,) cut into non-overlapping windows of ``length``:
    inputs ids[:S] viewed (N, L), targets ids[1:S+1]; every position is scored. S must be a
    multiple of ``length``."""
    s = ids.numel() - 1
    if s % length:
        raise ValueError(f"the scored text ({s} characters) is not a multiple of {length}")
    x, y = ids[:s].view(-1, length), ids[1:].view(-1, length)  # (N, L)
    model.eval()
    total = 0.0
    for i in range(0, x.size(0), batch):
        logits = model(x[i : i + batch]).logits  # (B, L, V)
        total += float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), y[i : i + batch].reshape(-1), reduction="sum"
        ))  # fmt: skip
    return total / (s * LN2)


def scored_text(val: Tensor, longest: int) -> Tensor:
    """The stretch of validation text every evaluation length scores: the validation windows
    (N, T + 1) read back as one text, cut to a multiple of ``longest`` characters plus one."""
    flat = val.flatten()
    n = (flat.numel() - 1) // longest * longest
    if n == 0:
        raise ValueError(f"the validation text is shorter than one window of {longest}")
    return flat[: n + 1]


def train_arm(
    changes: dict[str, Any],
    lr: float,
    scale: int,
    seed: int,
    quick: bool,
    data: Path | None,
    size: LMSize,
    lengths: tuple[int, ...] = (),
) -> dict[str, Any]:
    """One arm at one rate for ``scale`` x the budget on one seed: the validation bits/char at
    the training length (``val``, the gate's metric) and at each of ``lengths`` (``bpc``), the
    smoothed training loss (bits/char) and the parameter count."""
    train, val, chars, _ = text_windows(quick, size.context, data)
    longest = max((size.context, *lengths))
    text = scored_text(val, longest)
    torch.manual_seed(seed)
    model: Any = build_model(lm_config(len(chars), size, longest, **changes))
    # Vaswani et al.'s embedding scale: E ~ N(0, 1/D), so sqrt(D) E has unit entries like PE(n)
    torch.nn.init.normal_(model.embed.tok_emb.weight, 0.0, size.d_model**-0.5)
    steps = size.steps * scale
    cfg = FitConfig(steps=steps, batch_size=size.batch, lr=lr, warmup_steps=size.warmup * scale,
                    min_lr=lr / 10)  # fmt: skip
    starts = train.flatten().unfold(0, size.context + 1, 1)  # every window, (N', T + 1): a view
    result = fit(model, (starts,), lm_loss, cfg, seed=seed)
    bad = result.diverged
    return {
        "val": math.inf if bad else bits_per_char(model, text, size.context),
        "bpc": [math.inf if bad else bits_per_char(model, text, n) for n in lengths],
        "train": result.final_loss(50) / LN2,
        "curve": _thinned([v / LN2 for v in result.losses], 40),
        "params": sum(p.numel() for p in model.parameters()),
        "seconds": result.seconds,
        "diverged": bad,
    }


def _thinned(values: list[float], points: int) -> list[float]:
    """Means of ``points`` equal stretches of ``values`` (a curve small enough to store)."""
    if not values:
        return []
    k = max(1, len(values) // points)
    return [sum(values[i : i + k]) / len(values[i : i + k]) for i in range(0, len(values), k)]


def count_baselines(quick: bool, context: int, data: Path | None) -> dict[str, Any]:
    """Unigram and bigram bits/char of the validation text (add-one counts of the training
    text), the vocabulary size and where the text is from."""
    train, val, chars, source = text_windows(quick, context, data)
    uni, bi = unigram_bigram(train, val, len(chars))
    return {"unigram": uni / LN2, "bigram": bi / LN2, "vocab": len(chars), "source": source}


def competence(arm: str, g: Gated, sweep: Sweep, steps: int, bigram: float) -> Competence:
    """An arm's gate: validation bits/char at the training length at most the bigram model's on
    every seed, at its swept rate, with its step doubling."""
    return Competence(
        arm,
        f"{METRIC} at most the add-one bigram model's (the arm uses more than the previous "
        "character)",
        bigram,
        g.values("val"),
        higher_is_better=False,
        lr=g.learning_rate(sweep),
        doubling=g.doubling(sweep, steps),
    )


# -- checks of a claim, the seed spread deciding ---------------------------------------------

HELD, NOT_HELD, UNRESOLVED = "held", "did not hold", "unresolved"


@dataclass
class Check:
    """One check of a claim: what it compares and its state (held / did not hold / unresolved:
    the difference lies inside the seed spread)."""

    what: str
    state: str
    detail: str
    difference: bool = True  # the claim predicts a difference (False: it predicts none)

    def row(self) -> dict[str, str]:
        return {"check": self.what, "outcome": self.state, "numbers": self.detail}


def _means(a: list[float], b: list[float]) -> str:
    sa, sb = spread(a), spread(b)
    return (
        f"{sa['mean']:.3f} ({sa['min']:.3f}-{sa['max']:.3f}) vs "
        f"{sb['mean']:.3f} ({sb['min']:.3f}-{sb['max']:.3f})"
    )


def worse(what: str, a: list[float], b: list[float]) -> Check:
    """Predicted: ``a`` (bits/char per seed) is worse (higher) than ``b``. Held when the seed
    ranges are apart with ``a`` above; did not hold when apart the other way; else unresolved."""
    if not resolved(a, b):
        return Check(what, UNRESOLVED, _means(a, b))
    return Check(what, HELD if min(a) > max(b) else NOT_HELD, _means(a, b))


def not_worse(what: str, a: list[float], b: list[float]) -> Check:
    """Predicted: ``a`` is no worse than ``b``: did not hold only when ``a``'s seed range lies
    wholly above ``b``'s."""
    return Check(what, NOT_HELD if min(a) > max(b) else HELD, _means(a, b), difference=False)


def alike(what: str, a: list[float], b: list[float]) -> Check:
    """Predicted: no difference ("nearly identical"): held when the seed ranges overlap."""
    return Check(what, NOT_HELD if resolved(a, b) else HELD, _means(a, b), difference=False)


def judged(checks: list[Check]) -> str:
    """The verdict word of a claim's checks: held / did not hold / mixed by which held; "no
    effect resolved" when every predicted difference lies inside the seed spread and no other
    check failed (a check that predicts no difference, held, does not make that "mixed")."""
    held = [c.state == HELD for c in checks]
    differences = [c for c in checks if c.difference]
    others_held = all(c.state == HELD for c in checks if not c.difference)
    if differences and all(c.state == UNRESOLVED for c in differences) and others_held:
        return "no effect resolved"
    if not any(held) and all(c.state == UNRESOLVED for c in checks):
        return "no effect resolved"
    return verdict_of(held)
