"""Experiment ``long_range``: a fixed-size vector forgets long inputs; attention does not (004).

004 eq. 1-3: a plain LSTM encoder-decoder squeezes x_{1:T} into one vector v = transform(h^e_T)
and decodes from it alone, so the longer the input the more it must forget. With attention
(004 eq. 4-8, Bahdanau) each decoder step reads a fresh mixture v_l = sum_t alpha_lt f_t of all
encoder states, and the Transformer (000) attends from every target position to every source
position. Four arms (two plain LSTMs, LSTM + Bahdanau, Transformer), the same training budget
(steps x batch), on reversal "abcde" -> "edcba", one run per length T: accuracy vs T.

Every arm at every length is gated alike (:func:`arm_job`): a bracketed learning-rate sweep
(:mod:`attnlab.lab.kit.gating`) and a step doubling. The plain LSTMs, whose failure is the claim,
get the same sweep and doubling as the attention arms.

The full run takes hours on 2 cores, so it is made in pieces: each finished training run is kept
beside the report (``OUT/.attnlab-jobs``, :class:`attnlab.lab.kit.resume.Finished`, stamped with
the code hash), and a later piece reloads it instead of training it again; only the runs in
progress when a piece is interrupted are lost.

Exact match is computed by teacher forcing (:func:`attnlab.lab.kit.seq2seq.teacher_forced_hits`):
the argmax at every target position equals the reference, which holds exactly when greedy
decoding reproduces the reference (induction over positions), at the cost of one forward pass.
The loss is the kit's masked seq2seq loss (004 eq. 1); every reversal at one length has the same
source and target length, so trimming a batch to its longest pair leaves it as it is.

Shapes: N examples, B batch, S source length, T target length, D d_model, H heads.
"""

from __future__ import annotations

import math
import string
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer, ReverseTask
from attnlab.lab.kit.charts import dodged, integer_xticks, save_chart, seeds_chart
from attnlab.lab.kit.fit import FitConfig, fit
from attnlab.lab.kit.gating import bracketed_sweep
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import FigureRef, Report, Table, Threshold
from attnlab.lab.kit.resume import JOBS_DIR, Finished
from attnlab.lab.kit.seeds import resolved, run_jobs, seed_list, spread, spread_text
from attnlab.lab.kit.seq2seq import masked_seq2seq_loss, pair_batch, teacher_forced_hits
from attnlab.lab.kit.verdict import (
    Competence,
    Doubling,
    LearningRate,
    gated_fields,
    verdict_of_directions,
)
from attnlab.models import build_model
from attnlab.viz import attention_maps, plot_alignment, plot_attention

MODELS = {
    "lstm": "plain LSTM, source reversed",
    "lstm_forward": "plain LSTM, source as written",
    "bahdanau": "LSTM + Bahdanau attention",
    "transformer": "Transformer encoder-decoder",
}
ALPHABET = string.ascii_lowercase[:16]


def model_config(name: str, vocab_size: int, max_len: int, quick: bool) -> ModelConfig:
    """The three families at comparable sizes (~0.1-0.2 M parameters at full size)."""
    d_rnn, d_tf = (64, 32) if quick else (128, 64)
    if name == "transformer":
        return ModelConfig(
            kind="encoder_decoder",
            vocab_size=vocab_size,
            d_model=d_tf,
            n_heads=4,
            n_layers=2,
            d_ff=4 * d_tf,
            max_len=max_len,
            positional="learned",
        )
    return ModelConfig(
        kind="lstm_seq2seq",
        vocab_size=vocab_size,
        d_model=d_rnn,
        n_layers=1,
        rnn_attention="additive" if name == "bahdanau" else "none",
        reverse_source=name == "lstm",
    )


