"""Experiment ``heads``: multi-head vs single-head attention at the same width (000 "Multi-head
Self-Attention"; 001 "Multi-head Attention"; 004 eq. 13).

000: "multi-head self-attention is no more expensive than single-head due to the low-rankness of
the transformations"; 001: in "mary gave roses to susan" the word *gave* relates differently to
*mary* and to *susan*, and "in a single self-attention operation, all this information just gets
summed together".

(a) Cost: FLOPs of one ``SelfAttention`` forward + backward counted by
    ``torch.utils.flop_counter`` (explicit path, so the attention matmuls are visible), and the
    closed form per forward pass, for H = 1, 2, 4, 8 heads at d_model 128:

        FLOPs = 2 B T D (3D)  +  2 * 2 B T^2 (H Dh)  +  2 B T D^2,    H Dh = D

    which does not depend on H; plus the measured wall time of forward + backward (fused path).
(b) Task: two tokens back at once. Random tokens x_1..x_T; at every position t > 2 two linear
    read-outs of the layer's output y_t must name x_{t-1} (relation 1) and x_{t-2} (relation 2).
    One layer, d_model 32, with 1, 2 or 4 heads (same parameters), attention only
    (y = x + MultiHead(x), 001's operation) or a full pre-norm Transformer block (with its FFN).

Why one head cannot: a head gives one attention distribution per query, so its output at t is
one mixture  y_t = x_t + W^O sum_j a_tj W^V x_j.  To serve both relations it must split its
weight, a on t-1 and b on t-2, and both tokens arrive in the same subspace:
a f(x_{t-1}) + b f(x_{t-2}) + (terms that do not depend on them). With fixed weights a > b no
linear read-out names the token with the smaller weight for all pairs: for the scores
s_c = a G[c, u] + b G[c, v] + k_c of any read-out G, k, "v wins" over three tokens {u, v, w}
needs, summed over the three pairs in both orders, off-diagonal(G) > 2 diagonal(G) (v beats u)
and 2 diagonal(G) > off-diagonal(G) (v beats the third token) -- a contradiction (with a = b the
order is lost altogether). Only weights that depend on the tokens' content (keys see the token)
let some pairs through, so one head names one relation and guesses at the other. With H heads
each relation gets its own distribution and its own D/H-dimensional value subspace. The FFN of a
full block is nonlinear and may separate the mixture, which arm (b) measures too.

That argument is not the competence check: the 1-head attention-only arm (the arm the claim
expects to fail) must be shown converged, by measurement. Its training has a saddle: the head
first serves one relation alone (loss log V: one read-out at chance, attention saturated on one
position) and stays there for a number of steps that varies by seed (a few hundred to over 5000
at V = 64), then falls to a loss near 1 nat that keeps creeping down slowly. So:

    converged at 2S  <=>  loss(S) - loss(2S) <= PLATEAU  and  both(2S) - both(S) <= GAIN
                          and  loss(2S) <= log V - SADDLE        (S, 2S: fresh runs, per seed)

checked per seed on a ladder S = 4 x (the other arms' steps), 2S, then 4S, 8S (the cap) for a
seed whose check at the previous pair fails; the last part keeps a flat loss on the saddle from
passing as convergence. A seed that misses at the cap leaves the verdict inconclusive. PLATEAU
is 0.025 nats: the loss sums two read-outs' cross-entropies, so that is ~0.0125 nats per read-out
per doubling, in line with the lab's other doublings (0.02 nats per token); the 0.08-0.09 nats
the arm dropped from 8000 to 16000 steps in an earlier full run (0.1 allowed then) is a curve
still falling, and fails it. The cap, 8S = 64000 steps, is what the 60-minute budget affords
(the COST constant). Why a ladder and
not a faster recipe: in single-seed probes on the slowest seed (2000 steps) the saddle was left
neither at lr 0.01 or 0.001, nor with weight decay 0.1, Adam betas (0.99, 0.999) or zero-
initialised queries; batch 1024 left it near step 1500 at 8x the cost per step, weight decay 1.0
near step 1200 but changes the objective whose convergence is tested. In 8000-step runs the same
seed left it near step 3000 at lr 0.01 and 0.001 but not at 0.003 (the lab's earlier full run):
when it leaves is close to chance, so the lr sweep runs at the ladder's first budget S and the
ladder goes per seed.

Shapes: B batch, T length, D d_model, H heads, Dh = D / H, V vocabulary.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from attnlab import inspect
from attnlab.config import ModelConfig
from attnlab.lab.kit.charts import curves_chart, save_chart, seeds_chart
from attnlab.lab.kit.fit import FitConfig, fit
from attnlab.lab.kit.gating import bracketed_lr
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import FigureRef, Report, Table, Threshold
from attnlab.lab.kit.seeds import resolved, run_jobs, seed_list, spread, spread_text
from attnlab.lab.kit.verdict import Competence, Doubling, gated_fields, verdict_of
from attnlab.models import build_model
from attnlab.nn import LearnedPositions, SelfAttention

OFFSETS = (1, 2)  # the two relations: the token 1 back and the token 2 back
SETTINGS = ("attention only", "Transformer block")
D_MODEL = 32
REACH = 0.95  # the learning-speed mark: steps until "both right" reaches it on the test set
ACCURACY = 0.99  # competence of an arm the claim expects to solve the task
PLATEAU = 0.025  # convergence: training loss (nats, 2 read-outs) falls by <= this when steps double
SADDLE = 0.1  # the 1-head arm's loss must lie this far below log V (the one-relation saddle)
GAIN = 0.05  # ... and "both right" (the claim's quantity) rises by <= 0.05 when steps double
LRS = (1e-3, 3e-3, 1e-2)  # swept for both compared arms on the first seed (extended past an edge)
TIME_RATIO = 1.5  # "no more expensive": the slowest head count within this factor of the fastest
THRESHOLDS = [
    Threshold(
        "no more expensive",
        f"identical counted FLOPs for 1-8 heads, wall time within a factor {TIME_RATIO}",
        "000 'Multi-head Self-Attention' states no number; FLOPs identical follows from its "
        "low-rank argument, the time factor is a lab choice",
    ),
    Threshold(
        "several relations at once: 4 heads name both tokens more often than 1 head",
        "better on every seed, the seed ranges not overlapping (resolved)",
        "001 '3. Multi-head Attention' (one operation sums the inputs' influence); lab rule",
    ),
    Threshold(
        "competence of the 4-head arm",
        f"both right >= {ACCURACY} (test)",
        "lab choice: the arm expected to solve the task solves it",
    ),
    Threshold(
        "convergence of the compared arms (step doubling)",
        f"training loss falls by <= {PLATEAU} nats when the steps double; for the 1-head arm "
        f"also both right rises by <= {GAIN} and the loss lies >= {SADDLE} nats below the "
        "one-relation saddle log V; the 1-head arm's steps double again while it fails, up to "
        "8x its first budget",
        "lab rule (docs/experiments/README.md); 0.025 nats for a loss summed over two "
        "read-outs matches the lab's 0.02 nats per token elsewhere",
    ),
]
COST = (
    "Full run: `attnlab experiment heads --seed 0` (generated sequences). ~9 min on 2 idle "
    "cores when the 1-head arm's ladder ends at 16000 steps on every seed; each further rung "
    "trains the 1-head arm again on 3 seeds over 2 workers (2 rounds) at ~6 ms per step on an "
    "idle core, so 32000 steps add ~6.5 min and 64000 (the cap) ~13 min: ~28 min at the cap. "
    "A cap of 128000 steps would need ~54 min, too close to the 60-minute budget."
)


def sizes(quick: bool) -> tuple[int, int]:
    """(vocabulary V, length T)."""
    return (16, 8) if quick else (64, 12)


def make_sequences(n: int, vocab: int, length: int, rng: np.random.Generator) -> Tensor:
    """Random token ids (N, T), each uniform over the V tokens."""
    return torch.from_numpy(rng.integers(0, vocab, size=(n, length))).long()


class AttentionReader(nn.Module):
    """001's single self-attention operation and nothing else: y = x + MultiHead(x) on
    x = E w + P, then one linear read-out per relation at every position (no FFN, no norm)."""

    def __init__(self, vocab: int, length: int, n_heads: int, d_model: int = D_MODEL):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_enc = LearnedPositions(length, d_model)
        self.attn = SelfAttention(d_model, n_heads)
        self.heads = nn.ModuleList(nn.Linear(d_model, vocab) for _ in OFFSETS)

    def forward(self, ids: Tensor) -> list[Tensor]:
        x = self.pos_enc(self.tok_emb(ids), torch.arange(ids.size(1)))  # (B, T, D)
        y = x + self.attn(x).out  # (B, T, D)
        return [head(y) for head in self.heads]  # one (B, T, V) per relation


class BlockReader(nn.Module):
    """One pre-norm Transformer encoder block (attention + FFN) and the same read-outs."""

    def __init__(self, vocab: int, length: int, n_heads: int, d_model: int = D_MODEL):
        super().__init__()
        cfg = ModelConfig(
            kind="encoder",
            vocab_size=vocab,
            d_model=d_model,
            n_heads=n_heads,
            n_layers=1,
            d_ff=4 * d_model,
            max_len=length,
        )
        self.encoder = build_model(cfg)
        self.heads = nn.ModuleList(nn.Linear(d_model, vocab) for _ in OFFSETS)

    def forward(self, ids: Tensor) -> list[Tensor]:
        hidden = self.encoder(ids).hidden  # (B, T, D)
        return [head(hidden) for head in self.heads]  # one (B, T, V) per relation


def make_reader(setting: str, vocab: int, length: int, n_heads: int) -> nn.Module:
    cls = AttentionReader if setting == SETTINGS[0] else BlockReader
    return cls(vocab, length, n_heads)


def _targets(ids: Tensor) -> list[Tensor]:
    """x_{t-k} for t = max(OFFSETS) .. T - 1, one (B, T - 2) per relation k."""
    start, t = max(OFFSETS), ids.size(1)
    return [ids[:, start - k : t - k] for k in OFFSETS]


def pair_loss(model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
    """Sum over the relations of the cross-entropy of naming x_{t-k} at every t > 2."""
    (ids,) = batch
    start = max(OFFSETS)
    losses = [
        F.cross_entropy(logits[:, start:].transpose(1, 2), target)
        for logits, target in zip(model(ids), _targets(ids))
    ]
    return torch.stack(losses).sum()


@torch.no_grad()
def pair_accuracy(model: nn.Module, ids: Tensor) -> dict[str, float]:
    """Per-position accuracy of each relation and of both at once."""
    model.eval()
    start = max(OFFSETS)
    correct = [
        logits[:, start:].argmax(-1) == target for logits, target in zip(model(ids), _targets(ids))
    ]
    out = {f"{k} back": float(c.float().mean()) for k, c in zip(OFFSETS, correct)}
    out["both"] = float(torch.stack(correct).all(dim=0).float().mean())
    return out


@torch.no_grad()
def attention_to_offsets(model: nn.Module, ids: Tensor) -> list[list[float]]:
    """Per head, the mean attention weight from t to t - k, [[w_1back, w_2back] per head]."""
    _, cache = inspect.run_with_cache(model, ids, names="*.A")
    (a,) = cache.values()  # (N, H, T, T)
    t = torch.arange(max(OFFSETS), ids.size(1))
    return [[float(a[:, h, t, t - k].mean()) for k in OFFSETS] for h in range(a.size(1))]


def attention_flops(n_heads: int, batch: int, t: int, d: int) -> tuple[int, int]:
    """(counted FLOPs of forward + backward, closed-form FLOPs of the forward pass)."""
    torch.manual_seed(0)
    attn = SelfAttention(d, n_heads)
    x = torch.randn(batch, t, d, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        attn(x, need_weights=True).out.sum().backward()
    formula = 2 * batch * t * d * 3 * d + 2 * 2 * batch * t * t * d + 2 * batch * t * d * d
    return counter.get_total_flops(), formula


def attention_ms(heads: list[int], batch: int, t: int, d: int, repeats: int) -> dict[int, float]:
    """Median wall time (ms) of one forward + backward on the default (fused) path, per head
    count; the head counts take turns in every round, so a change in the machine's load hits
    all of them alike."""
    torch.manual_seed(0)
    layers = {h: SelfAttention(d, h) for h in heads}
    x = torch.randn(batch, t, d, requires_grad=True)
    times: dict[int, list[float]] = {h: [] for h in heads}
    for i in range(repeats + 2):
        for h in heads:
            start = time.perf_counter()
            layers[h](x).out.sum().backward()
            if i >= 2:  # two warm-up rounds
                times[h].append(1000 * (time.perf_counter() - start))
    return {h: statistics.median(v) for h, v in times.items()}


def train_arm(job: tuple) -> dict:
    """One (seed, setting, heads, lr, steps) run on that seed's data: accuracies, the learning
    curve, steps to REACH, the final training loss and where each head looks."""
    seed, setting, n_heads, lr, steps, quick = job
    torch.set_num_threads(1)
    vocab, length = sizes(quick)
    rng = np.random.default_rng(seed)
    train = make_sequences(2000 if quick else 50_000, vocab, length, rng)
    valid = make_sequences(200 if quick else 1000, vocab, length, rng)
    test = make_sequences(500 if quick else 2000, vocab, length, rng)
    torch.manual_seed(seed)
    model = make_reader(setting, vocab, length, n_heads)
    cfg = fit_config(quick, lr, steps)
    every = max(1, cfg.steps // 20)
    result = fit(
        model,
        (train,),
        pair_loss,
        cfg,
        seed=seed,
        eval_every=every,
        evaluate=lambda m: pair_accuracy(m, test)["both"],
    )
    return {
        "acc": pair_accuracy(model, test),
        "valid": pair_accuracy(model, valid)["both"],
        "steps": [s for s, _ in result.evals],
        "curve": [v for _, v in result.evals],
        "losses": result.losses,
        "loss": result.final_loss(max(1, cfg.steps // 10)),
        "reach": next((s for s, v in result.evals if v >= REACH), math.inf),
        "looks": attention_to_offsets(model, test[:500]),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def fit_config(quick: bool, lr: float, steps: int) -> FitConfig:
    return FitConfig(steps=steps, batch_size=64, lr=lr, warmup_steps=5 if quick else 100)


ARMS = [(SETTINGS[0], 1), (SETTINGS[0], 4), (SETTINGS[1], 1), (SETTINGS[1], 4)]
LR = 3e-3  # every arm but the swept one
LADDER = 4  # the 1-head attention-only arm's first budget, in multiples of the other arms' steps
DOUBLINGS = 3  # its budgets: first, 2x, then 4x and 8x first (the cap) for a seed not converged


def _label(arm: tuple[str, int]) -> str:
    return f"{arm[0]}, {arm[1]} head{'s' if arm[1] > 1 else ''}"


def _key(seed: int, arm: tuple[str, int], lr: float, steps: int, quick: bool) -> tuple:
    """A run's job tuple (and its key in the results)."""
    return (seed, *arm, lr, steps, quick)


