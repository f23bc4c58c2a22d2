"""The small character LM of the language experiments (``char_lm``, ``sampling``): its recipe, a
run directory shared through a hash of the text and settings (so both experiments reuse one trained
model, and an interrupted run continues from its checkpoint), the gated training of both
(:func:`gated_char_lm`: the rate swept on the first seed on the validation loss, bracketed, the
steps doubled on the first seed) and the count-based baselines.

Text: the data folder's tinyshakespeare, or any text file given as the data
(:mod:`attnlab.lab.kit.datasets`); without one, a text generated from a small grammar of
play-like dialogue (:mod:`attnlab.lab.kit.corpus`), so no experiment needs a download.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.config import ModelConfig
from attnlab.data import read_text
from attnlab.errors import UserError
from attnlab.lab.kit.corpus import generated_text
from attnlab.lab.kit.datasets import SHAKESPEARE, dataset
from attnlab.lab.kit.gating import ArmRuns, train_gated
from attnlab.lab.kit.verdict import Competence, Doubling
from attnlab.train import RunConfig, TrainConfig, train
from attnlab.train.report import METRICS_FILE, read_metrics

WORK_DIR = Path("runs") / "experiments" / "char_lm"
ARM = "Transformer LM"
LR = 3e-3  # the recipe's rate, the middle of the sweep
LRS = (1e-3, 3e-3, 1e-2)  # swept on the first seed, extended past an edge (kit.gating)
STEPS = {True: 40, False: 1000}
TOLERANCE = 0.05  # step doubling: validation loss (nats/char) may fall at most this much


def resolve_text(quick: bool, seed: int, data: Path | None, work: Path) -> tuple[Path, str]:
    """The text file to train on and where it came from: the data folder's tinyshakespeare (or
    ``data`` itself, any text file) when a data folder is given, else a generated text."""
    path = dataset(data, SHAKESPEARE)
    if path is not None:
        return path, f"the file {path.name}"
    lines = 600 if quick else 12000
    path = work / f"generated_{lines}_{seed}.txt"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(generated_text(lines, seed), encoding="utf-8")
    return path, f"a generated play-like text ({lines} speeches, see lab.corpus.generated_text)"


def recipe(
    quick: bool, seed: int, text: Path, lr: float = LR, steps: int | None = None
) -> RunConfig:
    """A 4-layer, d_model 128 char Transformer: the ``char-lm`` preset shortened to 1000 steps
    for CPU (``steps`` overrides it: the doubling), no dropout, AdamW at ``lr`` (swept by
    :func:`gated_char_lm`), warm-up then cosine over the whole run."""
    n_steps = steps if steps is not None else STEPS[quick]
    model = ModelConfig(
        kind="decoder_lm",
        d_model=64 if quick else 128,
        n_heads=4,
        n_layers=2 if quick else 4,
        max_len=64 if quick else 128,
        dropout=0.0,
    )
    cfg = TrainConfig(
        task="lm",
        data=str(text),
        tokenizer="char",
        val_fraction=0.1,
        context_len=64 if quick else 128,
        batch_size=16 if quick else 32,
        steps=n_steps,
        lr=lr,
        min_lr=1e-4,
        warmup_steps=5 if quick else 100,
        weight_decay=0.1,
        betas=(0.9, 0.95),
        eval_every=20 if quick else 250,
        eval_batches=4 if quick else 20,
        save_every=0 if quick else 250,
        keep_last=1,
        log_every=5 if quick else 25,
        seed=seed,
        progress=False,
        threads=1 if quick else 0,
    )
    return RunConfig(model, cfg)


def run_dir_for(run_config: RunConfig, text: Path, base: Path) -> Path:
    """``base/<hash>``: one directory per (text content, settings), shared by experiments."""
    digest = hashlib.sha256()
    for file in sorted(text.rglob("*")) if text.is_dir() else [text]:
        if file.is_file():
            digest.update(file.read_bytes())
    digest.update(repr(run_config.to_dict()).encode())
    return base / digest.hexdigest()[:12]


def train_char_lm(
    quick: bool,
    seed: int,
    data: Path | None,
    out_dir: Path,
    lr: float = LR,
    steps: int | None = None,
) -> tuple[Any, Path, str]:
    """Train (or continue, or reload) the char LM at ``lr`` for ``steps``; returns the
    TrainResult, the text file and where the text came from."""
    base = out_dir / "work" if quick else WORK_DIR
    path, origin = resolve_text(quick, seed, data, base)
    run_config = recipe(quick, seed, path, lr, steps)
    run_dir = run_dir_for(run_config, path, base)
    result = train(run_config, run_dir=run_dir, resume=True, progress=False)
    if result.stopped_by is not None:
        raise UserError(
            f"training stopped by {result.stopped_by} at step {result.step}; the "
            f"checkpoint is in {str(run_dir)!r}: run the same command again to "
            "continue"
        )
    return result, path, origin


def count_baselines(train_text: str, val_text: str) -> dict[str, float]:
    """Unigram entropy and add-one bigram cross-entropy of ``val_text`` (bits per character)."""
    alphabet = sorted(set(train_text) | set(val_text))
    v = len(alphabet)
    uni = Counter(train_text)
    total = len(train_text)
    unigram = -sum(math.log2((uni[c] + 1) / (total + v)) for c in val_text) / len(val_text)
    pairs = Counter(zip(train_text, train_text[1:]))
    bigram = -sum(
        math.log2((pairs[(a, b)] + 1) / (uni[a] + v)) for a, b in zip(val_text, val_text[1:])
    ) / (len(val_text) - 1)
    return {"unigram": unigram, "bigram": bigram}


def split_text(path: Path, val_fraction: float = 0.1) -> tuple[str, str]:
    """The training and validation text as the corpus cuts them (the last 10% is validation)."""
    files = sorted(path.rglob("*.txt")) if path.is_dir() else [path]
    text = "\n".join(read_text(f) for f in files)
    cut = int(len(text) * (1 - val_fraction))
    return text[:cut], text[cut:]


def train_job(job: tuple) -> dict[str, Any]:
    """Train (or reload) the char LM of one seed at one rate for some steps, on one thread; its
    numbers (the model stays in its run directory, where :func:`train_char_lm` reloads it)."""
    seed, quick, data, out_dir, lr, steps = job
    torch.set_num_threads(1)
    result, _, _ = train_char_lm(quick, seed, data, Path(out_dir), lr, steps)
    records = read_metrics(result.run_dir / METRICS_FILE)
    train_log = [(r["step"], r["train_loss"]) for r in records
                 if isinstance(r.get("train_loss"), (int, float))]  # fmt: skip
    val_log = [(r["step"], r["val_loss"]) for r in records
               if isinstance(r.get("val_loss"), (int, float))]  # fmt: skip
    tail = [
        v for _, v in train_log[-max(1, 50 // recipe(quick, seed, Path(".")).train.log_every) :]
    ]
    return {
        "val": float(result.metrics["val_loss"]),
        "train": float(np.mean(tail)),
        "steps": result.step,
        "train_s": result.elapsed_s,
        "lr": lr,
        "train_curve": train_log,  # (step, training loss), one per log_every steps
        "val_curve": val_log,  # (step, validation loss), one per eval_every steps
        "run_dir": str(result.run_dir),
    }


def gated_char_lm(quick: bool, seeds: list[int], data: Path | None, out_dir: Path) -> ArmRuns:
    """The char LM under the gate (:func:`attnlab.lab.kit.gating.train_gated`): its rate swept
    on the first seed and chosen on the validation loss, every seed at that rate, the first seed
    again at twice the steps. Both language experiments call this; the run directories are
    named by a hash of the settings, so the second one reloads what the first trained."""
    return train_gated(
        train_job,
        [ARM],
        lambda arm, lr, steps, seed: (seed, quick, data, str(out_dir), lr, steps),
        lambda r: r["val"],
        grid=LRS,
        steps=STEPS[quick],
        seeds=seeds,
        higher_is_better=False,
        workers=1 if quick else 2,
        chosen_on="validation loss (nats/char), first seed",
        max_extra=1 if quick else 2,
    )


def doubling(runs: ArmRuns) -> Doubling:
    """The char LM's step doubling on the validation loss (nats/char), first seed."""
    return runs.doubling(ARM, lambda r: r["val"], TOLERANCE, "validation loss (nats/char)")


def competence(runs: ArmRuns, bigram_bits: float) -> Competence:
    """The char LM's competence (both language experiments): its training bits/char below the
    bigram baseline's validation bits/char on every seed, at the swept rate, steps doubled."""
    return Competence(
        ARM,
        "training bits/char (mean of the last 50 steps) below the bigram baseline's "
        "validation bits/char",
        bigram_bits,
        [r["train"] / math.log(2) for r in runs.per[ARM]],
        higher_is_better=False,
        lr=runs.lr[ARM],
        doubling=doubling(runs),
    )
