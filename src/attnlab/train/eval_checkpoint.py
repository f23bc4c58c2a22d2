"""Evaluate a saved run: ``evaluate_checkpoint("runs/dates")`` (what ``attnlab evaluate`` calls).

The checkpoint brings the model, tokenizer, labels and the TrainConfig it was trained with, so the
validation set is rebuilt exactly as during training (same seed, same split). ``split="test"``
uses a fresh generated set for built-in tasks (its seed differs from both the training and the
validation seeds, and sources seen in training are removed); for file data it needs the test
file (``data=``). Nothing is written into the run directory.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from attnlab.data.textfiles import read_text
from attnlab.errors import CheckpointError, ConfigValueError, DataError
from attnlab.interop.loading import load_checkpoint
from attnlab.train.build_data import build_task_data
from attnlab.train.distributed import resolve_device
from attnlab.train.evaluate import EvalResult, evaluate
from attnlab.train.masked_lm_eval import masked_lm_metrics
from attnlab.train.run_config import TrainConfig
from attnlab.train.setup import KINDS_FOR_TASK
from attnlab.train.task_data import LMData, PairData

DATA_OF_TASK = {
    "lm": "text (a text file)",
    "seq2seq": "source-target pairs (a .tsv or .jsonl file)",
    "classify": "labelled examples (a .csv or .jsonl file)",
}
INPUT_OF_TASK = {"lm": "text", "seq2seq": "pairs", "classify": "labels"}  # the kind of input


class CheckpointEvaluation(NamedTuple):
    result: EvalResult
    checkpoint: Path
    step: int
    summary: str  # one line describing the evaluated data


def _task_of(kind: str) -> str:
    for task, kinds in KINDS_FOR_TASK.items():
        if kind in kinds:
            return task
    raise CheckpointError(
        f"a {kind!r} model has no task to evaluate; use a trained LM, seq2seq model or classifier"
    )


def evaluate_checkpoint(
    path: str | os.PathLike,
    *,
    split: str = "val",
    data: str | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    device: str = "auto",
    data_task: str | None = None,
) -> CheckpointEvaluation:
    """Metrics of the checkpoint at ``path`` (a run directory or a ``step_*`` directory).

    ``data`` replaces the evaluation set with a file: text for an LM, a pair file for seq2seq,
    a labelled file for a classifier; ``data_task`` (``"lm"``, ``"seq2seq"`` or ``"classify"``)
    says which of these ``data`` is, and must fit the model. ``max_batches`` defaults to every
    batch of the set.
    """
    if split not in ("val", "test"):
        raise ConfigValueError(f"split={split!r} must be 'val' or 'test'", fields=("split",))
    dev = resolve_device(device)
    ckpt = load_checkpoint(path, map_location=dev)
    task = "lm" if ckpt.config.kind == "masked_lm" else _task_of(ckpt.config.kind)
    if data_task is not None and data_task != task:
        raise DataError(
            f"the checkpoint {str(ckpt.path)!r} holds a {ckpt.config.kind!r} model, which is "
            f"evaluated on {DATA_OF_TASK[task]}, but the data given is {DATA_OF_TASK[data_task]}; "
            f"give the model data of its own task (or evaluate a model trained for that data)",
            fields=(INPUT_OF_TASK[task],),
        )
    if ckpt.config.kind == "masked_lm":  # e.g. a BERT directory: its own objective
        return _evaluate_masked_lm(ckpt, data, batch_size, max_batches)
    saved = (ckpt.train_state or {}).get("train_config")
    if saved:
        try:
            cfg = TrainConfig.from_dict({**saved, "best_metric": "val_loss"})  # unused here
        except ValueError as err:
            raise CheckpointError(f"{ckpt.path}: invalid saved train config: {err}") from None
    elif data is None:
        raise DataError(
            f"{str(ckpt.path)!r} was exported without its training settings, so its validation "
            f"set is unknown; pass the evaluation data file as data (e.g. "
            f"data='test.tsv' for pairs)",
            fields=(INPUT_OF_TASK[task],),
        )
    elif task == "lm":  # e.g. a Hugging Face model: windows as long as the model's context
        cfg = TrainConfig(task=task, data=data, context_len=min(ckpt.config.max_len, 1024))
    else:
        cfg = TrainConfig(task=task, data=data)
    if ckpt.config.kind not in KINDS_FOR_TASK[cfg.task]:
        cfg = cfg.replace(task=task)
    run_dir = ckpt.path.parent.parent
    corpus = run_dir / "data" / "corpus" / "meta.json"
    with tempfile.TemporaryDirectory(prefix="attnlab-eval-") as tmp:
        use_run_corpus = cfg.task == "lm" and data is None and corpus.is_file()
        try:
            task_data = build_task_data(
                cfg,
                data_dir=run_dir / "data" if use_run_corpus else Path(tmp),
                tokenizer=ckpt.tokenizer,
                labels=ckpt.labels,
                split=split,
                eval_data=data,
                prepare=not use_run_corpus,
            )
        except DataError as err:  # a split shorter than one window (task_data.LMData)
            tok = ckpt.tokenizer
            if data is None or tok is None or cfg.task != "lm" or "context_len" not in err.fields:
                raise
            # the training options it names (context_len, val_fraction) are not evaluate's
            n = len(tok.encode(read_text(data)))
            raise DataError(
                f"{data!r} has {n} tokens, but one evaluation window of this model needs "
                f"{cfg.context_len + 1} (its context of {cfg.context_len} and the next token); "
                "give a longer text file",
                fields=("data",),
            ) from None
        task_data.check_fits(ckpt.config)
        bs = batch_size or cfg.batch_size
        result = evaluate(
            ckpt.model,
            task_data,
            batch_size=bs,
            max_batches=max_batches or 1_000_000,
            device=dev,
            prefix="test" if split == "test" else "val",
        )
        warn_unknown(task_data, data)
    return CheckpointEvaluation(result, ckpt.path, ckpt.step, data_summary(task_data, data))


def data_summary(task_data: Any, data: str | None) -> str:
    """One line on what was evaluated: the run's own split, or the file ``data`` (which the data
    builders load as both splits, so their own line would count it twice)."""
    if data is None:
        return task_data.summary
    tok = task_data.tokenizer
    if isinstance(task_data, LMData):
        size = f"{len(task_data.val):,} tokens"
    else:
        size = f"{len(task_data.val_examples):,} examples"
    return f"{size} of {data!r} ({tok.type} tokenizer, {tok.vocab_size} ids)"


UNKNOWN_SHARE = 0.01  # from this share of <unk> ids on, the metrics describe the gaps, not the text


def warn_unknown(task_data: Any, data: str | None) -> None:
    """Warn when the evaluation set's ids hold many <unk> (input the tokenizer does not know):
    the loss is then measured mostly on a token the model rarely saw. Counted over the ids the
    data builder encoded (all of the set), never the class labels of a classifier."""
    unk = getattr(task_data.tokenizer, "unk_id", None)
    if unk is None:
        return
    if isinstance(task_data, LMData):
        ids = [np.asarray(task_data.val.tokens)]
    elif isinstance(task_data, PairData):
        ids = [np.asarray(x) for pair in task_data.val_ids for x in pair]
    else:  # LabelData: (token ids, label)
        ids = [np.asarray(tokens) for tokens, _ in task_data.val_ids]
    total = sum(x.size for x in ids)
    unknown = sum(int((x == unk).sum()) for x in ids)
    if total and unknown / total >= UNKNOWN_SHARE:
        where = repr(data) if data is not None else "the evaluation data"
        warnings.warn(
            f"{unknown / total:.0%} of the tokens of {where} are <unk> (characters the model's "
            "tokenizer does not know), so these metrics say little about the model; evaluate "
            "text written in the alphabet it was trained on",
            UserWarning,
            stacklevel=3,
        )


def _evaluate_masked_lm(ckpt, data, batch_size, max_batches) -> CheckpointEvaluation:
    """Masked-LM loss of a text file (``attnlab.train.masked_lm_eval``)."""
    if data is None:
        raise DataError(
            f"{str(ckpt.path)!r} holds a masked language model (BERT); give the text file to "
            "score as data",
            fields=("text",),
        )
    try:
        text = read_text(data)
        metrics = masked_lm_metrics(
            ckpt.model, ckpt.tokenizer, text, batch_size=batch_size or 8, max_batches=max_batches
        )
    except (OSError, ValueError) as err:
        raise DataError(f"cannot evaluate {data!r}: {err}") from None
    summary = f"{metrics['val_masked_tokens']} masked tokens (15%) of {data}"
    return CheckpointEvaluation(EvalResult(metrics, []), ckpt.path, ckpt.step, summary)