def _steps(job: tuple) -> float:
    """A job's cost for :func:`run_jobs`: its step count."""
    return job[4]


def one_relation_level(quick: bool) -> float:
    """log V: the training loss (nats, summed over the relations) of a model that names one
    relation and is at chance on the other -- the saddle the 1-head arm rests on for a while."""
    return math.log(sizes(quick)[0])


def converged(budgets: dict[int, dict], budget: int, quick: bool) -> bool:
    """One seed's plateau check at ``budget`` -> 2 ``budget`` steps: doubling the steps lowered
    the final training loss by at most PLATEAU nats and raised "both right" (test) by at most
    GAIN, and that loss lies at least SADDLE below the one-relation level log V (a flat loss on
    the saddle is not convergence)."""
    short, long = budgets[budget], budgets[2 * budget]
    return (
        short["loss"] - long["loss"] <= PLATEAU
        and long["acc"]["both"] - short["acc"]["both"] <= GAIN
        and long["loss"] <= one_relation_level(quick) - SADDLE
    )


def train_arms(seeds: list[int], quick: bool, steps: int) -> dict[str, Any]:
    """Every arm on every seed. The two compared arms (attention only, 1 and 4 heads) each get a
    learning-rate sweep on the first seed, extended past an edge choice (the 1-head arm at its
    first budget, LADDER x ``steps``; the 4-head arm at ``steps``, then once more at twice the
    steps: its step doubling). The 1-head arm runs on every seed at its first budget and twice
    it; a seed whose plateau check (:func:`converged`) fails is trained again with the steps
    doubled, up to DOUBLINGS doublings. The full-block arms (references) run at LR."""
    workers = 1 if quick else 2
    one, four, first = ARMS[0], ARMS[1], LADDER * steps
    refs = [(s, *arm, LR, steps, quick) for s in seeds for arm in ARMS[2:]]
    start = [(seeds[0], *one, lr, first, quick) for lr in LRS]
    start += [(s, *four, lr, steps, quick) for s in seeds[:1] for lr in LRS]
    start += [(s, *four, LR, steps, quick) for s in seeds[1:]]  # the likely choice, ahead
    done = run_jobs(train_arm, start + refs, workers, cost=_steps)

    def scorer(arm: tuple[str, int], budget: int):
        def score(rates: list[float]) -> dict[float, float]:
            jobs = [(seeds[0], *arm, lr, budget, quick) for lr in rates]
            done.update(run_jobs(train_arm, [j for j in jobs if j not in done], workers))
            return {j[3]: done[j]["valid"] for j in jobs}

        return score

    chosen_on = f"both right on the validation set, seed {seeds[0]}"
    lr_one, _ = bracketed_lr(scorer(one, first), LRS, chosen_on=chosen_on, higher_is_better=True)
    lr_four, _ = bracketed_lr(scorer(four, steps), LRS, chosen_on=chosen_on, higher_is_better=True)
    best = lr_one.chosen
    more = [(s, *one, best, b, quick) for s in seeds for b in (first, 2 * first)]
    more += [(s, *four, lr_four.chosen, steps, quick) for s in seeds]
    more.append((seeds[0], *four, lr_four.chosen, 2 * steps, quick))
    done.update(run_jobs(train_arm, [j for j in more if j not in done], workers, cost=_steps))
    ladder = {s: {b: done[_key(s, one, best, b, quick)] for b in (first, 2 * first)} for s in seeds}
    last = dict.fromkeys(seeds, first)
    cap = first * 2**DOUBLINGS
    while todo := [
        s for s in seeds if 2 * last[s] < cap and not converged(ladder[s], last[s], quick)
    ]:
        extra = run_jobs(
            train_arm, [(s, *one, best, 4 * last[s], quick) for s in todo], workers, cost=_steps
        )
        for s in todo:
            last[s] *= 2
            ladder[s][2 * last[s]] = extra[_key(s, one, best, 2 * last[s], quick)]
    rates = {four: lr_four.chosen, ARMS[2]: LR, ARMS[3]: LR}
    runs = {
        (arm, s): done[_key(s, arm, rates[arm], steps, quick)] for s in seeds for arm in ARMS[1:]
    }
    sweep_rows = [
        {
            "arm": _label(arm),
            "steps": budget,
            "lr": lr,
            "both right (validation)": done[_key(seeds[0], arm, lr, budget, quick)]["valid"],
            "both right (test)": done[_key(seeds[0], arm, lr, budget, quick)]["acc"]["both"],
            "final training loss": done[_key(seeds[0], arm, lr, budget, quick)]["loss"],
        }
        for arm, budget, lr_ in ((one, first, lr_one), (four, steps, lr_four))
        for lr in lr_.grid
    ]
    return {
        "runs": runs,
        "ladder": ladder,
        "last": last,
        "lr one": lr_one,
        "lr four": lr_four,
        "four double": done[_key(seeds[0], four, lr_four.chosen, 2 * steps, quick)],
        "sweep rows": sweep_rows,
    }


