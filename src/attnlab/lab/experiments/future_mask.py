"""Experiment ``future_mask``: why a decoder needs the future mask (000 "Masking the future").

000 ("Future masking"): "we can't look at the future when predicting it -- otherwise the problem
becomes trivial"; a decoder uses "future masking at each application of self-attention" (the
mask sets the score of every j > i to -inf). A language model trained without it
sees w_{t+1} while it is asked to predict w_{t+1}: it can copy the answer, so its training loss
falls far below any honest model's, but at generation time the future does not exist yet and
what it learned is useless.

Two arms, the same decoder-only character LM (``CausalBlock``) trained with the same recipe:
"masked" (the library's decoder) and "unmasked" (``block.causal = False`` on every block, so
position t attends to every position of the window). Measured per seed:

- training loss (teacher forcing, the condition each arm was trained in);
- the *prefix loss* on validation text: -log p(w_{t+1} | w_{1:t}) with the model fed only the
  prefix w_{1:t}, position by position: the situation of generation, where the future is absent.
  For the masked model it equals its teacher-forced loss (the mask already hides the future);
- greedy and sampled continuations of validation prompts.

Shapes: N windows, B batch, T context, V vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.generate import GenerationConfig, generate
from attnlab.lab.kit.charts import bar_chart, curves_chart, save_chart
from attnlab.lab.kit.corpus import char_lm_config, text_windows, unigram_bigram
from attnlab.lab.kit.fit import FitConfig, eval_loss, fit, lm_loss
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Competence, Report, Table, outcome, spread, spread_text
from attnlab.lab.kit.seeds import run_arms, start_seeds
from attnlab.models import build_model

ARMS = ("masked", "unmasked")
UNMASKED_TARGET = 0.3  # nats/char: copying the visible next character is nearly free


def make_model(arm: str, vocab: int, context: int, quick: bool) -> nn.Module:
    model = build_model(char_lm_config(vocab, context))
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
    model: nn.Module, prompt: torch.Tensor, n: int, temperature: float, gen: torch.Generator
) -> list[int]:
    """Generate ``n`` characters after ``prompt`` (1-D ids) with ``attnlab.generate``, the model
    fed only the text so far (its last ``max_len`` characters) at each step: no KV cache, so the
    unmasked arm sees exactly the prefix; temperature 0 = greedy, else a seed drawn from ``gen``."""
    seed = int(torch.randint(2**31 - 1, (), generator=gen)) if temperature else None
    config = GenerationConfig(
        max_new_tokens=n, temperature=temperature, use_cache=False, seed=seed, stop_token_ids=()
    )
    return generate(model, [prompt.tolist()], config).tokens[0]


def train_job(job: tuple) -> dict:
    arm, seed, quick = job
    context = 32 if quick else 64
    train, val, chars, _ = text_windows(quick, context)
    torch.manual_seed(seed)
    model = make_model(arm, len(chars), context, quick)
    cfg = FitConfig.sized(quick, 800, warmup_steps=100, lr=3e-3, min_lr=1e-4)
    result = fit(model, (train,), lm_loss, cfg, seed=seed)
    probe = val[: 16 if quick else 48]
    gen = torch.Generator().manual_seed(seed)
    prompts = [val[i, :24] for i in range(3)]
    n_new = 80 if quick else 160
    samples = {
        name: [continue_text(model, p, n_new, temp, gen) for p in prompts]
        for name, temp in (("greedy", 0.0), ("tau 0.8", 0.8))
    }
    return {
        "losses": result.losses,
        "train": result.final_loss(),
        "val teacher-forced": eval_loss(model, (val[:256],), lm_loss),
        "val prefix": prefix_loss(model, probe),
        "samples": samples,
        "prompts": [p.tolist() for p in prompts],
        "seconds": result.seconds,
    }


def distinct_ratio(ids: list[int], n: int = 4) -> float:
    """Distinct n-grams / all n-grams of a generated text (low = it repeats itself)."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / max(1, len(grams))


