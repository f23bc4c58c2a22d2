"""Everything decided before the first step: run directory, resume point, data, model config.

The rules a user can rely on:

* A run directory that already holds checkpoints is never trained over by accident: without
  ``resume`` that is an error naming the latest step; with ``resume`` training continues from
  ``latest_checkpoint(run_dir)`` (and starts fresh if there is none yet, e.g. after a ``kill -9``
  before the first save). A latest checkpoint that fails its checks (truncated weights, garbage
  JSON, missing optimizer state) is skipped for the newest one that passes, with a warning; the
  skipped ones are renamed ``damaged-step_*`` (kept, never read or deleted), and so are step
  directories newer than the one ``latest`` names (a save that did not finish).
* A fresh run writes only into a directory that is missing, empty, or an attnlab run of the same
  config; anything else (the user's files, another run) is an error unless ``overwrite``.
* The data decides the sizes the model config leaves open: ``vocab_size`` = the tokenizer's,
  ``n_classes`` = the number of labels, ``pad_id`` = the tokenizer's pad id. A resumed run takes
  its tokenizer and labels from the checkpoint, and the model config must equal the saved one.
* A resumed run continues the saved run: training settings that change the remaining steps
  (learning rate, seed, batch, data, ...) may differ from the saved ones only when asked
  (``allow_changes``); any difference is named. Settings that only change what is logged or kept
  (``eval_every``, ``keep_last``, ...) and ``steps`` (to extend a finished run) may change.
* The model kind must fit the task: ``lm`` trains decoder_lm / rnn_lm, ``seq2seq`` trains
  encoder_decoder / lstm_seq2seq and ``classify`` trains classifier.
* A fine-tuning run (``init_from``) takes the tokenizer and model config of the pretrained model
  instead (``attnlab.train.finetune``), and its weights through ``RunSetup.initial_weights``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, NamedTuple

from attnlab.checkpoint.atomic import ensure_writable_dir
from attnlab.checkpoint.load import (
    Checkpoint,
    check_resumable,
    load_checkpoint,
    load_fallback,
    report_unfinished,
)
from attnlab.checkpoint.rundir import _step_of, damage_of, latest_checkpoint, step_dirs
from attnlab.config import CLASSIFIER_KINDS, LM_KINDS, SEQ2SEQ_KINDS, ModelConfig
from attnlab.errors import CheckpointError, ConfigError, FieldWarning, UserError, blamed_fields
from attnlab.models.build import check_model_memory
from attnlab.train.build_data import build_task_data
from attnlab.train.distributed import DistInfo, barrier
from attnlab.train.finetune import init_model_config, initial_weights, load_init
from attnlab.train.lock import LOCK_FILE
from attnlab.train.run_config import load_toml
from attnlab.train.task_data import TaskData
from attnlab.train.timing import TIMING_FILE, PhaseTimes

KINDS_FOR_TASK: dict[str, tuple[str, ...]] = {
    "lm": LM_KINDS,
    "seq2seq": SEQ2SEQ_KINDS,
    "classify": CLASSIFIER_KINDS,
}
DEFAULT_KIND = {"lm": "decoder_lm", "seq2seq": "encoder_decoder", "classify": "classifier"}


class RunSetup(NamedTuple):
    run_dir: Path
    data: TaskData
    model_config: ModelConfig
    checkpoint: Checkpoint | None  # the checkpoint resumed from, if any
    initial_weights: dict[str, Any] | None = None  # a fresh fine-tuning run's pretrained tensors


def check_kind(model_cfg: ModelConfig, task: str) -> None:
    """A ConfigError when ``model_cfg.kind`` cannot be trained on ``task``."""
    kinds = KINDS_FOR_TASK.get(task, ())
    if model_cfg.kind not in kinds:
        raise ConfigError(
            f"model kind {model_cfg.kind!r} cannot be trained on task {task!r}; for that task "
            f"use kind {' or '.join(repr(k) for k in kinds)} (e.g. kind={kinds[0]!r}), "
            f"or pick the task that fits the model",
            fields=("kind",),
        )


def fit_model_config(model_cfg: ModelConfig, data: TaskData, announce: bool = True) -> ModelConfig:
    """Fill the sizes the data decides (see module docstring)."""
    changes: dict[str, Any] = {
        "vocab_size": data.tokenizer.vocab_size,
        "tgt_vocab_size": None,  # source and target share one tokenizer
        "pad_id": data.tokenizer.pad_id,
    }
    if data.labels is not None:
        changes["n_classes"] = len(data.labels)
    default = ModelConfig.__dataclass_fields__["vocab_size"].default
    if announce and model_cfg.vocab_size not in (default, data.tokenizer.vocab_size):
        warnings.warn(
            FieldWarning(
                f"vocab_size={model_cfg.vocab_size} is replaced by the tokenizer's "
                f"{data.tokenizer.vocab_size} tokens: the data decides the vocabulary (choose it "
                f"with tokenizer='char'|'byte'|'bpe' and bpe_vocab_size, not vocab_size)",
                fields=("tokenizer", "bpe_vocab_size"),
            ),
            stacklevel=3,
        )
    try:
        return model_cfg.replace(**changes)
    except ValueError as err:
        raise ConfigError(
            f"the model config does not fit the data: {err}", fields=blamed_fields(err)
        ) from None


def _differences(saved: ModelConfig, wanted: ModelConfig) -> list[str]:
    a, b = saved.to_dict(), wanted.to_dict()
    return [f"{k}: checkpoint {a[k]!r}, config {b[k]!r}" for k in a if a[k] != b[k]]


# TrainConfig fields a resumed run may change without changing its remaining steps.
RESUME_SAFE = (
    "steps",
    "eval_every",
    "eval_batches",
    "save_every",
    "keep_last",
    "best_metric",
    "log_every",
    "progress",
    "tensorboard",
    "wandb",
    "out",
)


# TrainConfig fields no resume can change: the saved model is built around them.
FIXED_ON_RESUME = ("task", "tokenizer", "bpe_vocab_size")


def changed_settings(saved: Any, cfg: Any) -> tuple[list[str], list[str]]:
    """(changes that alter the remaining steps, harmless changes) between a checkpoint's saved
    train config (a dict) and this run's TrainConfig, each as ``"lr 0.001 -> 0.003"``."""
    if not isinstance(saved, dict):
        return [], []
    now = cfg.to_dict()
    breaking: list[str] = []
    harmless: list[str] = []
    for key, value in now.items():
        old = saved.get(key, value)
        if isinstance(old, list):
            old = tuple(old)
        if old != value:
            text = f"{key} {old!r} -> {value!r}"
            (harmless if key in RESUME_SAFE else breaking).append(text)
    return breaking, harmless