LENGTHS = (8, 16, 32)  # full size; 48 (in earlier reports) no longer fits the gated budget
QUICK_LENGTHS = (4, 8)
STEPS = 1000  # per run at full size (batch 64); the doubling trains 2000
GRIDS = {"lstm_seq2seq": (1e-3, 3e-3, 1e-2), "encoder_decoder": (3e-4, 1e-3, 3e-3)}
MAX_EXTRA = 2  # a rate chosen at a grid edge extends the grid by up to this many rates (x3 each)
TOLERANCE = 0.01  # step doubling: per-token accuracy may change by at most this much
ZOOM = 8  # rows and columns of the zoomed attention panel (every one labelled)
MARGIN = 0.2  # the lab's margin for "falls" and "stays above" (the note gives no number)
ATTENTION = ("bahdanau", "transformer")
PLAIN = ("lstm", "lstm_forward")
COST = (
    "Full run: 4 arms x 3 lengths, each a 3-rate sweep on the first seed (+ up to 2 rates when "
    "a choice sits at a grid edge), 2 more seeds at the chosen rate and a 2x-steps doubling on "
    "the first seed, 1000 steps of 64 per run (~7 run-equivalents per arm and length). "
    "Estimated 2-4 hours on 2 idle cores (Bahdanau's decoder loops over target steps), so it is "
    "made in pieces: each finished training run is kept in OUT/.attnlab-jobs and reloaded by "
    "the next piece. Command, repeated until it writes the report: timeout -s INT -k 5m 85m "
    "attnlab experiment long_range --seed 0"
)
SETUP = [
    "Sutskever's reversal trick puts the first target symbols next to the decoder; on reversal "
    "the target starts with x_T, so the trick there means reading the source as written: both "
    "directions are reported, each its own arm.",
    "Every arm at every length is gated the same way: a learning-rate sweep on the first seed "
    "chosen by validation loss (fresh strings of the training length), extended past an edge "
    f"choice by up to {MAX_EXTRA} rates (x3 each); the other seeds train at the chosen rate; the "
    f"first seed is trained again at twice the steps (warm-up and cosine stretched), and its "
    f"test per-token accuracy may move by at most {TOLERANCE:g}.",
    "The plain LSTMs are the arms whose failure is the claim: they get the same sweep and "
    "doubling and no accuracy floor (their competence is the bracketed rate and the converged "
    "doubling); the attention arms must also reach 0.99 per-token accuracy on every seed.",
    "Scores under teacher forcing: per-token accuracy (the argmax at each target position) and "
    "exact match (every position right, which equals greedy-decoding exact match).",
    "One torch thread per run, two arms at a time (one per core); runs are seeded and "
    "independent, so the results do not depend on it.",
]
CLAIM = (
    "Although LSTMs suffers less from the gradient vanishing/explosion problems, it can "
    "still be challenging for LSTMs to learn long-term dependencies. [...] The key idea of "
    "using v_l as a weighted average of individual features f_t is to allow the decoder LSTM "
    "to directly access the representation for each input x_t, therefore the issue of "
    "lacking long-term dependencies between y_l and x_t is addressed."
)
THRESHOLDS = [
    Threshold(
        "fall of the better plain LSTM's per-token accuracy from the shortest to the longest T",
        f"> {MARGIN:g}, seed ranges apart",
        "004 sec. 1: 'it can still be challenging for LSTMs to learn long-term dependencies' "
        f"(the note gives no number; {MARGIN:g} is the lab's margin)",
    ),
    Threshold(
        "attention arms at the longest T: per-token accuracy above the better plain LSTM's",
        f"by > {MARGIN:g}, seed ranges apart",
        "004 sec. 1.1: attention lets 'the decoder LSTM directly access the representation for "
        "each input x_t' (no number in the note; the same margin)",
    ),
    Threshold(
        "attention arms' competence: per-token accuracy on their training length",
        ">= 0.99 on every seed",
        "the lab's competence bar (docs/experiments/README.md)",
    ),
]


def fit_config(name: str, quick: bool, lr: float, scale: int = 1) -> FitConfig:
    """Equal budgets (steps x batch) for every arm; ``scale`` = 2 is the step doubling."""
    return FitConfig(
        steps=(25 if quick else STEPS) * scale,
        batch_size=32 if quick else 64,
        lr=lr,
        warmup_steps=(5 if quick else 100) * scale,
    )


