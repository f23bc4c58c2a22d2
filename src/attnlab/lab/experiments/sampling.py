"""Experiment ``sampling``: greedy vs random-weighted sampling from the same char LM (003).

003 ("Linear + Softmax - Prediction"): *greedy sampling* outputs the most probable token,
w_t = argmax_w p(w | w_{<t}); *random-weighted sampling* draws w_t ~ p(. | w_{<t}) and "might lead
to the model not choosing the most obvious word every time", at the risk of "becoming too
creative". Temperature tau, top-k and top-p (nucleus) reshape p before drawing (Holtzman et al.
2020): p_tau(w) ∝ exp(z_w / tau); top-k keeps the k most likely tokens, top-p the smallest set
with mass >= p.

The model is the char LM of the ``char_lm`` experiment (trained once, shared by run directory,
gated there: :func:`~attnlab.lab.kit.char_models.gated_char_lm`).
Every strategy continues the same prompts (windows of the validation text); the validation
text's own continuations are the human reference row. Metrics per strategy:

    own NLL      -1/n sum_t log2 p(w_t | w_{<t}) of the continuation under the model at tau = 1
                 (bits/char; low = what the model finds likely)
    distinct-n   distinct word n-grams / all word n-grams over all samples (Li et al. 2016)
    rep-4        share of word 4-grams in a sample that already occurred earlier in the same
                 sample, averaged (seq-rep-4, Welleck et al. 2020); degenerate loops score high
    real words   share of generated words (letters only) found in the training text
    unchanged    share of samples that stay the same when the run is repeated with another
                 seed (1.0 for greedy, which is deterministic; near 0 for sampling)

Shapes: P prompts, T prompt + continuation length (<= the model's context), V characters.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.generate import GenerationConfig, generate
from attnlab.lab.kit import char_models
from attnlab.lab.kit.char_models import count_baselines, split_text, train_char_lm
from attnlab.lab.kit.charts import save_chart
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Report, Table, Threshold
from attnlab.lab.kit.seeds import spread_text, start_seeds
from attnlab.lab.kit.verdict import Competence, outcome
from attnlab.viz.figure import new_figure

STRATEGIES: dict[str, dict[str, Any]] = {
    "greedy": dict(temperature=0.0),
    "sampling tau=1": dict(temperature=1.0),
    "sampling tau=0.7": dict(temperature=0.7),
    "sampling tau=1.3": dict(temperature=1.3),
    "top-k 10": dict(temperature=1.0, top_k=10),
    "top-p 0.9": dict(temperature=1.0, top_p=0.9),
}
WORD = re.compile(r"[A-Za-z']+")
NLL, REP, D2, TAU1 = "own NLL (bits/char)", "rep-4", "distinct-2", "sampling tau=1"
HUMAN = "validation text (human)"
SETUP_METRICS = (
    "Metrics: own NLL = -log2 p of the continuation under the model at tau = 1; distinct-n over "
    "all samples' word n-grams (Li et al. 2016); rep-4 = share of a sample's word 4-grams "
    "repeating an earlier one (Welleck et al. 2020); real words = share of generated words found "
    "in the training text; unchanged = share of samples identical when rerun with another "
    "sampling seed (s + 100)."
)
COST = (
    "Full run: the char_lm experiment's gated models (reloaded when char_lm ran first; else "
    "trained here, an estimated 36-45 minutes on 2 idle cores), then 6 strategies x 64 prompts x 2 "
    "decodings per seed's model: a few minutes. Command: attnlab experiment sampling --data "
    "../shared/data --out docs/experiments/sampling (after char_lm)."
)
THRESHOLDS = [
    Threshold(
        "greedy vs sampling at tau = 1",
        "greedy has the lower NLL, the higher rep-4, the lower distinct-2, and is unchanged "
        "on a rerun while sampling is not -- on every seed's model",
        "003 'Linear + Softmax - Prediction' (greedy takes the most probable token; "
        "random-weighted sampling 'introduces some variability'); no number is given, so each "
        "is a strict comparison; rep-4 after Welleck et al. 2020, distinct-n after Li et al. 2016",
    ),
    Threshold(
        "competence of the LM",
        "training bits/char below the bigram's validation bits/char, bracketed rate, step "
        f"doubling within {char_models.TOLERANCE} nats/char",
        "the lab's gate (docs/experiments/README.md), shared with char_lm",
    ),
]


def words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(text)]


def distinct_n(texts: list[str], n: int) -> float:
    """Distinct word n-grams over all n-grams of all texts (0 when there are none)."""
    grams = [tuple(ws[i : i + n]) for ws in map(words, texts) for i in range(len(ws) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition(text: str, n: int = 4) -> float:
    """seq-rep-n: the share of word n-grams of ``text`` that repeat an earlier one."""
    ws = words(text)
    grams = [tuple(ws[i : i + n]) for i in range(len(ws) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def real_word_rate(texts: list[str], vocabulary: set[str]) -> float:
    """Share of words in ``texts`` that occur in the training text (a spelling check)."""
    found = [w for t in texts for w in words(t)]
    return sum(w in vocabulary for w in found) / len(found) if found else 0.0


@torch.no_grad()
def own_nll(model: Any, tok: Any, prompts: list[str], continuations: list[list[int]]) -> float:
    """Mean -log2 p(continuation token | everything before) under the model at temperature 1.

    Continuations are token ids (a sampled <unk> would not survive a trip through text)."""
    total, count = 0.0, 0
    model.eval()
    for prompt, c in zip(prompts, continuations):
        p = tok.encode(prompt)
        if not c:
            continue
        ids = torch.tensor([p + c])  # (1, T)
        logp = model(ids[:, :-1]).logits.float().log_softmax(-1)[0]  # (T - 1, V)
        targets = ids[0, len(p) :]  # (n,)
        total -= float(logp[len(p) - 1 :].gather(1, targets[:, None]).sum())
        count += len(c)
    return total / max(count, 1) / math.log(2)


def decode(
    model: Any, tok: Any, prompts: list[str], n_new: int, seed: int, **strategy: Any
) -> list[list[int]]:
    """Continuations (without the prompt) of every prompt under one strategy, as token ids."""
    cfg = GenerationConfig(max_new_tokens=n_new, seed=seed, stop_token_ids=(), **strategy)
    return generate(model, prompts, cfg, tokenizer=tok).tokens


def pick_prompts(
    val_text: str, n: int, prompt_len: int, n_new: int, rng: np.random.Generator
) -> tuple[list[str], list[str]]:
    """``n`` validation windows, each cut into a prompt and the text that really follows it,
    starting at a line start where possible so prompts read naturally."""
    starts = [m.end() for m in re.finditer(r"\n(?=\S)", val_text[: -(prompt_len + n_new + 1)])]
    if len(starts) < n:
        starts = list(range(0, max(1, len(val_text) - prompt_len - n_new)))
    chosen = sorted(rng.choice(len(starts), size=min(n, len(starts)), replace=False))
    prompts = [val_text[starts[i] : starts[i] + prompt_len] for i in chosen]
    truth = [val_text[starts[i] + prompt_len : starts[i] + prompt_len + n_new] for i in chosen]
    return prompts, truth


def quality_diversity_chart(
    rows: list[dict[str, Any]], out_dir: Path, per_seed: dict[tuple[str, str], list[float]]
):
    """Own NLL (y) against distinct-2 (x), one labelled point per strategy and the human text
    (the mean over seeds, with min-max error bars from ``per_seed[(strategy, metric)]``)."""
    fig = new_figure(6.4, 4.4)
    ax = fig.subplots()
    for row in rows:
        human = row["strategy"].startswith("validation")
        x, y = row["distinct-2"], row["own NLL (bits/char)"]
        xs, ys = (
            per_seed[(row["strategy"], "distinct-2")],
            per_seed[(row["strategy"], "own NLL (bits/char)")],
        )
        ax.errorbar(
            x,
            y,
            xerr=[[x - min(xs)], [max(xs) - x]],
            yerr=[[y - min(ys)], [max(ys) - y]],
            fmt="*" if human else "o",
            markersize=9 if human else 6,
            color="tab:red" if human else "tab:blue",
            capsize=3,
        )
        ax.annotate(
            row["strategy"],
            (row["distinct-2"], row["own NLL (bits/char)"]),
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=8,
        )
    ax.set_xlabel("distinct-2 (diversity, higher = more varied)")
    ax.set_ylabel("NLL under the model (bits/char, lower = more likely)")
    ax.set_title("Decoding strategies: likelihood vs diversity")
    ax.grid(alpha=0.3)
    return save_chart(
        fig,
        out_dir,
        "quality_diversity.png",
        "Each strategy's samples: how "
        "likely the model finds them (y) against how varied they are (x), mean over the seeds' "
        "models with min-max error bars; the star is the real validation text after the same "
        "prompts.",
    )


def _strategy_rows(
    model: Any, tok: Any, prompts: list[str], truth: list[str], n_new: int, seed: int,
    vocabulary: set[str],
) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:  # fmt: skip
    """One seed's model: every strategy's metrics (sampling seeds ``seed`` and ``seed + 100``,
    the rerun) and the human row; and the first decoding's texts per strategy."""
    rows, outputs = [], {}
    for name, strategy in STRATEGIES.items():
        first = decode(model, tok, prompts, n_new, seed, **strategy)
        again = decode(model, tok, prompts, n_new, seed + 100, **strategy)
        outputs[name] = [tok.decode(ids) for ids in first]
        same = float(np.mean([a == b for a, b in zip(first, again)]))
        rows.append(_metrics(name, model, tok, prompts, first, vocabulary, same))
    truth_ids = [tok.encode(t) for t in truth]
    rows.append(_metrics(HUMAN, model, tok, prompts, truth_ids, vocabulary, unchanged=1.0))
    return rows, outputs


