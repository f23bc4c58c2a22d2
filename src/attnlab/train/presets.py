"""Run presets: complete, tuned settings for the built-in tasks (``attnlab train --preset NAME``).

A preset is a pair of plain tables, exactly what a run TOML file holds (``[model]``, ``[train]``),
so ``attnlab train --preset dates --dump-config dates.toml`` writes it out for editing. A config
file and command-line flags override preset values.

``dates`` is the main job of the README: the Vaswani encoder-decoder (2 + 2 pre-norm layers,
d_model 64, 4 heads) learns date normalisation ("tuesday 3 march 1998" -> "1998-03-03") from
20,000 generated pairs to >= 95% exact match on 1,000 held-out dates. It was tuned for wall time
on 2 CPU cores: a small width, batch 128, a high peak rate (3e-3) after a short warm-up, and
betas (0.9, 0.98) as in Vaswani et al. 5.3, and one intra-op thread: at d_model 64 the matrices
are too small for a second thread to pay, and when other processes share the cores a two-thread
team spins waiting for its partner (measured 4-20x slower). The numbers are in docs/training.md.
"""

from __future__ import annotations

import copy
from typing import Any

from attnlab.errors import ConfigError

_SMALL_SEQ2SEQ = dict(
    kind="encoder_decoder", d_model=64, n_heads=4, n_layers=2, d_ff=256, max_len=64, dropout=0.0
)
_FAST_TRAIN = dict(batch_size=128, lr=3e-3, min_lr=1e-4, warmup_steps=100, weight_decay=0.01,
                   betas=[0.9, 0.98], grad_clip=1.0, n_train=20000, n_val=1000, eval_batches=8,
                   log_every=20, threads=1)  # fmt: skip

RUN_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "dates": {
        "model": dict(_SMALL_SEQ2SEQ),
        "train": dict(_FAST_TRAIN, task="seq2seq", data="dates", steps=800, eval_every=200,
                      save_every=200, best_metric="val_exact_match", out="runs/dates"),
    },
    "reverse": {
        "model": dict(_SMALL_SEQ2SEQ),
        "train": dict(_FAST_TRAIN, task="seq2seq", data="reverse", steps=1000, eval_every=250,
                      save_every=250, best_metric="val_exact_match", out="runs/reverse"),
    },
    "addition": {  # carries need width: d_model 128 at lr 1e-3 (98.7 % vs 40 % at d_model 64)
        "model": dict(_SMALL_SEQ2SEQ, d_model=128, d_ff=512),
        "train": dict(_FAST_TRAIN, task="seq2seq", data="addition", steps=1500, lr=1e-3,
                      eval_every=250, save_every=250, best_metric="val_exact_match",
                      out="runs/addition"),
    },
    "parens": {
        "model": dict(kind="classifier", d_model=64, n_heads=4, n_layers=2, d_ff=256, max_len=64,
                      pooling="cls", n_classes=2),
        "train": dict(_FAST_TRAIN, task="classify", data="parens", steps=800, eval_every=200,
                      save_every=200, best_metric="val_accuracy", out="runs/parens"),
    },
    "char-lm": {  # give the text with --text FILE_OR_DIR
        "model": dict(kind="decoder_lm", d_model=128, n_heads=4, n_layers=4, max_len=128,
                      dropout=0.1),
        "train": dict(task="lm", tokenizer="char", context_len=128, batch_size=32, steps=2000,
                      lr=1e-3, min_lr=1e-4, warmup_steps=100, weight_decay=0.1,
                      betas=[0.9, 0.95], eval_every=250, save_every=500, eval_batches=20,
                      log_every=10, out="runs/char-lm"),
    },
}  # fmt: skip

# The recipe pair of ``attnlab bench --suite recipe``: the same data and evaluation protocol
# (char tokenizer, context 64, 90/10 split, the split's first 240 validation windows), so their
# validation losses are read on the same windows. ``baseline-char`` is the classic small
# character-level recipe (4 layers, width 128, batch 12, AdamW 1e-3 over 2000 steps);
# ``fast-char`` is tuned for time to the baseline's final loss on a CPU: a smaller model
# (2 layers, width 96) with rotary positions, QK-norm, Muon (lr 0.04) on the hidden matrices and
# AdamW 4e-3 on the rest, batches of 24 (two threads use them better than 12: ~1.4 ms per
# sequence against ~1.8), a 25-step warm-up and a cosine over 400 steps; it evaluates the same
# 240 windows as 10 batches of 24. It is not the recipe for the lowest loss: its small model
# levels off near 1.80, where the baseline's goes on falling. docs/training.md has the sweep
# that chose it (steps to the loss x time per step).
_CHAR_MODEL = dict(kind="decoder_lm", d_model=128, n_heads=4, n_layers=4, max_len=64, dropout=0.0)
_CHAR_TRAIN = dict(task="lm", tokenizer="char", context_len=64, batch_size=12, val_fraction=0.1,
                   eval_every=100, eval_batches=20, save_every=500, log_every=50, min_lr=1e-4,
                   weight_decay=0.1, betas=[0.9, 0.99])  # fmt: skip
RUN_PRESETS["baseline-char"] = {
    "model": dict(_CHAR_MODEL),
    "train": dict(_CHAR_TRAIN, steps=2000, lr=1e-3, warmup_steps=100, out="runs/baseline-char"),
}
RUN_PRESETS["fast-char"] = {
    "model": dict(_CHAR_MODEL, n_layers=2, d_model=96, positional="rotary", qk_norm=True),
    "train": dict(_CHAR_TRAIN, steps=400, batch_size=24, eval_batches=10, lr=4e-3,
                  warmup_steps=25, optimizer="muon", muon_lr=0.04, eval_every=25,
                  out="runs/fast-char"),
}  # fmt: skip

# ``gpu-char``: nanoGPT's shakespeare-char model (6 layers, 6 heads, width 384, context 256, batch
# 64, dropout 0.2, GELU, no biases, tied head) with rotary positions, QK-norm and Muon on the
# hidden matrices, bf16 autocast and torch.compile, on a shorter schedule. Give the text with
# --text FILE. Measured on an H200 (benchmarks/cuda/NANOGPT.md) it learns faster per step than
# nanoGPT's recipe (1.46 at step 1,000 against 1.52) but its compiled step costs 3.2x the plain
# recipe's, so today it is not faster in wall time (56 s to 1.452, nanoGPT 44-59 s to ~1.46).
RUN_PRESETS["gpu-char"] = {
    "model": dict(kind="decoder_lm", d_model=384, n_heads=6, n_layers=6, max_len=256,
                  dropout=0.2, activation="gelu", bias=False, positional="rotary", qk_norm=True),
    "train": dict(task="lm", tokenizer="char", context_len=256, batch_size=64, steps=1250,
                  optimizer="muon", muon_lr=0.02, lr=1e-3, min_lr=1e-4, warmup_steps=100,
                  betas=[0.9, 0.99], weight_decay=0.1, grad_clip=1.0, val_fraction=0.1,
                  eval_every=250, eval_batches=100, save_every=0, log_every=50, dtype="bf16",
                  compile=True, out="runs/gpu-char"),
}  # fmt: skip


def preset_tables(name: str) -> dict[str, dict[str, Any]]:
    """A deep copy of preset ``name``'s ``{"model": ..., "train": ...}`` tables."""
    if name not in RUN_PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(RUN_PRESETS)}")
    return copy.deepcopy(RUN_PRESETS[name])