def check_resume_settings(
    ckpt: Checkpoint, cfg: Any, allow_changes: bool, announce: bool = True
) -> None:
    """Refuse (or with ``allow_changes`` announce) settings that differ from the saved run's."""
    saved = (ckpt.train_state or {}).get("train_config")
    breaking, harmless = changed_settings(saved, cfg)
    fixed = [text for text in breaking if text.split(" ", 1)[0] in FIXED_ON_RESUME]
    if fixed:
        raise ConfigError(
            f"a resumed run cannot change {'; '.join(fixed)}: the checkpoint "
            f"{ckpt.path.name}'s embeddings and output layer are sized for the tokenizer it was "
            f"trained with (even with allow_changes=True); keep those settings to continue the "
            f"run, or start a new run in another out directory",
            fields=(*(text.split(" ", 1)[0] for text in fixed), "out"),
        )
    if breaking and not allow_changes:
        raise ConfigError(
            f"resuming with settings that differ from the run saved at {ckpt.path.name}: "
            f"{'; '.join(breaking)}. They change the remaining steps, so the run would no longer "
            f"match an uninterrupted one; keep the saved settings to continue exactly, pass "
            f"allow_changes=True to continue with the new settings, or train into a new out "
            f"directory",
            fields=(*(text.split(" ", 1)[0] for text in breaking), "allow_changes", "out"),
        )
    if announce and (breaking or harmless):
        warnings.warn(
            f"resuming {ckpt.path.name} with changed settings: {'; '.join(breaking + harmless)}"
            + (" (the remaining steps differ from the saved run's)" if breaking else ""),
            stacklevel=3,
        )