def measure(quick: bool, seed: int, data: Path | None, out_dir: Path) -> dict[str, Any]:
    """The char_lm experiment's gated models (reloaded by run directory, trained if absent), and
    every strategy's metrics on every seed's model. ``out_dir`` holds a quick run's work."""
    seeds = start_seeds(seed, quick)
    runs = char_models.gated_char_lm(quick, seeds, data, out_dir)
    lr = runs.lr[char_models.ARM].chosen
    result, path, origin = train_char_lm(quick, seeds[0], data, out_dir, lr)
    train_text, val_text = split_text(path)
    vocabulary = set(words(train_text))
    n_prompts, prompt_len = (8, 12) if quick else (64, 24)
    n_new = result.model.max_len - prompt_len
    rng = np.random.default_rng(seeds[0])
    prompts, truth = pick_prompts(val_text, n_prompts, prompt_len, n_new, rng)
    per_seed_rows: list[list[dict[str, Any]]] = []
    outputs: dict[str, list[str]] = {}
    for s in seeds:  # seed s: model s, sampling seeds s and s + 100 (the rerun)
        trained = train_char_lm(quick, s, data, out_dir, lr)[0]
        model, tok = trained.model, trained.tokenizer
        rows, texts = _strategy_rows(model, tok, prompts, truth, n_new, s, vocabulary)
        per_seed_rows.append(rows)
        outputs = outputs or texts
    outputs[HUMAN] = truth
    return {
        "seeds": seeds,
        "runs": runs,
        "bigram": count_baselines(train_text, val_text)["bigram"],
        "origin": origin,
        "prompts": prompts,
        "prompt_len": prompt_len,
        "n_new": n_new,
        "per_seed_rows": per_seed_rows,
        "outputs": outputs,
    }