def sizes(quick: bool) -> tuple[int, int]:
    """Training and test (and validation) examples per reversal length."""
    return (300, 60) if quick else (20000, 500)


def task_data(length: int, quick: bool, seed: int) -> tuple[CharTokenizer, list, list, list]:
    """(tokenizer, train, validation, test pairs) of reversal at ``length``, fresh per seed."""
    n_train, n_test = sizes(quick)
    task = ReverseTask(min_len=length, max_len=length, alphabet=ALPHABET)
    return (
        CharTokenizer(ALPHABET),
        task.make_pairs(n_train, seed=seed),
        task.make_pairs(n_test, seed=seed + 1000),
        task.make_pairs(n_test, seed=seed + 1),
    )


def one_run(
    name: str, length: int, quick: bool, seed: int, lr: float, scale: int = 1, maps: bool = False
) -> dict:
    """Train one arm on one seed; its validation loss, test hits (per token, per position,
    whole targets), training seconds and, with ``maps``, its attention on :func:`example`."""
    tok, train, val, test = task_data(length, quick, seed)
    torch.manual_seed(seed)
    model = build_model(model_config(name, tok.vocab_size, length + 1, quick))
    cfg = fit_config(name, quick, lr, scale)
    result = fit(model, tuple(pair_batch(train, tok)), masked_seq2seq_loss, cfg, seed=seed)
    with torch.no_grad():
        model.eval()
        val_loss = float(masked_seq2seq_loss(model, pair_batch(val, tok)))
    tokens, exact = teacher_forced_hits(model, pair_batch(test, tok))
    hits = tokens[:, :length].float()  # (N, T) without <eos>
    return {
        "val_loss": val_loss if not result.diverged else math.inf,
        "token": float(hits.mean()),
        "exact": float(exact.float().mean()),
        "per_position": hits.mean(0).tolist(),
        "seconds": result.seconds,
        "maps": attention_of(name, model, length, seed) if maps else None,
    }


def kept_run(kept: Finished, name: str, length: int, quick: bool, seed: int, lr: float,
             scale: int = 1, maps: bool = False) -> dict:  # fmt: skip
    """:func:`one_run`, kept in ``kept`` once it finishes and reloaded from there by a later
    piece of the run (the same code only: :class:`~attnlab.lab.kit.resume.Finished`)."""
    key = f"{name}-T{length}-seed{seed}-lr{lr:.6g}-x{scale}" + ("-quick" if quick else "")
    if (result := kept.get(key)) is not None:
        return result
    return kept.put(key, one_run(name, length, quick, seed, lr, scale, maps))


def arm_job(job: tuple[str, int, bool, int, bool, str]) -> dict:
    """One arm at one length, gated: the sweep on the first seed, the other seeds at the chosen
    rate, the doubling on the first seed; at the longest length the attention maps of the first
    seed's model on one example. Each run is kept in the job's folder as it finishes."""
    name, length, quick, seed, longest, kept_dir = job
    kept = Finished(Path(kept_dir), __name__)
    seeds = seed_list(seed, quick)
    family = model_config(name, 3, 8, quick).kind
    maps = longest and name in ATTENTION
    sweep = bracketed_sweep(
        lambda lr: kept_run(kept, name, length, quick, seeds[0], lr, maps=maps),
        GRIDS[family],
        lambda r: r["val_loss"],
        chosen_on=f"validation loss at T = {length}, seed {seeds[0]}",
        max_extra=MAX_EXTRA,
    )
    first = sweep.best
    runs = [first] + [kept_run(kept, name, length, quick, s, sweep.chosen) for s in seeds[1:]]
    doubled = kept_run(kept, name, length, quick, seeds[0], sweep.chosen, scale=2)
    rest = sum(r["seconds"] for r in sweep.runs.values()) - first["seconds"]
    return {
        "lr": sweep.chosen,
        "sweep": dict(sorted(sweep.scores.items())),
        "chosen_on": sweep.chosen_on,
        "token": [r["token"] for r in runs],
        "exact": [r["exact"] for r in runs],
        "per_position": [r["per_position"] for r in runs],
        "doubled_token": doubled["token"],
        "seconds": rest + sum(r["seconds"] for r in runs) + doubled["seconds"],
        "maps": first["maps"],
    }