def _result_row(arm: tuple[str, int], per: list[dict], lr: float, steps: int | str) -> dict:
    """One row of table (b): an arm's accuracies and final loss, mean (min-max) over seeds."""
    return {
        "model": arm[0],
        "heads": arm[1],
        "d_head": D_MODEL // arm[1],
        "parameters": per[0]["parameters"],
        "lr": lr,
        "steps": steps,
        **{f"{k} back": spread_text([p["acc"][f"{k} back"] for p in per]) for k in OFFSETS},
        "both right": spread_text([p["acc"]["both"] for p in per]),
        f"steps to {REACH}": spread_text([p["reach"] for p in per]),
        "final training loss": spread_text([p["loss"] for p in per]),
    }


def cost_table(quick: bool) -> tuple[list[dict], dict[int, int], tuple[int, int, int], int]:
    """Part (a): per head count, counted and closed-form FLOPs and the median fwd+bwd time.
    Returns (rows, {heads: counted FLOPs}, (B, T, D), repeats)."""
    batch, t, d = (4, 32, 64) if quick else (8, 128, 128)
    repeats = 3 if quick else 30
    rows, flops = [], {}
    times = attention_ms([1, 2, 4, 8], batch, t, d, repeats)
    for h in (1, 2, 4, 8):
        counted, formula = attention_flops(h, batch, t, d)
        flops[h] = counted
        rows.append(
            {
                "heads": h,
                "d_head": d // h,
                "counted FLOPs (fwd+bwd)": counted,
                "formula FLOPs (fwd)": formula,
                "fwd+bwd ms (median)": times[h],
            }
        )
    return rows, flops, (batch, t, d), repeats


