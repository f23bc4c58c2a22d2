"""Experiment ``future_mask``: why a decoder needs the future mask (000 "Masking the future").

000 ("Future masking"): "we can't look at the future when predicting it -- otherwise the problem
becomes trivial"; a decoder uses "future masking at each application of self-attention" (the
mask sets the score of every j > i to -inf). A language model trained without it
sees w_{t+1} while it is asked to predict w_{t+1}: it can copy the answer, so its training loss
falls far below any honest model's, but at generation time the future does not exist yet and
what it learned is useless.

Two arms, the same decoder-only character LM (``CausalBlock``) trained with the same recipe:
"masked" (the library's decoder) and "unmasked" (``block.causal = False`` on every block, so
position t attends to every position of the window). Both are gated alike
(:mod:`attnlab.lab.kit.gating`): a learning-rate sweep whose choice is bracketed and a step
doubling of the teacher-forced validation loss -- each arm judged in its own training condition,
never by the generation the claim predicts it fails at. Measured per seed:

- training loss (teacher forcing, the condition each arm was trained in);
- the *prefix loss* on validation text: -log p(w_{t+1} | w_{1:t}) with the model fed only the
  prefix w_{1:t}, position by position: the situation of generation, where the future is absent.
  For the masked model it equals its teacher-forced loss (the mask already hides the future);
- greedy and sampled continuations of validation prompts (``attnlab.generate``, no KV cache).

Shapes: N windows, B batch, T context, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.generate import GenerationConfig, generate
from attnlab.lab.kit.charts import curves_chart, save_chart, seeds_bars
from attnlab.lab.kit.corpus import char_lm_config, text_windows, unigram_bigram
from attnlab.lab.kit.fit import FitConfig, eval_loss, fit, lm_loss
from attnlab.lab.kit.gating import Gated, Sweep, gate_arms, sweep_rows
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import FigureRef, Report, Table, Threshold
from attnlab.lab.kit.seeds import resolved, spread, spread_text, start_seeds
from attnlab.lab.kit.verdict import Competence, gated_fields, verdict_of
from attnlab.models import build_model

ARMS = ("masked", "unmasked")
UNMASKED_TARGET = 0.3  # nats/char: copying the visible next character is nearly free
SWEEP = Sweep(
    grid=(1e-3, 3e-3, 1e-2),
    tolerance=0.05,
    metric="teacher-forced validation loss (nats/char)",
    metric_key="val teacher-forced",
    factor=3.0,
    max_extensions=2,
    doubling_seeds=3,
)
QUICK_SWEEP = SWEEP.quick(grid=(1e-3, 3e-3))
COST = (
    "Full run: `attnlab experiment future_mask --seed 0 --data ../shared/data`. Estimate for "
    "2 idle cores, from a single-thread probe (27 Nov 2026: 86 ms per training step, ~2 s of "
    "prefix loss and continuations per run): each arm trains 3 sweep rates and 2 more seeds at "
    "800 steps and a doubling of 1600 steps on all 3 seeds (8800 steps), ~26 min of CPU: about "
    "13 min on both cores, up to ~18 min when sweeps extend their grids."
)
CLAIM = (
    "One crucial aspect of this process is that we can't look at the future when predicting it "
    "-- otherwise the problem becomes trivial. [...] Transformer Decoders differ from "
    "Transformer Encoders simply by using future masking at each application of self-attention. "
    "This ensures that the informational constraint (no cheating by looking at the future!) "
    "holds throughout the architecture."
)
THRESHOLDS = [
    Threshold(
        "trained without the mask, the problem becomes trivial",
        "unmasked training loss below the masked one's on every seed (seed ranges apart; the "
        "note gives no number)",
        "000 'Future masking'",
    ),
    Threshold(
        "what it learned is useless when generating (the future is absent)",
        "unmasked prefix loss above the masked one's on every seed (seed ranges apart)",
        "000 'Transformer Decoder' ('no cheating by looking at the future!')",
    ),
]
LOSS_KEYS = ("train", "val teacher-forced", "val prefix")


def make_model(arm: str, vocab: int, context: int) -> nn.Module:
    model: Any = build_model(char_lm_config(vocab, context))
    if arm == "unmasked":
        for block in model.blocks:
            block.causal = False  # every position attends to the whole window, future included
    return model


@torch.no_grad()
def prefix_loss(model: nn.Module, windows: torch.Tensor) -> float:
    """Mean -log p(w_{t+1} | w_{1:t}) with the model given only w_{1:t} (nats per character).

    One forward pass per prefix length t, taking the logits at the prefix's last position."""
    model.eval()
    total, count = 0.0, 0
    for t in range(1, windows.size(1)):
        logits = model(windows[:, :t]).logits[:, -1]  # (N, V): predicts w_{t+1}
        total += float(F.cross_entropy(logits, windows[:, t], reduction="sum"))
        count += windows.size(0)
    return total / count