def example(length: int, seed: int) -> tuple[str, str]:
    """The reversal example the attention figures show."""
    task = ReverseTask(min_len=length, max_len=length, alphabet=ALPHABET)
    return task.make_pairs(1, seed=seed + 2)[0]


def attention_of(name: str, model: nn.Module, length: int, seed: int) -> list:
    """Bahdanau's alignment (T + 1, S) or the Transformer's last-layer cross-attention
    (H, T + 1, S) on :func:`example`, as nested lists."""
    tok = CharTokenizer(ALPHABET)
    source, target = example(length, seed)
    maps = attention_maps(model, tok.encode(source), target=[tok.bos_id, *tok.encode(target)])
    cross = maps.cross_attn  # (L, H, T + 1, S)
    assert cross is not None, "a seq2seq model returns cross-attention weights"
    weights = cross[0, 0] if name == "bahdanau" else cross[-1]
    return weights.tolist()


def job_cost(job: tuple[str, int, bool, int, bool, str]) -> float:
    """Relative run time: Bahdanau's decoder loops over target steps; long inputs cost more."""
    name, length = job[0], job[1]
    return (3 if name == "bahdanau" else 1) * length


def measure(quick: bool, seed: int, data: Path | None, out_dir: Path) -> dict:
    """Every arm at every length, gated (:func:`arm_job`): ``runs[name][length]`` holds the
    chosen rate, its sweep, per-seed accuracies, the doubling and (longest T) attention maps.
    Each training run is kept in ``out_dir/.attnlab-jobs`` as it finishes (a later piece of an
    interrupted run reloads it). ``data`` is unused: the task is generated."""
    torch.set_num_threads(1)
    lengths = QUICK_LENGTHS if quick else LENGTHS
    kept = str(out_dir / JOBS_DIR)
    jobs = {(n, t): (n, t, quick, seed, t == lengths[-1], kept) for n in MODELS for t in lengths}
    results = run_jobs(arm_job, list(jobs.values()), 1 if quick else 2, cost=job_cost)
    runs = {n: {t: results[jobs[(n, t)]] for t in lengths} for n in MODELS}
    steps = fit_config("lstm", quick, 1.0).steps
    return {"lengths": list(lengths), "seeds": seed_list(seed, quick), "steps": steps, "runs": runs}


def arm_name(name: str, length: int) -> str:
    return f"{MODELS[name]}, reversal T = {length}"


def competence(measured: dict) -> list[Competence]:
    """Every arm at every length: its sweep and doubling; the attention arms also >= 0.99."""
    out = []
    seeds = measured["seeds"]
    for name, by_length in measured["runs"].items():
        for length, r in by_length.items():
            plain = name in PLAIN
            out.append(
                Competence(
                    arm_name(name, length),
                    "test per-token accuracy on its training length"
                    + (" (no floor: its failure is the claim)" if plain else ""),
                    0.0 if plain else 0.99,
                    r["token"],
                    lr=LearningRate(r["lr"], list(r["sweep"]), chosen_on=r["chosen_on"]),
                    doubling=Doubling(
                        measured["steps"],
                        [r["token"][0]],
                        [r["doubled_token"]],
                        TOLERANCE,
                        seeds=seeds[:1],
                        metric="test per-token accuracy",
                    ),
                )
            )
    return out


