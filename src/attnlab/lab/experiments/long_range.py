"""Experiment ``long_range``: a fixed-size vector forgets long inputs; attention does not (004).

004 eq. 1-3: a plain LSTM encoder-decoder squeezes x_{1:T} into one vector v = transform(h^e_T)
and decodes from it alone, so the longer the input the more it must forget. With attention
(004 eq. 4-8, Bahdanau) each decoder step reads a fresh mixture v_l = sum_t alpha_lt f_t of all
encoder states, and the Transformer (000) attends from every target position to every source
position. Three models, the same training budget (steps x batch), on two tasks:

    reversal   "abcde" -> "edcba", one run per length T in {8, 16, 32, 48}: exact match vs T
    dates      "TUESDAY, MARCH 3, 1998" -> "1998-03-03", 16 formats: accuracy by source length

Exact match is computed by teacher forcing: the argmax at every target position equals the
reference, which holds exactly when greedy decoding reproduces the reference (induction over
positions), at the cost of one forward pass.

Sutskever's trick for the plain LSTM (feed x_{T:1}) puts the first target words next to the
decoder. On dates (like translation) that means reversing the source; on the reversal task the
target already starts with x_T, so the same trick means reading x_{1:T} as written. Both
directions are reported for reversal.

Shapes: N examples, B batch, S source length, T target length, D d_model.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer, DateTask, ReverseTask, collate_pairs, encode_pairs
from attnlab.data.batching import Seq2SeqBatch
from attnlab.lab.kit.charts import save_chart, seeds_chart
from attnlab.lab.kit.fit import FitConfig, fit
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import (
    Competence,
    FigureRef,
    Report,
    Table,
    gated_fields,
    spread,
    spread_text,
)
from attnlab.lab.kit.seeds import run_jobs, seed_list
from attnlab.models import build_model
from attnlab.train.objectives import correct_predictions
from attnlab.viz import attention_maps, plot_alignment, plot_attention

MODELS = {
    "lstm": "plain LSTM, source reversed",
    "lstm_forward": "plain LSTM, source as written",
    "bahdanau": "LSTM + Bahdanau attention",
    "transformer": "Transformer encoder-decoder",
}
ALPHABET = string.ascii_lowercase[:16]
DATE_BINS = ((0, 10), (11, 15), (16, 20), (21, 25), (26, 40))


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


def make_batch(pairs: list[tuple[str, str]], tok: CharTokenizer) -> Seq2SeqBatch:
    """Strings -> one padded batch (src, src_mask, tgt_in, tgt_out, tgt_mask)."""
    return collate_pairs(encode_pairs(pairs, tok), tok.pad_id, tok.bos_id, tok.eos_id)


def masked_seq2seq_loss(model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
    """Mean -log p(y_l | y_{<l}, x) over real target tokens; padding masked on both sides."""
    src, src_mask, tgt_in, tgt_out, tgt_mask = batch
    logits = model(src, tgt_in, src_mask=src_mask, tgt_mask=tgt_mask).logits  # (B, T, V)
    targets = tgt_out.masked_fill(~tgt_mask, -100)  # (B, T)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


@torch.no_grad()
def score(model: nn.Module, batch: Seq2SeqBatch, chunk: int = 250) -> tuple[Tensor, Tensor]:
    """Teacher-forced hits: per target token (N, T) (False at padding) and whole targets (N,).

    A whole target is right under teacher forcing exactly when greedy decoding reproduces it.
    """
    model.eval()
    tokens, exact = [], []
    for i in range(0, batch.src.size(0), chunk):
        part = Seq2SeqBatch(*(t[i : i + chunk] for t in batch))
        logits = model(
            part.src, part.tgt_in, src_mask=part.src_mask, tgt_mask=part.tgt_mask
        ).logits  # (B, T, V)
        tokens.append((logits.argmax(-1) == part.tgt_out) & part.tgt_mask)  # (B, T)
        exact.append(correct_predictions(logits, part, "seq2seq"))  # (B,)
    return torch.cat(tokens), torch.cat(exact)


def fit_config(name: str, quick: bool) -> FitConfig:
    """Equal budgets (steps x batch); the learning rate is each family's own best guess."""
    lr = 1e-3 if name == "transformer" else 3e-3  # 3e-3 made the Transformer stall on reversal
    return FitConfig(
        steps=25 if quick else 1500,
        batch_size=32 if quick else 64,
        lr=lr,
        warmup_steps=5 if quick else 150,
    )