def _per_seed_values(m: dict[str, Any]) -> dict[tuple[str, str], list[float]]:
    first = m["per_seed_rows"][0]
    keys = [k for k in first[0] if k != "strategy"]
    return {(r["strategy"], k): [rows[i][k] for rows in m["per_seed_rows"]]
            for i, r in enumerate(first) for k in keys}  # fmt: skip


def _checks(m: dict[str, Any]) -> dict[str, bool]:
    """The note's four predictions, each required on every seed's model."""

    def every_seed(test) -> bool:
        return all(test({r["strategy"]: r for r in rows}) for rows in m["per_seed_rows"])

    return {
        "greedy is the most likely": every_seed(lambda b: b["greedy"][NLL] < b[TAU1][NLL]),
        "greedy repeats more": every_seed(lambda b: b["greedy"][REP] > b[TAU1][REP]),
        "greedy is less diverse": every_seed(lambda b: b["greedy"][D2] < b[TAU1][D2]),
        "greedy is deterministic": every_seed(
            lambda b: b["greedy"]["unchanged"] == 1.0 and b[TAU1]["unchanged"] < 1.0
        ),
    }


def _competence(m: dict[str, Any]) -> list[Competence]:
    return [char_models.competence(m["runs"], m["bigram"])]


def _reason(m: dict[str, Any], checks: dict[str, bool], vals: dict) -> str:
    return (
        f"on every seed's model ({len(m['seeds'])}): "
        + "; ".join(f"{k}: {'yes' if v else 'no'}" for k, v in checks.items())
        + ". Mean (min-max) over seeds: "
        + "; ".join(
            f"{n}: NLL {spread_text(vals[(n, NLL)])} bits/char, rep-4 "
            f"{spread_text(vals[(n, REP)], 2)}, distinct-2 {spread_text(vals[(n, D2)], 2)}"
            for n in ("greedy", TAU1, HUMAN)
        )
        + "."
    )


