"""Experiment ``residual``: residual connections and depth (000 "Residual connections"; 003).

000 ("Residual Connections"): f_residual(h) = f(h) + h, "the gradient flow of the identity
function is great (the local gradient is 1 everywhere!) so the connection allows for learning
much deeper networks". A second reading of the residual
stream: whatever the embedding put there -- the position vectors among them -- stays available to
every later layer unless a block removes it.

Two arms of the same pre-norm decoder-only character LM at depths 1, 2, 3, 6 and 12 (the
shallow ones show where training without residuals starts to fail):

    with residuals      h = h + f(LN(h))     (the library's block)
    without residuals   h = f(LN(h))         (both sublayers of every block)

Every (arm, depth) is gated alike (:mod:`attnlab.lab.kit.gating`): a learning-rate sweep whose
choice is bracketed and a step doubling of the validation loss. The no-residual arms are the
ones whose failure is the claim: their criterion is the same as the residual arms' -- the
training learned the character frequencies (validation loss at most the unigram entropy plus
:data:`UNIGRAM_MARGIN`) and doubling the steps does not move the loss -- so a deep stack stuck at
the unigram entropy at every rate and both budgets is a converged failure, and one that more
training would rescue makes the verdict inconclusive.

Measured per seed: the validation loss after the budget (trainability), the gradient norm of
the first block at initialisation, and a *linear probe for position*: a least-squares linear map
from each layer's output vectors to the one-hot position index t, fitted on half of held-out
windows and scored (accuracy of the argmax) on the other half.

Shapes: N windows, B batch, T context, D d_model, L layers.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from matplotlib.ticker import MaxNLocator
from torch import nn

from attnlab.lab.kit.charts import save_chart, seeds_chart
from attnlab.lab.kit.corpus import (
    LEARNED_FREQUENCIES,
    UNIGRAM_MARGIN,
    char_lm_config,
    text_windows,
    unigram_bigram,
)
from attnlab.lab.kit.fit import FitConfig, block_grad_norms, eval_loss, fit, lm_loss
from attnlab.lab.kit.gating import Gated, Sweep, gate_arms, sweep_rows
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import FigureRef, Report, Table, Threshold
from attnlab.lab.kit.seeds import bands, resolved, spread_text, start_seeds
from attnlab.lab.kit.verdict import Competence, gated_fields, verdict_of
from attnlab.models import build_model
from attnlab.nn.blocks import BlockOutput, CausalBlock

ARMS = ("with residuals", "without residuals")
CONTEXT = 32
GAP = 0.1  # nats/char: the smallest validation-loss gap read as "clearly worse"
SWEEP = Sweep(
    grid=(3e-4, 1e-3, 3e-3),
    tolerance=0.05,
    metric="validation loss (nats/char)",
    metric_key="val",
    factor=3.0,
    max_extensions=2,
    doubling_seeds=3,
)
QUICK_SWEEP = SWEEP.quick(grid=(1e-3, 3e-3))
COST = (
    "Full run: `attnlab experiment residual --seed 0 --data ../shared/data`. Estimate for 2 "
    "idle cores, from a single-thread probe of the training step (27 Nov 2026: 10, 20, 31, 52 "
    "and 109 ms per step at depths 1, 2, 3, 6 and 12): each (arm, depth) trains 3 sweep rates "
    "and 2 more seeds at 800 steps and a doubling of 1600 steps on all 3 seeds (8800 steps), "
    "~65 min of CPU for the 10 arms: about 33 min on both cores, up to ~39 min when sweeps "
    "extend their grids."
)
CLAIM = (
    "Residual connections simply add the input of a layer to the output of that "
    "layer: f_residual(h) = f(h) + h, the intuition being that (1) the gradient flow of the "
    "identity function is great (the local gradient is 1 everywhere!) so the connection "
    "allows for learning much deeper networks."
)
FINDINGS = [
    "Without residuals even the causal mask leaves some position signal (a token can count how "
    "many keys it sees), so the probe need not fall to chance.",
]


class BlockWithoutResidual(CausalBlock):
    """The pre-norm causal block with both residual connections removed: h = f(LN(h)) for each
    sublayer f (the block's hook points still see LN(h) and the new h)."""

    def forward(self, x, mask=None, *, positions=None, cache=None, need_weights=False):
        b: Any = self  # the hook points are set by name in the block's constructor
        x = b.hook_x(x)
        opts = dict(causal=True, positions=positions, cache=cache, need_weights=need_weights)
        a = b.self_attn(b.hook_attn_norm(b.self_attn_norm(x)), mask, **opts)
        h = b.hook_resid_mid(b.drop(a.out))  # no "x +"
        out = b.hook_resid_post(b.drop(b.ffn(b.hook_ffn_norm(b.ffn_norm(h)))))
        return BlockOutput(out, a.weights, None)


def make_model(arm: str, vocab: int, context: int, n_layers: int) -> nn.Module:
    model: Any = build_model(char_lm_config(vocab, context, n_layers))
    if arm == "without residuals":
        for block in model.blocks:
            block.__class__ = BlockWithoutResidual
    return model


@torch.no_grad()
def layer_outputs(model: Any, ids: torch.Tensor) -> list[torch.Tensor]:
    """The residual stream after the embedding and after each block: L + 1 tensors (B, T, D)."""
    outs = [model.embed(ids)]
    handles = [b.register_forward_hook(lambda m, a, out: outs.append(out.x)) for b in model.blocks]
    try:
        model.eval()
        model(ids)
    finally:
        for h in handles:
            h.remove()
    return outs


def position_probe(states: torch.Tensor) -> float:
    """Accuracy of a least-squares linear probe from vectors (N, T, D) to their position t,
    fitted on the first half of the N windows and scored on the second half."""
    n, t, d = states.shape
    x = torch.cat([states, torch.ones(n, t, 1)], -1).double()  # (N, T, D + 1), with a bias
    y = torch.eye(t, dtype=torch.float64).expand(n, t, t)  # one-hot position, (N, T, T)
    half = n // 2
    w = torch.linalg.lstsq(x[:half].reshape(-1, d + 1), y[:half].reshape(-1, t)).solution
    pred = (x[half:].reshape(-1, d + 1) @ w).argmax(-1)  # (N/2 * T,)
    truth = torch.arange(t).repeat(n - half)
    return float((pred == truth).double().mean())


def depths(quick: bool) -> tuple[int, ...]:
    return (2, 4) if quick else (1, 2, 3, 6, 12)


def steps(quick: bool) -> int:
    return 20 if quick else 800


def train_job(job: tuple) -> dict:
    """One (arm, depth) run at a learning rate, ``scale`` x the step budget (gating's job)."""
    (arm, n_layers), lr, scale, seed, quick, data = job
    train, val, chars, _ = text_windows(quick, CONTEXT, data)
    torch.manual_seed(seed)
    model = make_model(arm, len(chars), CONTEXT, n_layers)
    grad0 = block_grad_norms(model, train[:32])[0]  # the first block, at initialisation
    model.zero_grad()
    n = steps(quick) * scale
    cfg = FitConfig(steps=n, batch_size=32, lr=lr, warmup_steps=n // 10, min_lr=lr / 10)
    result = fit(model, (train,), lm_loss, cfg, seed=seed)
    probe_ids = val[: 64 if quick else 400, :CONTEXT]  # (N, T): the probe's own two halves
    return {
        "losses": result.losses,
        "train": result.final_loss(),
        "val": eval_loss(model, (val[:256],), lm_loss) if not result.diverged else float("inf"),
        "grad0": grad0,
        "probe": [position_probe(h) for h in layer_outputs(model, probe_ids)],
        "diverged": result.diverged,
    }


def measure(quick: bool, seed: int, data: Path | None) -> dict[str, Any]:
    """Every (arm, depth) gated and trained on every seed; plain numbers, no prose."""
    seeds = start_seeds(seed, quick)
    train, val, chars, source = text_windows(quick, CONTEXT, data)
    uni, bi = unigram_bigram(train, val, len(chars))
    arms = [(a, d) for a in ARMS for d in depths(quick)]
    sweep = QUICK_SWEEP if quick else SWEEP
    gated = gate_arms(train_job, arms, sweep, seeds, quick, data, cost=lambda j: j[0][1] * j[2])
    return {
        "seeds": seeds,
        "depths": list(depths(quick)),
        "steps": steps(quick),
        "unigram": uni,
        "bigram": bi,
        "source": source,
        "vocab": len(chars),
        "gated": {_label(arm): asdict(g) for arm, g in gated.items()},
    }


def _label(arm: Any) -> str:
    """An (arm, depth) key as its name in the report, e.g. 'with residuals, 6 layers'."""
    return f"{arm[0]}, {arm[1]} layers"


def write_up(measured: dict[str, Any], out_dir: Path, quick: bool) -> Report:
    """The report of :func:`measure`'s numbers: tables, figures, gate and verdict."""
    m = measured
    sweep = QUICK_SWEEP if quick else SWEEP
    gated = {k: Gated(**v) for k, v in m["gated"].items()}
    ds, seeds = m["depths"], m["seeds"]
    val = {k: g.values("val") for k, g in gated.items()}
    competence = [_competence(k, g, sweep, m) for k, g in gated.items()]
    verdict, reason = _verdict(m, val)
    return Report(
        name="residual",
        title="Residual connections: trainability with depth, and position in the residual stream",
        claim=CLAIM,
        source="000, 'Residual Connections'",
        setup=_setup(m, sweep, quick),
        thresholds=_thresholds(),
        tables=[
            Table("per depth and arm (mean (min-max) over seeds)", _rows(gated, ds)),
            Table("learning-rate sweep (first seed)", sweep_rows(gated, str)),
        ],
        figures=_figures(gated, m, out_dir),
        **gated_fields(verdict, reason, competence, seeds, quick, arms=list(gated)),
        per_seed={
            "val": val,
            "probe_last": {k: [p[-1] for p in g.values("probe")] for k, g in gated.items()},
        },
        metrics={
            "unigram": m["unigram"],
            "bigram": m["bigram"],
            "probe": {a: bands(gated[_label((a, ds[-1]))].values("probe"))[0] for a in ARMS},
        },
        findings=FINDINGS,
    )


def _competence(label: str, g: Gated, sweep: Sweep, m: dict[str, Any]) -> Competence:
    threshold = m["unigram"] + UNIGRAM_MARGIN
    return g.competence(label, LEARNED_FREQUENCIES, threshold, sweep, m["steps"], "val", False)


def _verdict(m: dict[str, Any], val: dict[str, list[float]]) -> tuple[str, str]:
    """(verdict word, reason): held / did not hold / mixed by the three checks; "no effect
    resolved" when no check held and both predicted differences (the deepest stack's loss, the
    last layer's probe) lie inside the seed spread."""
    ds, seeds = m["depths"], m["seeds"]
    gap = {
        d: [b - a for a, b in zip(val[_label((ARMS[0], d))], val[_label((ARMS[1], d))])] for d in ds
    }
    deep = ds[-1]
    trainable = min(gap[deep]) > GAP  # without residuals clearly worse at the deepest stack
    grows = resolved(gap[deep], gap[ds[0]]) and min(gap[deep]) > min(gap[ds[0]])
    probe = {a: [r["probe"][-1] for r in m["gated"][_label((a, deep))]["runs"]] for a in ARMS}
    carries = min(probe[ARMS[0]]) > max(probe[ARMS[1]])
    reason = (
        "validation loss without minus with residuals (nats/char, mean (min-max) over "
        f"{len(seeds)} seeds): "
        + ", ".join(f"{d} layers {spread_text(gap[d])}" for d in ds)
        + f" (unigram entropy {m['unigram']:.2f}, bigram {m['bigram']:.2f}); a linear probe "
        f"reads the position from the last layer of the {deep}-layer model with accuracy "
        f"{spread_text(probe[ARMS[0]])} with residuals and {spread_text(probe[ARMS[1]])} "
        f"without (chance {1 / CONTEXT:.3f})."
    )
    deep_val = [val[_label((a, deep))] for a in ARMS]
    unresolved = not resolved(*deep_val) and not resolved(probe[ARMS[0]], probe[ARMS[1]])
    checks = [trainable, grows, carries]
    return ("no effect resolved" if unresolved and not any(checks) else verdict_of(checks)), reason


def _thresholds() -> list[Threshold]:
    note = "000 'Residual Connections' (the note gives no number; the lab's margin)"
    return [
        Threshold(
            "validation-loss gap without minus with residuals at the deepest stack",
            f"> {GAP:g} nats/char on every seed ('allows for learning much deeper networks')",
            note,
        ),
        Threshold(
            "the gap grows with depth",
            "deepest stack's gap above the shallowest's on every seed (seed ranges apart)",
            note,
        ),
        Threshold(
            "position survives in the residual stream",
            "last-layer probe accuracy with residuals above without, on every seed",
            "000 'Residual Connections' (a second reading of the residual stream)",
        ),
    ]


def _rows(gated: dict[str, Gated], ds: list[int]) -> list[dict[str, Any]]:
    return [
        {
            "residuals": a,
            "layers": d,
            "lr": g.chosen,
            "train loss": spread_text(g.values("train")),
            "val loss": spread_text(g.values("val")),
            "|grad| block 1 at init": spread_text(g.values("grad0")),
            "position probe, last layer": spread_text([p[-1] for p in g.values("probe")]),
        }
        for d in ds
        for a in ARMS
        for g in [gated[_label((a, d))]]
    ]


def _setup(m: dict[str, Any], sweep: Sweep, quick: bool) -> list[str]:
    n = m["steps"]
    lines = [
        f"Character LM on {m['source']}, windows of {CONTEXT + 1} characters, vocabulary "
        f"{m['vocab']}.",
        f"Decoder-only, pre-norm, d_model 64, 4 heads, learned positions, {m['depths']} layers; "
        "'without residuals' replaces x + f(LN(x)) by f(LN(x)) in both sublayers of every "
        "block (the final norm is kept).",
        f"AdamW, {n} steps of 32, warm-up {n // 10} steps then cosine to lr/10; the same recipe "
        "and seeds for every arm; two single-threaded runs at a time.",
        sweep.describe(f"{n} steps"),
        "Position probe: least-squares linear map (with bias) from the layer's vectors to the "
        "one-hot position, fitted on half of the held-out windows, accuracy on the other half.",
    ]
    return lines if quick else [*lines, COST]


def _figures(gated: dict[str, Gated], m: dict[str, Any], out_dir: Path) -> list[FigureRef]:
    ds, n_seeds = m["depths"], len(m["seeds"])
    deep = ds[-1]
    depth_fig = seeds_chart(
        {
            a: (ds, [[gated[_label((a, d))].values("val")[i] for d in ds] for i in range(n_seeds)])
            for a in ARMS
        },
        xlabel="layers",
        ylabel="validation loss (nats/char)",
        title=f"trainability against depth ({n_seeds} seed(s))",
        hline=m["unigram"],
        logx=True,
    )
    depth_fig.axes[0].set_xticks(list(ds), [str(d) for d in ds])  # the depths run, not 2^k
    depth_fig.axes[0].minorticks_off()
    probe_fig = seeds_chart(
        {a: (range(deep + 1), gated[_label((a, deep))].values("probe")) for a in ARMS},
        xlabel=f"layer (0 = embedding, {deep} = last block)",
        ylabel="position-probe accuracy",
        title=f"linear probe for position, {deep} layers",
        hline=1 / CONTEXT,
    )
    probe_fig.axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    return [
        save_chart(
            depth_fig,
            out_dir,
            "depth.png",
            "Validation loss at each arm's chosen learning rate against depth, with and without "
            "residual connections (mean over seeds, min-max band); the dashed line is the "
            "unigram entropy.",
        ),
        save_chart(
            probe_fig,
            out_dir,
            "position_probe.png",
            f"Accuracy of a linear probe for the position t (of {CONTEXT}) after each layer of "
            f"the {deep}-layer models (mean over seeds, min-max band); dashed: chance "
            f"1/{CONTEXT}.",
        ),
    ]


@experiment("residual", notes="000 'Residual Connections'")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Residual connections make deep stacks trainable (without them training degrades as depth
    grows), and the residual stream carries the position information of the embedding to every
    layer."""
    return write_up(measure(quick, seed, data), out_dir, quick)