def train_and_test(
    name: str, tok: CharTokenizer, train: list, test: list, max_len: int, quick: bool, seed: int
) -> tuple[nn.Module, Tensor, Tensor, float]:
    """Train one model; returns it, its token and whole-target hits on ``test``, train seconds."""
    torch.manual_seed(seed)
    model = build_model(model_config(name, tok.vocab_size, max_len, quick))
    batch = tuple(make_batch(train, tok))
    result = fit(model, batch, masked_seq2seq_loss, fit_config(name, quick), seed=seed)
    tokens, exact = score(model, make_batch(test, tok))
    return model, tokens, exact, result.seconds


def alignment_figures(
    models: dict[str, nn.Module], tok: CharTokenizer, source: str, target: str, out_dir: Path
) -> list[FigureRef]:
    """Bahdanau alignment and the Transformer's last-layer cross-attention on one example."""
    src = tok.encode(source)
    tgt_in = [tok.bos_id, *tok.encode(target)]
    src_labels, out_labels = list(source), [*target, "<eos>"]
    figures = []
    maps = attention_maps(models["bahdanau"], src, target=tgt_in)
    fig = plot_alignment(
        maps.cross_attn[0, 0],
        src_labels,
        out_labels,  # (T, S)
        title=f"LSTM + Bahdanau, reversal of length {len(source)}",
    )
    figures.append(
        save_chart(
            fig,
            out_dir,
            "alignment_bahdanau.png",
            "Bahdanau alignment "
            "alpha_lt on the longest reversal: the anti-diagonal is the "
            "reversal.",
        )
    )
    maps = attention_maps(models["transformer"], src, target=tgt_in)
    n_layers = maps.cross_attn.shape[0]  # (L, H, T, S)
    fig = plot_attention(
        maps.cross_attn[-1],
        out_labels,
        src_labels,  # (H, T, S)
        title=f"Transformer cross-attention, layer {n_layers} of {n_layers} "
        f"(last), length {len(source)}",
        first_layer=n_layers,
    )
    figures.append(
        save_chart(
            fig,
            out_dir,
            "cross_attention_transformer.png",
            "Transformer "
            "cross-attention of the last decoder layer, one panel per head, on "
            "the same example.",
        )
    )
    return figures


def date_bins(pairs: list[tuple[str, str]], per_example: Tensor) -> dict[str, float]:
    """Mean of a per-example score (N,) within each source-length bin ("11-15" -> mean)."""
    out = {}
    lengths = torch.tensor([len(s) for s, _ in pairs])
    for lo, hi in DATE_BINS:
        keep = (lengths >= lo) & (lengths <= hi)
        if keep.any():
            out[f"{lo}-{hi}"] = float(per_example[keep].float().mean())
    return out


def reversal_rows(lengths: tuple[int, ...], acc: dict[str, list[float]]) -> list[dict]:
    return [{"length": t, **{MODELS[n]: acc[n][k] for n in MODELS}} for k, t in enumerate(lengths)]


def charts(
    lengths: tuple[int, ...],
    token_acc: dict,
    exact: dict,
    per_position: dict,
    steps: str,
    n_seeds: int,
    out_dir: Path,
) -> list[FigureRef]:
    """Token accuracy and exact match against T, and accuracy per output position at max T:
    each argument maps a model to one curve per seed ([seed][x], ``n_seeds`` of them); the
    charts draw the mean over seeds with a min-max band
    (:func:`attnlab.lab.kit.charts.seeds_chart`)."""
    figures = []
    for acc, file, what in (
        (token_acc, "accuracy_vs_length.png", "per-token accuracy"),
        (exact, "exact_vs_length.png", "exact match"),
    ):
        fig = seeds_chart(
            {MODELS[n]: (lengths, acc[n]) for n in MODELS},
            xlabel="sequence length T",
            ylabel=f"{what} (test)",
            title=f"Reversal: {what} ({n_seeds} seeds, min-max band)",
        )
        figures.append(
            save_chart(
                fig,
                out_dir,
                file,
                f"Reversal {what} against the input length; every model trained for {steps}. "
                "Mean over seeds, min-max band.",
            )
        )
    positions = list(range(1, lengths[-1] + 1))
    fig = seeds_chart(
        {MODELS[n]: (positions, per_position[n]) for n in MODELS},
        xlabel="output position l (y_l = x_{T+1-l})",
        ylabel="accuracy (test)",
        title=f"Reversal, T = {lengths[-1]}: accuracy per output position",
    )
    figures.append(
        save_chart(
            fig,
            out_dir,
            "accuracy_per_position.png",
            "Accuracy of each "
            f"output position at T = {lengths[-1]} (mean over seeds, min-max band): output l "
            f"copies input T + 1 - l, so a fixed-vector model that read the source as "
            "written recalls its last inputs (first outputs) best.",
        )
    )
    return figures