def measure(quick: bool, seed: int, data: Path | None = None) -> dict[str, Any]:
    """Part (a)'s cost and part (b)'s training: plain numbers (``data`` is unused: the
    sequences are generated)."""
    torch.set_num_threads(1)
    cost_rows, flops, shape, repeats = cost_table(quick)
    seeds = seed_list(seed, quick)
    steps = 30 if quick else 2000
    return {
        "cost": {"rows": cost_rows, "flops": flops, "shape": shape, "repeats": repeats},
        "seeds": seeds,
        "steps": steps,
        **train_arms(seeds, quick, steps),
    }


def _figures(
    seeds: list[int], ladder: dict, runs: dict, quick: bool, out_dir: Path
) -> list[FigureRef]:
    """The learning curves (test accuracy, training loss) of every arm, the 1-head
    attention-only arm at each budget of its ladder."""
    one, level = ARMS[0], one_relation_level(quick)
    all_budgets = sorted({b for s in seeds for b in ladder[s]})
    ladder_text = ", ".join(map(str, all_budgets))

    def one_label(b: int) -> str:
        having = [s for s in seeds if b in ladder[s]]
        which = "" if len(having) == len(seeds) else f" (seed {', '.join(map(str, having))})"
        return f"{_label(one)}, {b} steps{which}"

    curves = {
        _label(arm): (runs[(arm, seeds[0])]["steps"], [runs[(arm, s)]["curve"] for s in seeds])
        for arm in ARMS[1:]
    }
    for b in all_budgets:
        having = [s for s in seeds if b in ladder[s]]
        curves[one_label(b)] = (
            ladder[having[0]][b]["steps"],
            [ladder[s][b]["curve"] for s in having],
        )
    fig = seeds_chart(
        curves,
        xlabel="training step",
        ylabel="both relations right (test)",
        title=f"token 1 back and 2 back at once ({len(seeds)} seed(s), min-max band)",
        logx=True,
    )
    fig.axes[0].axhline(
        1 / sizes(quick)[0] ** 2,
        color="tab:red",
        linestyle="--",
        linewidth=1,
        label="chance (1/V^2)",
    )
    fig.axes[0].legend(fontsize=8)
    loss_curves = {_label(arm): [runs[(arm, s)]["losses"] for s in seeds] for arm in ARMS[1:]}
    for b in all_budgets:
        loss_curves[one_label(b)] = [ladder[s][b]["losses"] for s in seeds if b in ladder[s]]
    loss_fig = curves_chart(
        loss_curves, title="training loss (sum over the two relations)", logy=True
    )
    loss_fig.axes[0].axhline(
        level,
        color="gray",
        linestyle=":",
        linewidth=1,
        label="log V: one relation named, the other at chance",
    )
    loss_fig.axes[0].legend(fontsize=7)
    figures = [
        save_chart(
            fig,
            out_dir,
            "learning.png",
            "Test accuracy (both relations right) during "
            "training (log step axis), 1 vs 4 heads, attention only and full Transformer "
            "block (mean over seeds, min-max band), evaluated 20 times per run; the 1-head "
            f"attention-only arm at each budget of its ladder ({ladder_text} steps).",
        ),
        save_chart(
            loss_fig,
            out_dir,
            "training.png",
            "Training loss (sum of the two read-outs' "
            "cross-entropy), mean over seeds with the min-max band; the 1-head "
            "attention-only arm at each budget of its ladder (its plateau check); dotted: "
            "log V, the loss with one relation named and the other at chance.",
        ),
    ]
    return figures


