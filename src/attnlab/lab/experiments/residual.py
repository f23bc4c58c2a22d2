"""Experiment ``residual``: residual connections and depth (000 "Residual connections"; 003).

000 ("Residual Connections"): f_residual(h) = f(h) + h, "the gradient flow of the identity
function is great (the local gradient is 1 everywhere!) so the connection allows for learning
much deeper networks". A second reading of the residual
stream: whatever the embedding put there -- the position vectors among them -- stays available to
every later layer unless a block removes it.

Two arms of the same pre-norm decoder-only character LM at depths 1, 2, 3, 6, 12 and 24 (the
shallow ones show where training without residuals starts to fail):

    with residuals      h = h + f(LN(h))     (the library's block)
    without residuals   h = f(LN(h))         (both sublayers of every block)

Measured per seed: the training loss after a fixed budget (trainability), the gradient norm of
the first block at initialisation, and a *linear probe for position*: a least-squares linear map
from each layer's output vectors to the one-hot position index t, fitted on half of held-out
windows and scored (accuracy of the argmax) on the other half.

Shapes: N windows, B batch, T context, D d_model, L layers.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from attnlab.lab.kit.charts import save_chart, seeds_chart
from attnlab.lab.kit.corpus import char_lm_config, text_windows, unigram_bigram
from attnlab.lab.kit.fit import FitConfig, block_grad_norms, eval_loss, fit, lm_loss
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Competence, Report, Table, outcome, spread_text
from attnlab.lab.kit.seeds import bands, run_arms, start_seeds
from attnlab.models import build_model
from attnlab.nn.blocks import BlockOutput, CausalBlock

ARMS = ("with residuals", "without residuals")


class BlockWithoutResidual(CausalBlock):
    """The pre-norm causal block with both residual connections removed: h = f(LN(h)) for each
    sublayer f (the block's hook points still see LN(h) and the new h)."""

    def forward(self, x, mask=None, *, positions=None, cache=None, need_weights=False):
        x = self.hook_x(x)
        opts = dict(causal=True, positions=positions, cache=cache, need_weights=need_weights)
        a = self.self_attn(self.hook_attn_norm(self.self_attn_norm(x)), mask, **opts)
        h = self.hook_resid_mid(self.drop(a.out))  # no "x +"
        out = self.hook_resid_post(self.drop(self.ffn(self.hook_ffn_norm(self.ffn_norm(h)))))
        return BlockOutput(out, a.weights, None)


def make_model(arm: str, vocab: int, context: int, n_layers: int) -> nn.Module:
    model = build_model(char_lm_config(vocab, context, n_layers))
    if arm == "without residuals":
        for block in model.blocks:
            block.__class__ = BlockWithoutResidual
    return model


@torch.no_grad()
def layer_outputs(model: nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
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
    return (2, 4) if quick else (1, 2, 3, 6, 12, 24)


def train_job(job: tuple) -> dict:
    arm, n_layers, seed, quick = job
    context = 32
    train, val, chars, _ = text_windows(quick, context)
    torch.manual_seed(seed)
    model = make_model(arm, len(chars), context, n_layers)
    grad0 = block_grad_norms(model, train[:32])[0]  # the first block, at initialisation
    model.zero_grad()
    cfg = FitConfig(
        steps=30 if quick else 400,
        batch_size=32,
        lr=1e-3,
        warmup_steps=5 if quick else 40,
        min_lr=1e-4,
    )
    result = fit(model, (train,), lm_loss, cfg, seed=seed)
    val_loss = eval_loss(model, (val[:256],), lm_loss)
    probe_ids = val[: 64 if quick else 400, :context]  # (N, T): the probe's own two halves
    probes = [position_probe(h) for h in layer_outputs(model, probe_ids)]
    return {
        "losses": result.losses,
        "train": result.final_loss(),
        "val": val_loss,
        "grad0": grad0,
        "probe": probes,
        "diverged": result.diverged,
    }


@experiment("residual", notes="000 'Residual Connections'")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Residual connections make deep stacks trainable (without them training degrades as depth
    grows), and the residual stream carries the position information of the embedding to every
    layer."""
    seeds = start_seeds(seed, quick)
    train, val, chars, source = text_windows(quick, 32)
    uni, bi = unigram_bigram(train, val, len(chars))
    ds = depths(quick)
    per = run_arms(train_job, [(a, d) for a in ARMS for d in ds], seeds, quick)
    val_loss = {k: [r["val"] for r in v] for k, v in per.items()}
    rows = [
        {
            "residuals": a,
            "layers": d,
            "train loss": spread_text([r["train"] for r in per[(a, d)]]),
            "val loss": spread_text(val_loss[(a, d)]),
            "|grad| block 1 at init": spread_text([r["grad0"] for r in per[(a, d)]]),
            "position probe, last layer": spread_text([r["probe"][-1] for r in per[(a, d)]]),
        }
        for d in ds
        for a in ARMS
    ]
    competence = [
        Competence(
            f"with residuals, {d} layers",
            "validation loss (nats/char) below the bigram baseline",
            bi,
            val_loss[("with residuals", d)],
            higher_is_better=False,
        )
        for d in ds
    ]
    gap = {
        d: [
            b - a
            for a, b in zip(val_loss[("with residuals", d)], val_loss[("without residuals", d)])
        ]
        for d in ds
    }
    trainable = min(gap[ds[-1]]) > 0.1  # without residuals clearly worse at the deepest stack
    # degrades as depth grows: the gap at the deepest stack exceeds the shallowest's on every
    # seed (outside the spread), not just on average
    grows = min(gap[ds[-1]]) > max(gap[ds[0]])
    deep = ds[-1]
    probe_with = [r["probe"][-1] for r in per[("with residuals", deep)]]
    probe_without = [r["probe"][-1] for r in per[("without residuals", deep)]]
    carries = min(probe_with) > max(probe_without)
    checks = [trainable, grows, carries]
    reason = (
        "validation loss without minus with residuals (nats/char, mean (min-max) over "
        f"{len(seeds)} seeds): "
        + ", ".join(f"{d} layers {spread_text(gap[d])}" for d in ds)
        + f" (bigram baseline {bi:.2f}); a linear probe reads the position from the last layer "
        f"of the {deep}-layer model with accuracy {spread_text(probe_with)} with residuals and "
        f"{spread_text(probe_without)} without (chance {1 / 32:.3f})."
    )
    depth_fig = seeds_chart(
        {a: (ds, [[val_loss[(a, d)][i] for d in ds] for i in range(len(seeds))]) for a in ARMS},
        xlabel="layers",
        ylabel="validation loss (nats/char)",
        title=f"trainability against depth ({len(seeds)} seed(s))",
        hline=bi,
        logx=True,
    )
    depth_fig.axes[0].set_xticks(list(ds), [str(d) for d in ds])  # the depths run, not 2^k
    depth_fig.axes[0].minorticks_off()
    probe_fig = seeds_chart(
        {a: (range(deep + 1), [r["probe"] for r in per[(a, deep)]]) for a in ARMS},
        xlabel=f"layer (0 = embedding, {deep} = last block)",
        ylabel="position-probe accuracy",
        title=f"linear probe for position, {deep} layers",
        hline=1 / 32,
    )
    figures = [
        save_chart(
            depth_fig,
            out_dir,
            "depth.png",
            "Validation loss after the same budget "
            "against depth, with and without residual connections (mean over seeds, "
            "min-max band); the dashed line is the bigram baseline.",
        ),
        save_chart(
            probe_fig,
            out_dir,
            "position_probe.png",
            "Accuracy of a linear probe for "
            f"the position t (of 32) after each layer of the {deep}-layer models (mean "
            "over seeds, min-max band); dashed: chance 1/32.",
        ),
    ]
    return Report(
        name="residual",
        title="Residual connections: trainability with depth, and position in the residual stream",
        claim="Residual connections simply add the input of a layer to the output of that "
        "layer: f_residual(h) = f(h) + h, the intuition being that (1) the gradient flow of the "
        "identity function is great (the local gradient is 1 everywhere!) so the connection "
        "allows for learning much deeper networks.",
        source="000, 'Residual Connections'",
        setup=[
            f"Character LM on {source}, windows of 33 characters, vocabulary {len(chars)}.",
            f"Decoder-only, pre-norm, d_model 64, 4 heads, learned positions, {list(ds)} layers; "
            "'without residuals' replaces x + f(LN(x)) by f(LN(x)) in both sublayers of every "
            "block (the final norm is kept).",
            f"AdamW lr 1e-3, {30 if quick else 400} steps of 32, warm-up + cosine; the same "
            "recipe and seeds for every arm; two single-threaded runs at a time.",
            "Position probe: least-squares linear map (with bias) from the layer's vectors to the "
            "one-hot position, fitted on half of the held-out windows, accuracy on the other "
            "half.",
        ],
        tables=[Table("per depth and arm (mean (min-max) over seeds)", rows)],
        figures=figures,
        **outcome(checks, reason, competence, seeds, quick),
        per_seed={
            "val": {f"{a}, {d}": v for (a, d), v in val_loss.items()},
            "probe_last": {f"{a}, {deep}": [r["probe"][-1] for r in per[(a, deep)]] for a in ARMS},
        },
        metrics={
            "unigram": uni,
            "bigram": bi,
            "probe": {a: bands([r["probe"] for r in per[(a, deep)]])[0] for a in ARMS},
        },
        findings=[
            "Without residuals even the causal mask leaves some position signal (a token can "
            "count how many keys it sees), so the probe need not fall to chance.",
        ],
    )