@experiment("future_mask", notes="000 'Future masking'")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """A decoder must not see the future: trained without the mask, an LM reaches a far lower
    training loss by copying the next token and cannot generate."""
    seeds = start_seeds(seed, quick)
    context = 32 if quick else 64
    train, val, chars, source = text_windows(quick, context)
    uni, bi = unigram_bigram(train, val, len(chars))
    per = run_arms(train_job, ARMS, seeds, quick)
    num = {
        a: {k: [r[k] for r in per[a]] for k in ("train", "val teacher-forced", "val prefix")}
        for a in ARMS
    }
    rows = [
        {
            "arm": a,
            **{f"{k} (nats/char)": spread_text(v) for k, v in num[a].items()},
            "greedy distinct 4-grams": spread_text(
                [
                    float(np.mean([distinct_ratio(x) for x in r["samples"]["greedy"]]))
                    for r in per[a]
                ]
            ),
        }
        for a in ARMS
    ]
    rows += [
        {"arm": "unigram counts", "val prefix (nats/char)": f"{uni:.3g}"},
        {"arm": "bigram counts", "val prefix (nats/char)": f"{bi:.3g}"},
    ]
    decode = lambda ids: "".join(chars[i] for i in ids).replace("\n", " / ")  # noqa: E731
    first = {a: per[a][0] for a in ARMS}
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
    competence = [
        Competence(
            "masked",
            "validation loss, teacher-forced (nats/char), below the bigram baseline",
            bi,
            num["masked"]["val teacher-forced"],
            higher_is_better=False,
        ),
        Competence(
            "unmasked",
            "training loss (nats/char) with the future visible (its own training condition)",
            UNMASKED_TARGET,
            num["unmasked"]["train"],
            higher_is_better=False,
        ),
    ]
    lower_train = max(num["unmasked"]["train"]) < min(num["masked"]["train"])
    cannot_generate = min(num["unmasked"]["val prefix"]) > max(num["masked"]["val prefix"])
    worse_than_bigram = min(num["unmasked"]["val prefix"]) > bi
    checks = [lower_train, cannot_generate]
    reason = (
        f"training loss (nats/char, mean (min-max) over {len(seeds)} seeds): unmasked "
        f"{spread_text(num['unmasked']['train'])} vs masked {spread_text(num['masked']['train'])}"
        "; fed only the prefix, as in generation: unmasked "
        f"{spread_text(num['unmasked']['val prefix'])} vs masked "
        f"{spread_text(num['masked']['val prefix'])} (bigram counts {bi:.2f}, unigram "
        f"{uni:.2f})" + (", worse than the bigram baseline." if worse_than_bigram else ".")
    )
    figures = [
        save_chart(
            curves_chart(
                {a: [r["losses"] for r in per[a]] for a in ARMS},
                title="training loss (teacher forcing)",
                logy=True,
            ),
            out_dir,
            "training.png",
            "Training loss of both arms (mean over seeds, min-max "
            "band): without the mask the model can read the character it must predict.",
        ),
        save_chart(
            bar_chart(
                {
                    f"{a}, {k}": spread(num[a][k])["mean"]
                    for a in ARMS
                    for k in ("train", "val prefix")
                },
                ylabel="nats per character",
                title="loss seen in training vs loss when generating",
                errors={
                    f"{a}, {k}": (min(num[a][k]), max(num[a][k]))
                    for a in ARMS
                    for k in ("train", "val prefix")
                },
                reference=bi,
                reference_label=f"bigram counts ({bi:.2f})",
            ),
            out_dir,
            "losses.png",
            "Training loss and validation prefix loss (the model "
            "fed only the text so far) per arm, mean over seeds with min-max bars; the "
            "dashed line is the bigram baseline.",
        ),
    ]
    model_cfg = make_model("masked", len(chars), context, quick)
    n_params = sum(p.numel() for p in model_cfg.parameters())
    return Report(
        name="future_mask",
        title="The future mask: an LM trained without it cannot generate",
        claim="One crucial aspect of this process is that we can't look at the future when "
        "predicting it -- otherwise the problem becomes trivial. [...] Transformer Decoders "
        "differ from Transformer Encoders simply by using future masking at each application of "
        "self-attention. This ensures that the informational constraint (no cheating by looking "
        "at the future!) holds throughout the architecture.",
        source="000, 'Future masking'; 'Transformer Decoder'",
        setup=[
            f"Character LM on {source}: {len(train)} training and {len(val)} validation windows "
            f"of {context + 1} characters, vocabulary {len(chars)}.",
            f"Model: decoder-only, {len(model_cfg.blocks)} pre-norm layers, d_model "
            f"{model_cfg.embed.tok_emb.weight.size(1)}, 4 heads, learned positions "
            f"({n_params:,} parameters); 'unmasked' sets causal = False on every block.",
            f"AdamW lr 3e-3, warm-up + cosine, {'40' if quick else '800'} steps of "
            f"{32 if quick else 64} windows; the same recipe and seeds for both arms; two "
            "single-threaded runs at a time.",
            "Prefix loss: the model gets w_1..w_t alone and predicts w_{t+1}, for every t of "
            f"{16 if quick else 48} validation windows (what generation does).",
        ],
        tables=[
            Table("losses per arm (mean (min-max) over seeds)", rows),
            Table(f"continuations of validation prompts (seed {seeds[0]})", sample_rows),
        ],
        figures=figures,
        **outcome(checks, reason, competence, seeds, quick),
        per_seed=num,
        metrics={
            "losses": {a: {k: spread(v) for k, v in num[a].items()} for a in ARMS},
            "unigram": uni,
            "bigram": bi,
        },
        findings=[
            "The masked model's prefix loss equals its teacher-forced loss up to the sample "
            f"({spread_text(num['masked']['val prefix'])} vs "
            f"{spread_text(num['masked']['val teacher-forced'])}): with the mask, training sees "
            "exactly the conditions of generation.",
            "The unmasked model's validation loss under teacher forcing is "
            f"{spread_text(num['unmasked']['val teacher-forced'])}: it generalises its shortcut "
            "to new text, which is why its training curve looks excellent; the shortcut needs "
            "the next character, which generation does not have.",
        ],
    )