def _competence(
    m: dict[str, Any], runs: dict, both: dict, drop: list[float], gain: list[float], quick: bool
) -> list[Competence]:
    """The compared arms' criteria (1 head: converged, off the saddle; 4 heads: solves the
    task), each with its sweep and doubling; the full-block arms as references."""
    seeds, steps, ladder, last = m["seeds"], m["steps"], m["ladder"], m["last"]
    lr_one, lr_four = m["lr one"], m["lr four"]
    one, four = ARMS[0], ARMS[1]
    final_loss = [ladder[s][2 * last[s]]["loss"] for s in seeds]
    level = one_relation_level(quick)
    budget_text = ", ".join(str(2 * last[s]) for s in seeds)
    four_gate: dict[str, Any] = {
        "lr": lr_four,
        "doubling": Doubling(
            steps,
            [runs[(four, seeds[0])]["loss"]],
            [m["four double"]["loss"]],
            PLATEAU,
            seeds[:1],
            "final training loss (nats)",
        ),
    }
    return [
        Competence(
            _label(one),
            "training plateau: training-loss drop (nats) when the steps "
            f"double, at each seed's last doubling (to {budget_text} steps; the cap: "
            f"{LADDER * steps * 2**DOUBLINGS} steps"
            + ("" if quick else ", what the 60-minute budget affords")
            + ")",
            PLATEAU,
            drop,
            higher_is_better=False,
            lr=lr_one,
            doubling=Doubling(
                min(last.values()),
                [ladder[s][last[s]]["loss"] for s in seeds],
                final_loss,
                PLATEAU,
                seeds,
                f"final training loss (nats), each seed's last doubling (to {budget_text} steps)",
            ),
        ),
        Competence(
            _label(one),
            "accuracy plateau: rise of both right (test) when the steps "
            "double, at each seed's last doubling",
            GAIN,
            gain,
            higher_is_better=False,
        ),
        Competence(
            _label(one),
            "off the one-relation saddle: final training loss (nats; log V "
            f"= {level:.2f} with one relation named, the other at chance)",
            level - SADDLE,
            final_loss,
            higher_is_better=False,
        ),
        *[
            Competence(
                _label(a),
                "both relations right (test, training distribution)",
                ACCURACY,
                both[a],
                in_verdict=a == four,
                **(four_gate if a == four else {}),
            )
            for a in (four, *ARMS[2:])  # the full-block arms are references
        ],
    ]