def sizes(quick: bool) -> tuple[int, int]:
    """Training and test examples per task (and per reversal length)."""
    return (300, 60) if quick else (20000, 500)


def task_data(kind: str, length: int, quick: bool, seed: int) -> tuple:
    """(tokenizer, train pairs, test pairs, model max_len) of "reverse" at ``length`` or "dates"."""
    n_train, n_test = sizes(quick)
    if kind == "reverse":
        task: ReverseTask | DateTask = ReverseTask(
            min_len=length, max_len=length, alphabet=ALPHABET
        )
        tok = CharTokenizer(ALPHABET)
    else:
        task = DateTask()
        tok = CharTokenizer(task.characters())
    train, test = task.make_pairs(n_train, seed=seed), task.make_pairs(n_test, seed=seed + 1)
    max_len = length + 1 if kind == "reverse" else max(len(s) for s, _ in train + test) + 1
    return tok, train, test, max_len


def run_job(job: tuple[str, int, str, bool, int]) -> tuple[dict, Tensor, Tensor, float]:
    """One (task, length, model, quick, seed) run: the model's state dict, its token and
    whole-target hits on the test set, and its training seconds."""
    kind, length, name, quick, seed = job
    tok, train, test, max_len = task_data(kind, length, quick, seed)
    model, tokens, exact, secs = train_and_test(name, tok, train, test, max_len, quick, seed)
    return model.state_dict(), tokens, exact, secs


def job_cost(job: tuple[str, int, str, bool, int]) -> float:
    """Relative run time: Bahdanau's decoder loops over target steps; long inputs cost more."""
    kind, length, name, quick, seed = job
    return (3 if name == "bahdanau" else 1) * (length or 24)