def verdict(measured: dict) -> tuple[str, str]:
    """The claim's checks on per-seed token accuracy: the better plain LSTM falls from the
    shortest to the longest T, and each attention arm stays above it at the longest T, each by
    more than MARGIN with seed ranges apart. Each difference is resolved as the claim says
    ("above"), resolved otherwise ("below": the other way, or by less than the margin), or
    inside the seed spread; held: all above; mixed: some; did not hold: none, some below; no
    effect resolved: all inside."""
    lengths, runs = measured["lengths"], measured["runs"]
    first, last = lengths[0], lengths[-1]
    tok = {n: {t: runs[n][t]["token"] for t in lengths} for n in MODELS}
    best = max(PLAIN, key=lambda n: spread(tok[n][last])["mean"])

    def state(high: list[float], low: list[float]) -> tuple[str, float]:
        gap = spread(high)["mean"] - spread(low)["mean"]
        if not resolved(high, low):
            return "inside", gap
        return ("above" if gap > MARGIN else "below"), gap

    fall, drop = state(tok[best][first], tok[best][last])
    kept = {n: state(tok[n][last], tok[best][last]) for n in ATTENTION}
    word = verdict_of_directions([fall] + [k for k, _ in kept.values()])
    said = {"above": f"> {MARGIN:g}, seed ranges apart", "inside": "inside the seed spread",
            "below": f"not > {MARGIN:g} the claimed way, seed ranges apart"}  # fmt: skip
    at = {n: spread_text(tok[n][last]) for n in MODELS}
    reason = (
        f"per-token accuracy at T = {last} (mean (min-max) over {len(measured['seeds'])} "
        f"seed(s)): plain LSTM {at['lstm']} (reversed) / {at['lstm_forward']} (as written); "
        f"the better plain arm falls by {drop:.2f} from T = {first} ({said[fall]}); "
        + "; ".join(
            f"{MODELS[n]} {at[n]}: {gap:.2f} above the better plain arm ({said[k]})"
            for n, (k, gap) in kept.items()
        )
        + "."
    )
    return word, reason


def table_rows(measured: dict, key: str) -> list[dict]:
    runs = measured["runs"]
    return [
        {"length": t, **{MODELS[n]: spread_text(runs[n][t][key]) for n in MODELS}}
        for t in measured["lengths"]
    ]


def gate_rows(measured: dict) -> list[dict]:
    """Per arm and length: the sweep (validation loss per rate), the chosen rate, the doubling."""
    return [
        {
            "arm": MODELS[n],
            "length": t,
            "validation loss per lr": ", ".join(f"{lr:g}: {v:.3g}" for lr, v in r["sweep"].items()),
            "chosen lr": r["lr"],
            "accuracy, first seed -> 2x steps": f"{r['token'][0]:.4g} -> {r['doubled_token']:.4g}",
        }
        for n, by_length in measured["runs"].items()
        for t, r in by_length.items()
    ]


def charts(measured: dict, out_dir: Path, steps: str) -> list[FigureRef]:
    """Token accuracy and exact match against T, and accuracy per output position at max T,
    mean over seeds with a min-max band; series are offset sideways (overlaps stay visible)."""
    lengths, runs, n = measured["lengths"], measured["runs"], len(MODELS)
    figures = []
    for key, file, what in (
        ("token", "accuracy_vs_length.png", "per-token accuracy"),
        ("exact", "exact_vs_length.png", "exact match"),
    ):
        curves = {
            MODELS[name]: (
                dodged(lengths, k, n),
                [list(c) for c in zip(*(runs[name][t][key] for t in lengths))],
            )
            for k, name in enumerate(MODELS)
        }
        fig = seeds_chart(
            curves,
            xlabel="sequence length T (series offset sideways)",
            ylabel=f"{what} (test)",
            title=f"Reversal: {what} ({len(measured['seeds'])} seed(s), min-max band)",
        )
        figures.append(
            save_chart(
                integer_xticks(fig, lengths),
                out_dir,
                file,
                f"Reversal {what} against the input length; every arm trained for {steps} at "
                "its own swept rate. Mean over seeds, min-max band; the series are offset "
                "sideways so that overlapping ones (e.g. two arms at accuracy 1) stay visible.",
            )
        )
    last = lengths[-1]
    positions = list(range(1, last + 1))
    fig = seeds_chart(
        {
            MODELS[name]: (dodged(positions, k, n), runs[name][last]["per_position"])
            for k, name in enumerate(MODELS)
        },
        xlabel="output position l (y_l = x_{T+1-l}; series offset sideways)",
        ylabel="accuracy (test)",
        title=f"Reversal, T = {last}: accuracy per output position",
    )
    figures.append(
        save_chart(
            integer_xticks(fig, positions),
            out_dir,
            "accuracy_per_position.png",
            f"Accuracy of each output position at T = {last} (mean over seeds, min-max band; "
            "series offset sideways): output l copies input T + 1 - l, so a "
            "fixed-vector model that read the source as written recalls its last inputs (first "
            "outputs) best.",
        )
    )
    return figures + alignment_figures(measured, out_dir)


