"""Experiment ``long_range``: a fixed-size vector forgets long inputs; attention does not (004).

004 eq. 1-3: a plain LSTM encoder-decoder squeezes x_{1:T} into one vector v = transform(h^e_T)
and decodes from it alone, so the longer the input the more it must forget. With attention
(004 eq. 4-8, Bahdanau) each decoder step reads a fresh mixture v_l = sum_t alpha_lt f_t of all
encoder states, and the Transformer (000) attends from every target position to every source
position. Three models, the same training budget (steps x batch), on two tasks:

    reversal   "abcde" -> "edcba", one run per length T in {8, 16, 32, 48}: exact match vs T
    dates      "TUESDAY, MARCH 3, 1998" -> "1998-03-03", 16 formats: exact match per source length

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

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer, DateTask, ReverseTask, collate_pairs, encode_pairs
from attnlab.data.batching import Seq2SeqBatch
from attnlab.lab.charts import bar_chart, line_chart, save_chart
from attnlab.lab.fit import FitConfig, fit
from attnlab.lab.registry import experiment
from attnlab.lab.report import FigureRef, Report, Table
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
        return ModelConfig(kind="encoder_decoder", vocab_size=vocab_size, d_model=d_tf,
                           n_heads=4, n_layers=2, d_ff=4 * d_tf, max_len=max_len,
                           positional="sinusoidal")  # fmt: skip
    return ModelConfig(kind="lstm_seq2seq", vocab_size=vocab_size, d_model=d_rnn, n_layers=1,
                       rnn_attention="additive" if name == "bahdanau" else "none",
                       reverse_source=name == "lstm")  # fmt: skip


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
def exact_match(model: nn.Module, batch: Seq2SeqBatch, chunk: int = 250) -> Tensor:
    """(N,) bool: the whole target is right (teacher-forced argmax == greedy exact match)."""
    model.eval()
    out = []
    for i in range(0, batch.src.size(0), chunk):
        part = Seq2SeqBatch(*(t[i : i + chunk] for t in batch))
        logits = model(part.src, part.tgt_in, src_mask=part.src_mask,
                       tgt_mask=part.tgt_mask).logits  # (B, T, V)  # fmt: skip
        out.append(correct_predictions(logits, part, "seq2seq"))
    return torch.cat(out)


def train_and_test(
    name: str,
    tok: CharTokenizer,
    train: list,
    test: list,
    max_len: int,
    fit_cfg: FitConfig,
    quick: bool,
    seed: int,
) -> tuple[nn.Module, Tensor, float]:
    """Train one model; returns it, its per-example exact match on ``test`` and train seconds."""
    torch.manual_seed(seed)
    model = build_model(model_config(name, tok.vocab_size, max_len, quick))
    result = fit(model, tuple(make_batch(train, tok)), masked_seq2seq_loss, fit_cfg, seed=seed)
    return model, exact_match(model, make_batch(test, tok)), result.seconds  # fmt: skip


def alignment_figures(models: dict[str, nn.Module], tok: CharTokenizer, source: str,
                      target: str, out_dir: Path) -> list[FigureRef]:  # fmt: skip
    """Bahdanau alignment and the Transformer's last-layer cross-attention on one example."""
    src = tok.encode(source)
    tgt_in = [tok.bos_id, *tok.encode(target)]
    src_labels, out_labels = list(source), [*target, "<eos>"]
    figures = []
    maps = attention_maps(models["bahdanau"], src, target=tgt_in)
    fig = plot_alignment(maps.cross_attn[0, 0], src_labels, out_labels,  # (T, S)
                         title=f"LSTM + Bahdanau, reversal of length {len(source)}")  # fmt: skip
    figures.append(save_chart(fig, out_dir, "alignment_bahdanau.png", "Bahdanau alignment "
                              "alpha_lt on the longest reversal: the anti-diagonal is the "
                              "reversal."))  # fmt: skip
    maps = attention_maps(models["transformer"], src, target=tgt_in)
    fig = plot_attention(maps.cross_attn[-1], out_labels, src_labels,  # (H, T, S)
                         title=f"Transformer cross-attention (last layer), length "
                         f"{len(source)}")  # fmt: skip
    figures.append(save_chart(fig, out_dir, "cross_attention_transformer.png", "Transformer "
                              "cross-attention of the last decoder layer, one panel per head, on "
                              "the same example."))  # fmt: skip
    return figures