def write_up(m: dict[str, Any], out_dir: Path, quick: bool) -> Report:
    """The report of :func:`measure`'s numbers: tables, the figure, the gated verdict."""
    vals = _per_seed_values(m)
    names = [r["strategy"] for r in m["per_seed_rows"][0]]
    keys = [k for k in m["per_seed_rows"][0][0] if k != "strategy"]
    rows = [{"strategy": n, **{k: float(np.mean(vals[(n, k)])) for k in keys}} for n in names]
    table_rows = [{"strategy": n, **{k: spread_text(vals[(n, k)]) for k in keys}} for n in names]
    shown = [
        {"prompt": _cell(m["prompts"][i]), "strategy": name, "continuation": _cell(texts[i])}
        for i in range(min(2, len(m["prompts"])))
        for name, texts in m["outputs"].items()
    ]
    checks = _checks(m)
    runs, seeds = m["runs"], m["seeds"]
    per_model = runs.per[char_models.ARM]
    return Report(
        name="sampling",
        title="Greedy vs random-weighted sampling from one character-level LM",
        claim="The technique of using the word with the maximum probability is called greedy "
        "sampling [...] random-weighted sampling [...] introduces some variability [...] It is "
        "possible that this technique leads to the model becoming too creative.",
        source="003, 'Linear + Softmax - Prediction'",
        setup=[
            f"Models: the char_lm experiment's Transformer LMs on {m['origin']}, one per seed "
            f"{seeds} (trained once, reused by run directory; gated there: "
            f"{runs.lr[char_models.ARM].describe()}, step doubling on seed {seeds[0]}): "
            f"{per_model[0]['steps']} steps, validation loss "
            f"{spread_text([r['val'] for r in per_model])} nats/char.",
            f"{len(m['prompts'])} prompts of {m['prompt_len']} characters cut from the "
            f"validation text at line starts; each strategy continues every prompt by "
            f"{m['n_new']} characters (the model's context holds prompt and continuation, so "
            "NLL is exact).",
            "Strategies: " + "; ".join(f"{k}: {v}" for k, v in STRATEGIES.items()) + ".",
            SETUP_METRICS,
            *([] if quick else [COST]),
        ],
        thresholds=THRESHOLDS,
        tables=[
            Table(
                "decoding strategies (same prompts; mean (min-max) over the seeds' models)",
                table_rows,
            ),
            Table("samples (first prompts)", shown),
        ],
        figures=[quality_diversity_chart(rows, out_dir, vals)],
        **outcome(
            list(checks.values()),
            _reason(m, checks, vals),
            _competence(m),
            seeds,
            quick,
            arms=[char_models.ARM],
        ),  # fmt: skip
        per_seed={f"{n}, {k}": vals[(n, k)] for n in names for k in (NLL, REP, D2)},
        metrics={"rows": rows, "checks": checks},
        findings=[f"{k}: {'yes' if v else 'no'}." for k, v in checks.items()]
        + [
            "Real text is far less likely under the model than greedy output: human writing is "
            "not the argmax path (Holtzman et al. 2020), which is why pure likelihood-seeking "
            "decoding reads unnaturally.",
        ],
    )


@experiment(
    "sampling",
    notes="003 'Linear + Softmax - Prediction' (greedy vs random-weighted sampling)",
)
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Greedy sampling always takes the most probable token, so its output is the most likely
    but repetitive and identical run to run; random-weighted sampling varies and can wander
    ('too creative'); temperature, top-k and top-p trade between the two."""
    return write_up(measure(quick, seed, data, out_dir), out_dir, quick)


def _metrics(
    name: str,
    model: Any,
    tok: Any,
    prompts: list[str],
    ids: list[list[int]],
    vocabulary: set[str],
    unchanged: float,
) -> dict[str, Any]:
    texts = [tok.decode(x) for x in ids]
    return {
        "strategy": name,
        "own NLL (bits/char)": own_nll(model, tok, prompts, ids),
        "distinct-1": distinct_n(texts, 1),
        "distinct-2": distinct_n(texts, 2),
        "rep-4": float(np.mean([repetition(t) for t in texts])),
        "real words": real_word_rate(texts, vocabulary),
        "unchanged": unchanged,
    }


def _cell(text: str) -> str:
    return text.replace("\n", " \u23ce ")