def write_up(m: dict[str, Any], out_dir: Path, quick: bool) -> Report:
    """Tables, figures, verdict and prose from :func:`measure`'s numbers."""
    cost_rows, flops = m["cost"]["rows"], m["cost"]["flops"]
    (batch, t, d), repeats = m["cost"]["shape"], m["cost"]["repeats"]
    seeds, steps, ladder, last = m["seeds"], m["steps"], m["ladder"], m["last"]
    lr_one, lr_four = m["lr one"], m["lr four"]
    best_lr, sweep_rows = lr_one.chosen, m["sweep rows"]
    one, four = ARMS[0], ARMS[1]
    final = {s: ladder[s][2 * last[s]] for s in seeds}  # the 1-head arm at its last budget
    budgets = [2 * last[s] for s in seeds]
    runs = m["runs"] | {(one, s): final[s] for s in seeds}
    both = {arm: [runs[(arm, s)]["acc"]["both"] for s in seeds] for arm in ARMS}
    reach = {arm: [runs[(arm, s)]["reach"] for s in seeds] for arm in ARMS}
    drop = [ladder[s][last[s]]["loss"] - final[s]["loss"] for s in seeds]
    gain = [final[s]["acc"]["both"] - ladder[s][last[s]]["acc"]["both"] for s in seeds]
    final_loss = [final[s]["loss"] for s in seeds]
    level = one_relation_level(quick)
    budget_text = ", ".join(str(b) for b in budgets)
    rows = [_result_row(one, [final[s] for s in seeds], best_lr, f"per seed: {budget_text}")]
    rows += [
        _result_row(
            arm, [runs[(arm, s)] for s in seeds], lr_four.chosen if arm == four else LR, steps
        )
        for arm in ARMS[1:]
    ]
    ladder_rows = [
        {
            "seed": s,
            "steps": b,
            "final training loss": r["loss"],
            "loss drop from half the steps": (
                ladder[s][b // 2]["loss"] - r["loss"] if b // 2 in ladder[s] else math.nan
            ),
            "both-right rise from half the steps": (
                r["acc"]["both"] - ladder[s][b // 2]["acc"]["both"]
                if b // 2 in ladder[s]
                else math.nan
            ),
            **{f"{k} back": r["acc"][f"{k} back"] for k in OFFSETS},
            "both right": r["acc"]["both"],
            **{f"weight on t-{k}": r["looks"][0][i] for i, k in enumerate(OFFSETS)},
        }
        for s in seeds
        for b, r in sorted(ladder[s].items())
    ]
    competence = _competence(m, runs, both, drop, gain, quick)
    looks_rows = [
        {
            "arm": _label(arm),
            "seed": s,
            "head": h + 1,
            "steps": budgets[i] if arm == one else steps,
            **{f"weight on t-{k}": runs[(arm, s)]["looks"][h][j] for j, k in enumerate(OFFSETS)},
        }
        for arm in ARMS
        for i, s in enumerate(seeds)
        for h in range(arm[1])
    ]
    figures = _figures(seeds, ladder, runs, quick, out_dir)
    same_flops = len(set(flops.values())) == 1
    ms = [r["fwd+bwd ms (median)"] for r in cost_rows]
    time_ratio = max(ms) / min(ms)
    cheap = same_flops and time_ratio < TIME_RATIO
    wins = min(both[four]) > max(both[one]) + 0.01 and resolved(both[four], both[one])
    verdict = verdict_of([cheap, wins])
    reason = (
        f"FLOPs of forward + backward are {'identical' if same_flops else 'different'} for 1-8 "
        f"heads ({flops[1]:,}) and the wall time varies by a factor {time_ratio:.2f} "
        f"({min(ms):.2f}-{max(ms):.2f} ms); naming the tokens 1 back and 2 back at once (both "
        f"right, test, mean (min-max) over {len(seeds)} seeds): attention only, 4 heads "
        f"{spread_text(both[four])} after {steps} steps vs 1 head {spread_text(both[one])} "
        f"trained to its plateau (per seed {budget_text} steps; 1 back "
        f"{spread_text([final[s]['acc']['1 back'] for s in seeds])}, 2 back "
        f"{spread_text([final[s]['acc']['2 back'] for s in seeds])}; chance "
        f"{1 / sizes(quick)[0] ** 2:.2g}), "
        + ("outside the spread" if wins else "no effect resolved")
        + f"; at its last doubling the 1 head's training loss falls by {spread_text(drop)} nats "
        f"to {spread_text(final_loss)} (log V = {level:.2f}) and its both right rises by "
        f"{spread_text(gain)}. With the FFN (full block): 4 heads "
        f"{spread_text(both[ARMS[3]])}, 1 head {spread_text(both[ARMS[2]])}."
    )
    looks_one = [final[s]["looks"][0] for s in seeds]
    findings = [
        "Why one head cannot: one attention distribution per query gives one mixture; to serve "
        "both relations the head splits its weight, a on t-1 and b on t-2, and the two tokens "
        "arrive summed in the same subspace, a f(x_{t-1}) + b f(x_{t-2}). With fixed weights no "
        "linear read-out names the token with the smaller weight for all pairs (summing the "
        "argmax conditions over any three tokens in both orders gives off-diagonal(G) > "
        "2 diagonal(G) and the reverse; with a = b the order is lost). Only weights that depend "
        "on the tokens' content can let some pairs through. This argument is not the "
        "competence check: the 1-head arm's convergence is measured (table 'the 1-head "
        "attention-only arm, per seed and budget ...'). At its last budget the single head puts "
        "(t-1, t-2) = "
        + ", ".join(f"({w[0]:.2f}, {w[1]:.2f})" for w in looks_one)
        + f" of its weight on the two tokens (seeds in order) and names both at "
        f"{spread_text(both[one])} of the positions.",
        "How the 1-head arm learns (per seed and budget): "
        + "; ".join(
            f"seed {s}: "
            + ", ".join(
                f"{b} steps loss {r['loss']:.3g} both {r['acc']['both']:.3g}"
                for b, r in sorted(ladder[s].items())
            )
            for s in seeds
        )
        + f". A loss near log V = {level:.2f} means the head serves one relation alone (one "
        "read-out at chance); it leaves that saddle at a different step on each seed, and "
        "afterwards the loss keeps creeping down, so its plateau check is made per seed and "
        "a flat loss on the saddle does not count as convergence.",
        "With 4 heads of d_head 8 (same parameters, same FLOPs) each relation gets its own head "
        "and its own 8-dimensional value subspace. The full block's FFN is nonlinear and can "
        "separate part of the single head's mixture, which is why the full-block 1-head arm "
        "(a reference, not in the verdict) does better than the attention-only one.",
    ]
    vocab, length = sizes(quick)
    train_n = 2000 if quick else 50_000
    first = LADDER * steps
    return Report(
        name="heads",
        title="Multi-head vs single-head attention: same cost, several relations at once",
        claim="In practice, multi-head self-attention is no more expensive than single-head due "
        "to the low-rankness of the transformations we apply. (000) -- In a single "
        "self-attention operation, all this information just gets summed together. The inputs "
        "x_mary and x_susan can influence the output y_gave by different amounts [...] but "
        "they can't influence it in different ways. (001)",
        source="000, 'Multi-head Self-Attention'; 001, '3. Multi-head Attention'",
        setup=[
            f"(a) SelfAttention (fused QKV, W^O), B = {batch}, T = {t}, d_model = {d}; FLOPs "
            "counted by torch.utils.flop_counter on the explicit path (softmax and other "
            "elementwise ops are not counted: H T^2 exponentials per row block); time = median "
            f"of {repeats} forward + backward runs on the fused path, one thread, the head "
            "counts taking turns in every round.",
            f"(b) Two relations at once: {train_n} random sequences of T = {length} tokens over "
            f"V = {vocab} per seed (validation {200 if quick else 1000}, test "
            f"{500 if quick else 2000}); at every position t > 2 one "
            "linear read-out names x_{t-1} and another x_{t-2}. 'attention only' = 001's "
            "operation: y = x + MultiHead(x) on token + learned position embeddings, no FFN, "
            f"no norm. 'Transformer block' = one pre-norm encoder layer, d_ff {4 * D_MODEL}, "
            f"learned positions. d_model {D_MODEL}, 1 head (d_head {D_MODEL}) or 4 (d_head "
            f"{D_MODEL // 4}): the same parameters. AdamW, batches of 64, warm-up + cosine; "
            f"{steps} steps for every arm but the 1-head attention-only one; the 4-head "
            f"attention-only arm at {lr_four.describe()} ({lr_four.chosen_on}), trained again "
            f"for {2 * steps} steps on seed {seeds[0]} (its step doubling); the full-block arms "
            f"(references) at lr {LR:g}.",
            f"The 1-head attention-only arm (the one the claim expects to fail) is trained to "
            f"convergence on every seed: its lr is the best of {', '.join(map(str, LRS))} "
            f"on the first seed's validation set (both right) after {first} steps ({best_lr:g}); "
            f"each seed runs {first} and {2 * first} steps, and a seed whose plateau check "
            f"fails runs again with the steps doubled, up to {first * 2**DOUBLINGS} (the cap; "
            "each budget is a fresh run with its own warm-up + cosine schedule). Plateau "
            f"check: doubling the steps lowers the final training loss by <= {PLATEAU} nats, "
            f"raises both right (test, the claim's quantity) by <= {GAIN}, and the loss is "
            f"<= log V - {SADDLE} = {level - SADDLE:.2f}, i.e. off the "
            "one-relation saddle (one read-out at chance), where the loss is flat for "
            "thousands of steps before it falls again.",
            "Why a ladder per seed rather than a faster recipe: in single-seed probes on the "
            "slowest seed (2000 steps, V = 64) the saddle was left neither at lr 0.01 nor "
            "0.001, nor with weight decay 0.1, Adam betas (0.99, 0.999) or zero-initialised "
            "queries; batch 1024 left it near step 1500 at 8x the cost per step, and weight "
            "decay 1.0 near step 1200 but changes the objective whose convergence is tested. "
            "In 8000-step runs the same seed left it near step 3000 at lr 0.01 and 0.001 but "
            "not at 0.003 (an earlier full run). The time on the saddle varies by seed and lr "
            "(from under 1000 steps to over 5000), so the lr sweep runs at the ladder's first "
            "budget and each seed gets the budget its own check asks for.",
            "Competence: the arm the claim expects to fail (1 head, attention only) must have "
            "converged (the three parts of the plateau check, on every seed, at its last budget); "
            f"the arm expected to succeed (4 heads) must name both tokens >= {ACCURACY} of the "
            "time. The full-block arms are references.",
        ],
        tables=[
            Table("(a) cost at equal d_model", cost_rows),
            Table("(b) the token 1 back and 2 back at once (mean (min-max) over seeds)", rows),
            Table(
                "the 1-head attention-only arm, per seed and budget (test accuracy; the drop "
                "and the rise from half the steps are the plateau check)",
                ladder_rows,
            ),
            Table(
                f"learning-rate sweeps of the compared arms (seed {seeds[0]}; the 1-head arm at "
                f"{first} steps, the 4-head arm at {steps})",
                sweep_rows,
            ),
            Table(
                "where the heads look: mean attention weight from t to t-1 and t-2 (test, at "
                "the end of training)",
                looks_rows,
            ),
        ],
        figures=figures,
        thresholds=THRESHOLDS,
        **gated_fields(verdict, reason, competence, seeds, quick, arms=[_label(one), _label(four)]),
        per_seed={
            "both_right": {_label(arm): v for arm, v in both.items()},
            "steps_to": {_label(arm): v for arm, v in reach.items()},
            "one_head_steps": budgets,
            "one_head_loss_drop": drop,
            "one_head_both_right_gain": gain,
            "one_head_final_loss": final_loss,
        },
        findings=findings,
        metrics={
            "flops": flops,
            "time_ratio": time_ratio,
            "both_right": {_label(arm): spread(v)["mean"] for arm, v in both.items()},
            "lr_one_head": best_lr,
            "lr_four_heads": lr_four.chosen,
        },
    )


@experiment(
    "heads",
    notes="000 'Multi-head Self-Attention'; 001 'Multi-head Attention'; 004 eq. 13",
)
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Multi-head attention costs the same FLOPs and about the same time as single-head
    attention at equal d_model, and one layer of it does what one head cannot: serve several
    relations at once (here: name the token 1 back and the token 2 back at every position)."""
    return write_up(measure(quick, seed, data), out_dir, quick)