# What a run writes into its directory (attnlab.train.loop, report, build_data, the CLI's plots).
RUN_FILES = (
    "config.toml",
    "metrics.jsonl",
    "metrics.csv",
    "loss.png",
    TIMING_FILE,
    "plots",
    "tensorboard",
    "wandb",
)
RUN_DIRS = ("checkpoints", "data")  # checkpoints: guarded by find_resume_point; data: a cache
DATA_FIELDS = ("vocab_size", "tgt_vocab_size", "pad_id", "n_classes")  # the data decides these


def same_run(saved: Any, run_config: Any) -> list[str]:
    """The settings in which ``saved`` (a run's config.toml, a RunConfig) differs from
    ``run_config`` (sizes the data decides and settings that only change what is logged or kept
    are not compared)."""
    a, b = saved.model.to_dict(), run_config.model.to_dict()
    diffs = [f"model.{k}" for k in a if k not in DATA_FIELDS and a[k] != b[k]]
    breaking, _ = changed_settings(saved.train.to_dict(), run_config.train)
    return diffs + ["train." + text.split(" ", 1)[0] for text in breaking]


def check_fresh_dir(run_dir: Path, run_config: Any, overwrite: bool) -> None:
    """A fresh run writes into ``run_dir`` only when that holds nothing of the user's: it is
    missing, empty, or an attnlab run of the same config (e.g. one killed before its first
    checkpoint). Anything else is an error, unless ``overwrite`` (the run's own files are then
    replaced; other files are left alone)."""
    if overwrite or not run_dir.is_dir():
        return
    entries = sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_FILE)
    foreign = [n for n in entries if n not in RUN_FILES + RUN_DIRS]
    ours = [n for n in entries if n in RUN_FILES]
    why = ""
    if foreign:
        why = f"it holds files attnlab did not write ({', '.join(foreign[:5])})"
    elif ours:
        try:
            diffs = same_run(load_toml(run_dir / "config.toml"), run_config)
        except (UserError, ValueError, TypeError, OSError):
            diffs = None
        if diffs is None:
            why = f"it holds {', '.join(ours)} but no readable attnlab config.toml"
        elif diffs:
            why = f"it holds another run (its config.toml differs in {', '.join(diffs[:6])})"
    if why:
        raise ConfigError(
            f"the run directory {str(run_dir)!r} is not empty and {why}; a fresh run would "
            f"write over them. Choose a new or empty out directory, or pass overwrite=True to "
            f"train into it anyway (config.toml, metrics.jsonl, loss.png and plots/ are then "
            f"replaced; other files are left alone)",
            fields=("out", "overwrite"),
        )


def find_resume_point(run_dir: Path, resume: bool) -> Path | None:
    """The checkpoint to continue from, or None for a fresh run (see module docstring)."""
    latest = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if latest is None and (damaged := step_dirs(run_dir / "checkpoints")):
        problems = "; ".join(f"{p.name}: {damage_of(p)}" for p in damaged[-3:])
        raise CheckpointError(
            f"the run directory {str(run_dir)!r} holds only incomplete checkpoints ({problems}); "
            f"they are kept, not trained over: restore the missing files, or move "
            f"{str(run_dir / 'checkpoints')!r} away to start afresh, or choose a new out "
            f"directory",
            fields=("out",),
        )
    if latest is not None and not resume:
        raise ConfigError(
            f"the run directory {str(run_dir)!r} already holds checkpoints (latest: "
            f"{latest.name}); pass resume=True to continue that run, or choose a new out "
            f"directory so nothing saved there is overwritten",
            fields=("resume", "out"),
        )
    return latest if resume else None