def alignment_figures(measured: dict, out_dir: Path) -> list[FigureRef]:
    """Bahdanau alignment and the Transformer's last-layer cross-attention on one example."""
    last = measured["lengths"][-1]
    source, target = example(last, measured["seeds"][0])
    src_labels, out_labels = list(source), [*target, "<eos>"]
    runs = measured["runs"]
    fig = plot_alignment(
        np.asarray(runs["bahdanau"][last]["maps"]),  # (T + 1, S)
        src_labels,
        out_labels,
        title=f"LSTM + Bahdanau, reversal of length {last}",
    )
    figures = [
        save_chart(
            fig,
            out_dir,
            "alignment_bahdanau.png",
            "Bahdanau alignment alpha_lt on one reversal of the longest length (first seed): "
            "the anti-diagonal is the reversal.",
        )
    ]
    cross = np.asarray(runs["transformer"][last]["maps"])  # (H, T + 1, S)
    n_layers = model_config("transformer", 3, 8, False).n_layers  # the same at either size
    fig = plot_attention(
        cross,
        out_labels,
        src_labels,
        title=f"Transformer cross-attention, layer {n_layers} of {n_layers} (last), length {last}",
        first_layer=n_layers,
    )
    figures.append(
        save_chart(
            fig,
            out_dir,
            "cross_attention_transformer.png",
            "Transformer cross-attention of the last decoder layer, one panel per head, on "
            "the same example (first seed).",
        )
    )
    k = min(ZOOM, last)  # output l reads source T + 1 - l: the first k rows, the last k columns
    fig = plot_attention(
        cross[:, :k, -k:],
        out_labels[:k],
        src_labels[-k:],
        title=f"Transformer cross-attention, layer {n_layers} (last): first {k} outputs x "
        f"last {k} inputs",
        first_layer=n_layers,
    )
    figures.append(
        save_chart(
            fig,
            out_dir,
            "cross_attention_transformer_zoom.png",
            f"Zoom of the figure above, every row and column labelled: the first {k} outputs "
            f"(rows) against the last {k} source symbols (columns), where a reversal reads.",
        )
    )
    return figures


def findings(measured: dict) -> list[str]:
    lengths, runs = measured["lengths"], measured["runs"]
    last = lengths[-1]
    mean = {n: [spread(runs[n][t]["token"])["mean"] for t in lengths] for n in MODELS}
    edge = [
        arm_name(n, t)
        for n in MODELS
        for t in lengths
        if not LearningRate(runs[n][t]["lr"], list(runs[n][t]["sweep"])).bracketed
    ]
    pos = {n: np.asarray(runs[n][last]["per_position"]) for n in MODELS}
    return [
        "The plain LSTM's per-token accuracy by length: "
        + ", ".join(f"T={t}: {a:.2f}" for t, a in zip(lengths, mean["lstm"]))
        + " (source reversed); "
        + ", ".join(f"{a:.2f}" for a in mean["lstm_forward"])
        + " (as written).",
        "Learning rates chosen at a grid edge after the extensions: "
        + (", ".join(edge) if edge else "none")
        + ".",
        f"Accuracy per output position at T = {last} (first 8 outputs / last 8): "
        + "; ".join(
            f"{MODELS[n]} {pos[n][:, :8].mean():.2f} / {pos[n][:, -8:].mean():.2f}" for n in MODELS
        )
        + ". The first outputs copy the last inputs, which a fixed vector read in order "
        "remembers best.",
    ]