def date_bins(pairs: list[tuple[str, str]], hits: Tensor) -> dict[str, float]:
    """Exact match of the dates test set per source-length bin ("11-15" -> accuracy)."""
    out = {}
    lengths = torch.tensor([len(s) for s, _ in pairs])
    for lo, hi in DATE_BINS:
        keep = (lengths >= lo) & (lengths <= hi)
        if keep.any():
            out[f"{lo}-{hi}"] = float(hits[keep].float().mean())
    return out


@experiment(
    "long_range",
    claim="A plain LSTM encoder-decoder must squeeze the whole input into one vector, so its "
    "accuracy falls as inputs grow; with attention (Bahdanau, Transformer) each output reads "
    "the source directly and long inputs stay solvable.",
    notes="004 eq. 1-8 (seq2seq, attention); 000 'Transformer Encoder-Decoder'",
)
def run(quick: bool, out_dir: Path, seed: int) -> Report:
    torch.set_num_threads(1)  # small models: a second thread costs more than it gives
    lengths = (4, 8) if quick else (8, 16, 32, 48)
    n_train, n_test = (300, 60) if quick else (20000, 500)
    fit_cfg = FitConfig(steps=25 if quick else 300, batch_size=32 if quick else 64, lr=3e-3,
                        warmup_steps=5 if quick else 30)  # fmt: skip
    tok = CharTokenizer(ALPHABET)
    acc: dict[str, list[float]] = {name: [] for name in MODELS}
    rows, seconds, longest = [], dict.fromkeys(MODELS, 0.0), {}
    for length in lengths:
        task = ReverseTask(min_len=length, max_len=length, alphabet=ALPHABET)
        train, test = task.make_pairs(n_train, seed=seed), task.make_pairs(n_test, seed=seed + 1)
        row: dict[str, object] = {"task": "reversal", "length": length}
        for name, label in MODELS.items():
            model, hits, secs = train_and_test(name, tok, train, test, length + 1, fit_cfg,
                                               quick, seed)  # fmt: skip
            acc[name].append(float(hits.float().mean()))
            row[label] = acc[name][-1]
            seconds[name] += secs
            longest[name] = model
        rows.append(row)
    figures = [
        save_chart(
            line_chart(
                {MODELS[n]: (lengths, acc[n]) for n in MODELS},
                xlabel="sequence length T",
                ylabel="exact match (test)",
                title="Reversal: whole output right",
            ),
            out_dir,
            "accuracy_vs_length.png",
            "Exact-match accuracy on reversal against the input "
            f"length, every model trained for {fit_cfg.steps} steps of {fit_cfg.batch_size}.",
        )
    ]
    example = ReverseTask(min_len=lengths[-1], max_len=lengths[-1], alphabet=ALPHABET)
    source, target = example.make_pairs(1, seed=seed + 2)[0]
    figures += alignment_figures(longest, tok, source, target, out_dir)
    dates = DateTask()
    d_tok = CharTokenizer(dates.characters())
    d_train, d_test = dates.make_pairs(n_train, seed=seed), dates.make_pairs(n_test, seed=seed + 1)
    d_max = max(len(s) for s, _ in d_train + d_test) + 1
    date_rows, date_acc = [], {}
    for name in ("lstm", "bahdanau", "transformer"):
        _, hits, secs = train_and_test(name, d_tok, d_train, d_test, d_max, fit_cfg, quick, seed)
        seconds[name] += secs
        date_acc[MODELS[name]] = float(hits.float().mean())
        date_rows.append(
            {
                "model": MODELS[name],
                "exact match (all)": date_acc[MODELS[name]],
                **{f"source {k}": v for k, v in date_bins(d_test, hits).items()},
            }
        )
    figures.append(
        save_chart(
            bar_chart(date_acc, ylabel="exact match (test)", title="Date normalisation"),
            out_dir,
            "dates.png",
            "Exact match on date normalisation (16 formats), same budget.",
        )
    )
    plain, attn = acc["lstm"], [min(a, b) for a, b in zip(acc["bahdanau"], acc["transformer"])]
    drop = plain[0] - plain[-1]
    held = drop > 0.3 and attn[-1] > plain[-1] + 0.3
    verdict = "held" if held else ("mixed" if attn[-1] > plain[-1] else "did not hold")
    reason = (f"at T={lengths[-1]} the plain LSTM gets {plain[-1]:.2f} exact match (from "
              f"{plain[0]:.2f} at T={lengths[0]}), Bahdanau {acc['bahdanau'][-1]:.2f}, Transformer "
              f"{acc['transformer'][-1]:.2f}; dates: " + ", ".join(
                  f"{k} {v:.2f}" for k, v in date_acc.items()) + ".")  # fmt: skip
    return Report(
        name="long_range",
        title="Long-range dependencies: fixed-vector LSTM vs attention as inputs grow",
        claim="the encoder has to compress the entire source sentence into a fixed-size vector "
        "[...] attention lets the decoder look at every encoder state at every step.",
        source="004, 'Sequence-to-sequence with attention' (eq. 1-8); 000",
        setup=[
            f"Reversal over a {len(ALPHABET)}-letter alphabet, fixed length T in {list(lengths)}; "
            f"{n_train} training and {n_test} test strings per length (fresh seeds).",
            f"Date normalisation: {len(dates.formats)} formats -> ISO, {n_train} training and "
            f"{n_test} test dates, accuracy also per source length.",
            "Models: plain LSTM (1 layer, width "
            f"{model_config('lstm', 3, 8, quick).d_model}; v = transform(h_T) starts the "
            "decoder), the same with Bahdanau additive attention, and a 2+2-layer Transformer "
            f"(d_model {model_config('transformer', 3, 8, quick).d_model}, 4 heads, sinusoidal).",
            "Sutskever's reversal trick puts the first target symbols next to the decoder: on "
            "dates the plain LSTM reads the source reversed; on reversal we show both directions "
            "(reading as written is the trick there, since the target starts with x_T).",
            f"Equal budgets: {fit_cfg.steps} AdamW steps of {fit_cfg.batch_size}, lr "
            f"{fit_cfg.lr:g}, warm-up {fit_cfg.warmup_steps} + cosine, clip 1; one torch thread.",
            "Exact match = every target token's argmax right under teacher forcing, which equals "
            "greedy-decoding exact match.",
        ],
        tables=[
            Table("reversal: exact match per length", rows),
            Table("dates: exact match, overall and per source length", date_rows),
            Table(
                "training time (s, summed over runs)", [{MODELS[n]: s for n, s in seconds.items()}]
            ),
        ],  # fmt: skip
        figures=figures,
        verdict=verdict,
        verdict_reason=reason,
        metrics={"lengths": list(lengths), "accuracy": acc, "dates": date_acc},
        findings=[
            "The plain LSTM's accuracy by length: "
            + ", ".join(f"T={t}: {a:.2f}" for t, a in zip(lengths, plain))
            + "; reading the source as written instead: "
            + ", ".join(f"{a:.2f}" for a in acc["lstm_forward"])
            + ".",
            "Bahdanau's alignment on the longest example should be the anti-diagonal (output l "
            "reads source T + 1 - l); the Transformer spreads that lookup over heads.",
        ],
    )