def load_resume_point(path: Path, announce: bool = True) -> tuple[Checkpoint, list[Path]]:
    """The checkpoint to resume from: ``path``, or if it fails its checks (a truncated file,
    garbage JSON, missing optimizer state) the newest one of the run that passes, with a warning
    naming the skipped ones and why. Returns it and the skipped checkpoints."""

    def load(candidate: Path) -> Checkpoint:
        ckpt = load_checkpoint(candidate, map_location="cpu", fallback=False)
        check_resumable(ckpt)
        return ckpt

    unfinished = report_unfinished(path, announce)  # kept aside too: never saved over
    try:
        return load(path), unfinished
    except CheckpointError as err:
        ckpt = load_fallback(path, err, load, "resuming from", announce)
    newer = [c for c in step_dirs(path.parent) if (_step_of(c) or 0) > ckpt.step]
    return ckpt, sorted(set(newer) | {path})


def set_aside(damaged: list[Path]) -> None:
    """Rename skipped checkpoints to ``damaged-step_*``: kept for inspection, never read,
    replaced or deleted by the saves of the resumed run (which reach their steps again)."""
    for path in damaged:
        target = path.with_name(f"damaged-{path.name}")
        n = 1
        while target.exists():
            n += 1
            target = path.with_name(f"damaged-{path.name}-{n}")
        path.rename(target)
        warnings.warn(f"the skipped checkpoint {path.name} is kept as {target}", stacklevel=3)


def prepare_run(
    run_config: Any,
    run_dir: Path,
    resume: bool,
    info: DistInfo,
    allow_changes: bool = False,
    overwrite: bool = False,
    clock: PhaseTimes | None = None,
) -> RunSetup:
    """Resolve the run directory, resume point, data and model config (all ranks); the data's
    preparation is timed as phase ``data`` of ``clock``."""
    cfg = run_config.train
    clock = clock or PhaseTimes()
    check_kind(run_config.model, cfg.task)
    path = find_resume_point(run_dir, resume)
    if path is None and info.is_main:
        check_fresh_dir(run_dir, run_config, overwrite)
    if info.is_main:
        ensure_writable_dir(run_dir)
    barrier(info)
    ckpt: Checkpoint | None = None
    damaged: list[Path] = []
    if path is not None:
        ckpt, damaged = load_resume_point(path, announce=info.is_main)
        check_resume_settings(ckpt, cfg, allow_changes, announce=info.is_main)
    tokenizer = ckpt.tokenizer if ckpt is not None else None
    labels = ckpt.labels if ckpt is not None else None
    pretrained = None
    if ckpt is None and cfg.init_from:
        pretrained = load_init(cfg)
        tokenizer = pretrained.tokenizer

    def build(prepare: bool) -> TaskData:
        return build_task_data(
            cfg, data_dir=run_dir / "data", tokenizer=tokenizer, labels=labels, prepare=prepare
        )

    with clock.phase("data"):
        data = build(True) if info.is_main else None  # rank 0 prepares an LM corpus
        barrier(info)  # every rank has chosen its checkpoint: the skipped ones may move now
        if info.is_main:
            set_aside(damaged)
        if data is None:  # the other ranks read it
            data = build(False)
    weights = None
    if pretrained is not None:
        model_cfg = init_model_config(pretrained, cfg.task, data)
        weights = initial_weights(pretrained, model_cfg, data.labels)
    elif cfg.init_from:  # a resumed fine-tuning run: config.toml holds the model it started with
        model_cfg = run_config.model
    else:
        model_cfg = fit_model_config(run_config.model, data, announce=info.is_main)
    data.check_fits(model_cfg)
    check_model_memory(model_cfg, copies=4, purpose=" with its gradients and AdamW moments")
    if ckpt is not None and ckpt.config != model_cfg:
        diff = "; ".join(_differences(ckpt.config, model_cfg)[:6])
        raise CheckpointError(
            f"the checkpoint {str(ckpt.path)!r} is from a different model ({diff}); resume with "
            f"the model settings it was trained with (the run's config.toml), or start a new "
            f"run in another out directory",
            fields=("out",),
        )
    return RunSetup(run_dir, data, model_cfg, ckpt, weights)