def continue_text(
    model: Any, prompt: torch.Tensor, n: int, temperature: float, gen: torch.Generator
) -> list[int]:
    """Generate ``n`` characters after ``prompt`` (1-D ids) with ``attnlab.generate``, the model
    fed only the text so far (its last ``max_len`` characters) at each step: no KV cache, so the
    unmasked arm sees exactly the prefix; temperature 0 = greedy, else a seed drawn from ``gen``."""
    seed = int(torch.randint(2**31 - 1, (), generator=gen)) if temperature else None
    config = GenerationConfig(
        max_new_tokens=n, temperature=temperature, use_cache=False, seed=seed, stop_token_ids=()
    )
    return generate(model, [prompt.tolist()], config).tokens[0]


def distinct_ratio(ids: list[int], n: int = 4) -> float:
    """Distinct n-grams / all n-grams of a generated text (low = it repeats itself)."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / max(1, len(grams))


def context(quick: bool) -> int:
    return 32 if quick else 64


def train_job(job: tuple) -> dict[str, Any]:
    """One arm at a learning rate, ``scale`` x the steps (gating's job): losses and samples."""
    arm, lr, scale, seed, quick, data = job
    train, val, chars, _ = text_windows(quick, context(quick), data)
    torch.manual_seed(seed)
    model = make_model(arm, len(chars), context(quick))
    base = FitConfig.sized(quick, 800, warmup_steps=100, lr=lr, min_lr=lr / 30)
    cfg = replace(base, steps=base.steps * scale, warmup_steps=base.warmup_steps * scale)
    result = fit(model, (train,), lm_loss, cfg, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    prompts = [val[i, :24] for i in range(3)]
    n_new = 80 if quick else 160
    diverged = result.diverged
    return {
        "losses": result.losses,
        "train": result.final_loss(),
        "val teacher-forced": math.inf if diverged else eval_loss(model, (val[:256],), lm_loss),
        "val prefix": prefix_loss(model, val[: 16 if quick else 48]),
        "samples": {
            name: [continue_text(model, p, n_new, temp, gen) for p in prompts]
            for name, temp in (("greedy", 0.0), ("tau 0.8", 0.8))
        },
        "prompts": [p.tolist() for p in prompts],
        "steps": cfg.steps,
        "batch": cfg.batch_size,
    }


def measure(quick: bool, seed: int, data: Path | None) -> dict[str, Any]:
    """Both arms gated and trained on every seed, as plain numbers (no prose, no figures)."""
    seeds = start_seeds(seed, quick)
    train, val, chars, source = text_windows(quick, context(quick), data)
    uni, bi = unigram_bigram(train, val, len(chars))
    sweep = QUICK_SWEEP if quick else SWEEP
    gated = gate_arms(train_job, ARMS, sweep, seeds, quick, data)
    model: Any = make_model(ARMS[0], len(chars), context(quick))
    return {
        "seeds": seeds,
        "source": source,
        "chars": chars,
        "n_train": len(train),
        "n_val": len(val),
        "unigram": uni,
        "bigram": bi,
        "n_params": sum(p.numel() for p in model.parameters()),
        "n_layers": sum(1 for _ in model.blocks),
        "gated": {arm: asdict(g) for arm, g in gated.items()},
    }


def write_up(measured: dict[str, Any], out_dir: Path, quick: bool) -> Report:
    """Tables, figures, gate and verdict from :func:`measure`'s numbers."""
    m = measured
    sweep = QUICK_SWEEP if quick else SWEEP
    gated = {k: Gated(**v) for k, v in m["gated"].items()}
    num = {a: {k: gated[a].values(k) for k in LOSS_KEYS} for a in ARMS}
    verdict, reason = _verdict(m, num)
    return Report(
        name="future_mask",
        title="The future mask: an LM trained without it cannot generate",
        claim=CLAIM,
        source="000, 'Future masking'; 'Transformer Decoder'",
        setup=_setup(m, gated, sweep, quick),
        thresholds=THRESHOLDS,
        tables=_tables(m, gated, num),
        figures=_figures(m, gated, num, out_dir),
        **gated_fields(
            verdict, reason, _competence(m, gated, sweep), m["seeds"], quick, arms=list(ARMS)
        ),
        per_seed=num,
        metrics={
            "losses": {a: {k: spread(v) for k, v in num[a].items()} for a in ARMS},
            "unigram": m["unigram"],
            "bigram": m["bigram"],
        },
        findings=_findings(num),
    )


CRITERIA = {  # arm -> (criterion, the measured key): each arm in its own training condition
    "masked": (
        "validation loss, teacher-forced (nats/char), below the bigram baseline",
        "val teacher-forced",
    ),
    "unmasked": (
        "training loss (nats/char) with the future visible (its own training condition)",
        "train",
    ),
}


def _competence(m: dict[str, Any], gated: dict[str, Gated], sweep: Sweep) -> list[Competence]:
    steps = gated["masked"].runs[0]["steps"]
    threshold = {"masked": m["bigram"], "unmasked": UNMASKED_TARGET}
    return [
        gated[a].competence(a, CRITERIA[a][0], threshold[a], sweep, steps, CRITERIA[a][1], False)
        for a in ARMS
    ]


def _verdict(m: dict[str, Any], num: dict[str, dict[str, list[float]]]) -> tuple[str, str]:
    """(verdict word, reason): held / did not hold / mixed by the two checks; "no effect
    resolved" when neither held and both predicted differences lie inside the seed spread."""
    lower_train = max(num["unmasked"]["train"]) < min(num["masked"]["train"])
    cannot_generate = min(num["unmasked"]["val prefix"]) > max(num["masked"]["val prefix"])
    worse_than_bigram = min(num["unmasked"]["val prefix"]) > m["bigram"]
    reason = (
        f"training loss (nats/char, mean (min-max) over {len(m['seeds'])} seed(s), each arm at "
        f"its chosen rate): unmasked {spread_text(num['unmasked']['train'])} vs masked "
        f"{spread_text(num['masked']['train'])}; fed only the prefix, as in generation: unmasked "
        f"{spread_text(num['unmasked']['val prefix'])} vs masked "
        f"{spread_text(num['masked']['val prefix'])} (bigram counts {m['bigram']:.2f}, unigram "
        f"{m['unigram']:.2f})" + (", worse than the bigram baseline." if worse_than_bigram else ".")
    )
    unresolved = not any(
        resolved(num["unmasked"][k], num["masked"][k]) for k in ("train", "val prefix")
    )
    checks = [lower_train, cannot_generate]
    return ("no effect resolved" if unresolved and not any(checks) else verdict_of(checks)), reason


def _tables(
    m: dict[str, Any], gated: dict[str, Gated], num: dict[str, dict[str, list[float]]]
) -> list[Table]:
    chars = m["chars"]
    rows: list[dict[str, Any]] = [
        {
            "arm": a,
            "lr": gated[a].chosen,
            **{f"{k} (nats/char)": spread_text(v) for k, v in num[a].items()},
            "greedy distinct 4-grams": spread_text(
                [
                    float(np.mean([distinct_ratio(x) for x in s["greedy"]]))
                    for s in gated[a].values("samples")
                ]
            ),
        }
        for a in ARMS
    ]
    rows += [
        {"arm": "unigram counts", "val prefix (nats/char)": f"{m['unigram']:.3g}"},
        {"arm": "bigram counts", "val prefix (nats/char)": f"{m['bigram']:.3g}"},
    ]

    def decode(ids: list[int]) -> str:
        return "".join(chars[i] for i in ids).replace("\n", " / ")

    first = {a: gated[a].runs[0] for a in ARMS}
    sample_rows = [
        {
            "arm": a,
            "decoding": mode,
            "prompt": decode(first[a]["prompts"][i]),
            "continuation": decode(first[a]["samples"][mode][i]),
        }
        for a in ARMS
        for mode in ("greedy", "tau 0.8")
        for i in range(2)
    ]
    return [
        Table("losses per arm (mean (min-max) over seeds)", rows),
        Table(f"continuations of validation prompts (seed {m['seeds'][0]})", sample_rows),
        Table("learning-rate sweep (first seed)", sweep_rows(gated, str)),
    ]


def _figures(
    m: dict[str, Any],
    gated: dict[str, Gated],
    num: dict[str, dict[str, list[float]]],
    out_dir: Path,
) -> list[FigureRef]:
    bars = {f"{a}, {k}": num[a][k] for a in ARMS for k in ("train", "val prefix")}
    return [
        save_chart(
            curves_chart(
                {f"{a}, lr {gated[a].chosen:g}": gated[a].values("losses") for a in ARMS},
                title="training loss (teacher forcing)",
                logy=True,
            ),
            out_dir,
            "training.png",
            "Training loss of both arms at their chosen learning rates (mean over seeds, "
            "min-max band): without the mask the model can read the character it must predict.",
        ),
        save_chart(
            seeds_bars(
                bars,
                ylabel="nats per character",
                title="loss seen in training vs loss when generating",
                reference=m["bigram"],
                reference_label=f"bigram counts ({m['bigram']:.2f})",
            ),
            out_dir,
            "losses.png",
            "Training loss and validation prefix loss (the model fed only the text so far) per "
            "arm, mean over seeds with min-max bars; the dashed line is the bigram baseline.",
        ),
    ]


def _setup(m: dict[str, Any], gated: dict[str, Gated], sweep: Sweep, quick: bool) -> list[str]:
    run0 = gated["masked"].runs[0]
    lines = [
        f"Character LM on {m['source']}: {m['n_train']} training and {m['n_val']} validation "
        f"windows of {context(quick) + 1} characters, vocabulary {len(m['chars'])}.",
        f"Model: decoder-only, {m['n_layers']} pre-norm layers, d_model 64, 4 heads, learned "
        f"positions ({m['n_params']:,} parameters); 'unmasked' sets causal = False on every "
        "block.",
        f"AdamW, warm-up + cosine to lr/30, {run0['steps']} steps of {run0['batch']} windows; "
        "the same recipe and seeds for both arms; two single-threaded runs at a time.",
        sweep.describe(f"{run0['steps']} steps"),
        "Prefix loss: the model gets w_1..w_t alone and predicts w_{t+1}, for every t of "
        f"{16 if quick else 48} validation windows (what generation does).",
    ]
    return lines if quick else [*lines, COST]


def _findings(num: dict[str, dict[str, list[float]]]) -> list[str]:
    return [
        "The masked model's prefix loss equals its teacher-forced loss up to the sample "
        f"({spread_text(num['masked']['val prefix'])} vs "
        f"{spread_text(num['masked']['val teacher-forced'])}): with the mask, training sees "
        "exactly the conditions of generation.",
        "The unmasked model's validation loss under teacher forcing is "
        f"{spread_text(num['unmasked']['val teacher-forced'])}: it generalises its shortcut to "
        "new text, which is why its training curve looks excellent; the shortcut needs the next "
        "character, which generation does not have.",
    ]


@experiment("future_mask", notes="000 'Future masking'")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """A decoder must not see the future: trained without the mask, an LM reaches a far lower
    training loss by copying the next token and cannot generate."""
    return write_up(measure(quick, seed, data), out_dir, quick)