@experiment(
    "long_range",
    notes="004 eq. 1-8 (seq2seq, attention); 000 'Transformer Encoder-Decoder'",
)
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """A plain LSTM encoder-decoder must squeeze the whole input into one vector, so its
    accuracy falls as inputs grow; with attention (Bahdanau, Transformer) each output reads the
    source directly and long inputs stay solvable."""
    torch.set_num_threads(1)
    lengths = (4, 8) if quick else (8, 16, 32, 48)
    n_train, n_test = sizes(quick)
    tok = CharTokenizer(ALPHABET)
    date_models = ("lstm", "bahdanau", "transformer")
    seeds = seed_list(seed, quick)
    jobs = [
        ("reverse", length, name, quick, s) for s in seeds for length in lengths for name in MODELS
    ]
    jobs += [("dates", 0, name, quick, s) for s in seeds for name in date_models]
    results = run_jobs(run_job, jobs, 1 if quick else 2, cost=job_cost)  # 1 thread each
    token_acc: dict[str, list[float]] = {name: [] for name in MODELS}  # mean over seeds per T
    tok_seeds: dict[str, list[list[float]]] = {name: [] for name in MODELS}  # [T][seed]
    exact: dict[str, list[float]] = {name: [] for name in MODELS}
    exact_seeds: dict[str, list[list[float]]] = {name: [] for name in MODELS}  # [T][seed]
    seconds, longest, per_position = dict.fromkeys(MODELS, 0.0), {}, {}  # [seed][l] at max T
    for length in lengths:
        for name in MODELS:
            per = [results[("reverse", length, name, quick, s)] for s in seeds]
            tok_seeds[name].append([float(p[1][:, :length].float().mean()) for p in per])
            token_acc[name].append(spread(tok_seeds[name][-1])["mean"])  # without <eos>
            exact_seeds[name].append([float(p[2].float().mean()) for p in per])
            exact[name].append(spread(exact_seeds[name][-1])["mean"])
            seconds[name] += sum(p[3] for p in per)
            per_position[name] = [p[1][:, :length].float().mean(0).tolist() for p in per]
            state = per[0][0]
            if length == lengths[-1]:
                longest[name] = build_model(model_config(name, tok.vocab_size, length + 1, quick))
                longest[name].load_state_dict(state)
                longest[name].eval()
    budget = fit_config("lstm", quick)
    steps = f"{budget.steps} steps of {budget.batch_size}"
    by_seed = {n: [list(c) for c in zip(*v)] for n, v in tok_seeds.items()}  # [seed][T]
    exact_by_seed = {n: [list(c) for c in zip(*v)] for n, v in exact_seeds.items()}
    figures = charts(lengths, by_seed, exact_by_seed, per_position, steps, len(seeds), out_dir)
    example = ReverseTask(min_len=lengths[-1], max_len=lengths[-1], alphabet=ALPHABET)
    source, target = example.make_pairs(1, seed=seed + 2)[0]
    figures += alignment_figures(longest, tok, source, target, out_dir)
    dates = DateTask()
    date_rows, date_acc = [], {}
    date_curves, date_tokens = {}, {}
    for name in date_models:
        exact_s, token_s, bins_s = [], [], []
        for s in seeds:
            _, tokens, hits, secs = results[("dates", 0, name, quick, s)]
            _, _, d_test, _ = task_data("dates", 0, quick, s)
            seconds[name] += secs
            per_example = tokens.sum(1) / torch.tensor([len(t) + 1 for _, t in d_test])  # (N,)
            bins_s.append(date_bins(d_test, per_example))
            exact_s.append(float(hits.float().mean()))
            token_s.append(float(per_example.mean()))
        bins = {k: spread([b[k] for b in bins_s])["mean"] for k in bins_s[0]}
        date_acc[MODELS[name]] = spread(exact_s)["mean"]
        date_tokens[name] = token_s
        date_curves[MODELS[name]] = (list(range(len(bins))), [[b[k] for k in bins] for b in bins_s])
        date_rows.append(
            {
                "model": MODELS[name],
                "exact match": spread_text(exact_s),
                "token accuracy": spread_text(token_s),
                **{f"tokens, source {k}": v for k, v in bins.items()},
            }
        )
    fig = seeds_chart(
        date_curves,
        xlabel="source length bin: " + ", ".join(f"{i} = {k}" for i, k in enumerate(bins)),
        ylabel="per-token accuracy (test)",
        title="Date normalisation by source length",
    )
    figures.append(
        save_chart(
            fig,
            out_dir,
            "dates.png",
            "Per-token accuracy on date "
            f"normalisation ({len(dates.formats)} formats) by source length "
            f"(characters), {steps} each; mean over seeds, min-max band.",
        )
    )
    plain = [max(a, b) for a, b in zip(token_acc["lstm"], token_acc["lstm_forward"])]
    attn = [min(a, b) for a, b in zip(token_acc["bahdanau"], token_acc["transformer"])]
    best_plain_long = max(tok_seeds["lstm"][-1] + tok_seeds["lstm_forward"][-1])
    worst_attn_long = min(tok_seeds["bahdanau"][-1] + tok_seeds["transformer"][-1])
    held = plain[0] - plain[-1] > 0.2 and worst_attn_long > best_plain_long + 0.2
    verdict = "held" if held else ("mixed" if attn[-1] > plain[-1] else "did not hold")
    at = {n: spread_text(tok_seeds[n][-1]) for n in MODELS}
    reason = (
        f"per-token accuracy at T = {lengths[-1]} (mean (min-max) over {len(seeds)} "
        f"seeds): plain LSTM {at['lstm']} (reversed) / {at['lstm_forward']} (as written), "
        f"down from {plain[0]:.2f} at T = {lengths[0]}; Bahdanau {at['bahdanau']}, "
        f"Transformer {at['transformer']}. Dates (not a test of length: accuracy is flat "
        "across source lengths) exact match: "
        + ", ".join(f"{k} {v:.2f}" for k, v in date_acc.items())
        + "."
    )
    competence = [
        Competence(
            f"{MODELS[n]}, reversal T = {t}",
            "per-token accuracy at its training length",
            0.99,
            tok_seeds[n][i],
        )
        for n in ("bahdanau", "transformer")
        for i, t in enumerate(lengths)
    ]
    competence += [
        Competence(
            f"{MODELS[n]}, dates",
            "per-token accuracy (training distribution)",
            0.99,
            date_tokens[n],
            in_verdict=False,
        )
        for n in date_models
    ]
    m_rnn, m_tf = model_config("lstm", 3, 8, quick), model_config("transformer", 3, 8, quick)
    return Report(
        name="long_range",
        title="Long-range dependencies: fixed-vector LSTM vs attention as inputs grow",
        claim="Although LSTMs suffers less from the gradient vanishing/explosion problems, it can "
        "still be challenging for LSTMs to learn long-term dependencies. [...] The key idea of "
        "using v_l as a weighted average of individual features f_t is to allow the decoder LSTM "
        "to directly access the representation for each input x_t, therefore the issue of "
        "lacking long-term dependencies between y_l and x_t is addressed.",
        source="004, section 1 and 1.1 (eq. 1-8); 000 'Transformer Encoder-Decoder'",
        setup=[
            f"Reversal over a {len(ALPHABET)}-letter alphabet, fixed length T in {list(lengths)}; "
            f"{n_train} training and {n_test} test strings per length (fresh seeds).",
            f"Date normalisation: {len(dates.formats)} formats -> ISO, {n_train} training and "
            f"{n_test} test dates, accuracy also per source length.",
            f"Models: plain LSTM (1 layer, width {m_rnn.d_model}; v = transform(h_T) starts the "
            "decoder), the same with Bahdanau additive attention (004 eq. 4-8), and a 2+2-layer "
            f"pre-norm Transformer (d_model {m_tf.d_model}, 4 heads, learned positions).",
            "Sutskever's reversal trick puts the first target symbols next to the decoder: on "
            "dates the plain LSTM reads the source reversed; on reversal we show both directions "
            "(reading as written is the trick there, since the target starts with x_T).",
            f"Equal budgets: {steps} (AdamW, warm-up {budget.warmup_steps} + cosine, clip 1), "
            "lr 3e-3 for the LSTMs and 1e-3 for the Transformer; one torch thread per run, "
            "two runs at a time (one per core; runs are seeded and independent, so the results "
            "do not depend on it).",
            "Scores under teacher forcing: per-token accuracy (the argmax at each target "
            "position) and exact match (every position right, which equals greedy-decoding "
            "exact match).",
        ],
        tables=[
            Table("reversal: per-token accuracy by length", reversal_rows(lengths, token_acc)),
            Table("reversal: exact match by length", reversal_rows(lengths, exact)),
            Table("dates: exact match, and per-token accuracy by source length", date_rows),
            Table(
                "training time (s, summed over runs)", [{MODELS[n]: s for n, s in seconds.items()}]
            ),
        ],
        figures=figures,
        **gated_fields(verdict, reason, competence, seeds, quick),
        per_seed={
            "reversal_token_accuracy": {MODELS[n]: v for n, v in tok_seeds.items()},
            "reversal_exact_match": {MODELS[n]: v for n, v in exact_seeds.items()},
            "dates_token_accuracy": {MODELS[n]: v for n, v in date_tokens.items()},
        },
        metrics={
            "lengths": list(lengths),
            "token_accuracy": token_acc,
            "exact_match": exact,
            "dates": date_acc,
        },
        findings=[
            "The plain LSTM's per-token accuracy by length: "
            + ", ".join(f"T={t}: {a:.2f}" for t, a in zip(lengths, token_acc["lstm"]))
            + " (source reversed); "
            + ", ".join(f"{a:.2f}" for a in token_acc["lstm_forward"])
            + " (as written).",
            "Longest T learned (per-token accuracy >= 0.9) within the budget: "
            + ", ".join(f"{MODELS[n]} {_longest_learned(lengths, token_acc[n])}" for n in MODELS)
            + f". Budgets are equal, so this measures what each model learns in {steps}, not "
            "what it could learn with longer training.",
            f"Accuracy per output position at T = {lengths[-1]} (first 8 outputs / last 8): "
            + "; ".join(
                f"{MODELS[n]} {np.mean(np.asarray(per_position[n])[:, :8]):.2f} / "
                f"{np.mean(np.asarray(per_position[n])[:, -8:]):.2f}"
                for n in MODELS
            )
            + ". The first outputs copy the last inputs, which a fixed vector read in order "
            "remembers best.",
            "Bahdanau's alignment on the longest example is the anti-diagonal (output l reads "
            "source T + 1 - l) when the model has learned the task.",
        ],
    )


def _longest_learned(lengths: tuple[int, ...], acc: list[float]) -> str:
    learned = [t for t, a in zip(lengths, acc) if a >= 0.9]
    return f"T = {max(learned)}" if learned else "none"