def write_up(measured: dict, out_dir: Path, quick: bool) -> Report:
    """Tables, figures and the gated verdict from :func:`measure`'s numbers (no training)."""
    lengths, seeds, runs = measured["lengths"], measured["seeds"], measured["runs"]
    budget = fit_config("lstm", quick, 1.0)
    steps = f"{budget.steps} steps of {budget.batch_size}"
    m_rnn, m_tf = model_config("lstm", 3, 8, quick), model_config("transformer", 3, 8, quick)
    n_train, n_test = sizes(quick)
    comp = competence(measured)
    word, reason = verdict(measured)
    return Report(
        name="long_range",
        title="Long-range dependencies: fixed-vector LSTM vs attention as inputs grow",
        claim=CLAIM,
        source="004, section 1 and 1.1 (eq. 1-8); 000 'Transformer Encoder-Decoder'",
        setup=[
            f"Reversal over a {len(ALPHABET)}-letter alphabet, fixed length T in {lengths}; "
            f"{n_train} training, {n_test} validation and {n_test} test strings per length "
            "(fresh per seed).",
            f"Arms: plain LSTM (1 layer, width {m_rnn.d_model}; v = transform(h_T) starts the "
            "decoder) reading the source reversed or as written, the same with Bahdanau "
            f"additive attention (004 eq. 4-8), and a 2+2-layer pre-norm Transformer (d_model "
            f"{m_tf.d_model}, 4 heads, learned positions).",
            f"Equal budgets: {steps} (AdamW, warm-up {budget.warmup_steps} + cosine, clip 1); "
            "learning-rate grids "
            + "; ".join(f"{k}: {', '.join(f'{g:g}' for g in v)}" for k, v in GRIDS.items())
            + ".",
            *SETUP,
        ],
        thresholds=THRESHOLDS,
        tables=[
            Table("reversal: per-token accuracy by length", table_rows(measured, "token")),
            Table("reversal: exact match by length", table_rows(measured, "exact")),
            Table("gate: learning-rate sweep (first seed) and step doubling", gate_rows(measured)),
            Table(
                "training time (s, summed over every run of the arm)",
                [{MODELS[n]: sum(r["seconds"] for r in runs[n].values()) for n in MODELS}],
            ),
        ],
        figures=charts(measured, out_dir, steps),
        **gated_fields(word, reason, comp, seeds, quick, arms=[c.arm for c in comp]),
        per_seed={
            "reversal_token_accuracy": {
                MODELS[n]: [runs[n][t]["token"] for t in lengths] for n in MODELS
            },
            "reversal_exact_match": {
                MODELS[n]: [runs[n][t]["exact"] for t in lengths] for n in MODELS
            },
        },
        metrics={
            "lengths": list(lengths),
            "token_accuracy": {
                n: [spread(runs[n][t]["token"])["mean"] for t in lengths] for n in MODELS
            },
            "exact_match": {
                n: [spread(runs[n][t]["exact"])["mean"] for t in lengths] for n in MODELS
            },
            "lr": {n: [runs[n][t]["lr"] for t in lengths] for n in MODELS},
        },
        findings=findings(measured),
        quick=quick,
        seed=seeds[0],
    )


@experiment(
    "long_range",
    notes="004 eq. 1-8 (seq2seq, attention); 000 'Transformer Encoder-Decoder'",
)
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """A plain LSTM encoder-decoder must squeeze the whole input into one vector, so its
    accuracy falls as inputs grow; with attention (Bahdanau, Transformer) each output reads the
    source directly and long inputs stay solvable."""
    return write_up(measure(quick, seed, data, out_dir), out_dir, quick)
