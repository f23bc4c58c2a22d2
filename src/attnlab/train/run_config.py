"""Run settings: the frozen TrainConfig, RunConfig = model + train, and TOML files for both.

A run file has two tables that map one-to-one onto the dataclasses (no nesting, no indirection)::

    [model]                       # attnlab.config.ModelConfig fields
    kind = "encoder_decoder"
    d_model = 128

    [train]                       # TrainConfig fields below
    task = "seq2seq"
    data = "dates"
    steps = 3000

Unknown keys are an error that lists the valid ones; bad values are an error naming the field, the
value and the allowed range. Command-line flags override file values (:func:`merge_overrides`), and
:func:`dump_toml` writes a file that loads back to the same RunConfig (saved with every run).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.config import ModelConfig
from attnlab.data import TASKS
from attnlab.errors import ConfigError, ConfigValueError, blamed_fields

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


_CHOICES: dict[str, tuple[str, ...]] = {
    "task": ("lm", "seq2seq", "classify"),
    "tokenizer": ("char", "byte", "bpe"),
    "optimizer": ("adamw", "muon"),
    "lr_schedule": ("cosine", "linear", "constant"),
    "dtype": ("fp32", "bf16"),
    "matmul_precision": ("high", "highest"),
}
_POSITIVE = (
    "n_train",
    "n_val",
    "bpe_vocab_size",
    "context_len",
    "batch_size",
    "grad_accum",
    "steps",
    "eval_batches",
    "log_every",
)
_NON_NEGATIVE = (
    "length_buckets",
    "warmup_steps",
    "eval_every",
    "save_every",
    "keep_last",
    "seed",
    "threads",
)
_LOWER_IS_BETTER = ("loss", "ppl", "perplexity", "error", "cer", "wer")


@dataclass(frozen=True)
class TrainConfig:
    """How to train: task and data, optimisation, evaluation, checkpoints, runtime."""

    # Task and data.
    task: str = "seq2seq"  # "lm" | "seq2seq" | "classify"
    data: str = "dates"  # a file/directory path, or a built-in task name (attnlab.data.TASKS)
    val_data: str | None = None  # a separate validation file; default: split off val_fraction
    val_fraction: float = 0.05  # share of the data held out for validation
    n_train: int = 20000  # generated tasks: training examples
    n_val: int = 500  # generated tasks: validation examples
    tokenizer: str = "char"  # "char" | "byte" | "bpe" (trained on the training data)
    bpe_vocab_size: int = 4096
    context_len: int = 128  # LM: tokens per training window (T)
    max_src_len: int | None = None  # seq2seq/classify: longest source; default model.max_len
    max_tgt_len: int | None = None  # seq2seq: longest target; default model.max_len
    length_buckets: int = 0  # seq2seq/classify: sort each run of this many batches by length
    # Optimisation.
    batch_size: int = 64  # sequences per micro-batch (per process)
    grad_accum: int = 1  # micro-batches per optimizer step
    steps: int = 2000  # optimizer steps
    optimizer: str = "adamw"  # "adamw" | "muon" (Muon for 2-D hidden weights, AdamW for the rest)
    lr: float = 1e-3  # peak learning rate (AdamW)
    min_lr: float = 1e-4  # floor of the decay
    lr_schedule: str = "cosine"  # after linear warm-up: "cosine" | "linear" | "constant"
    warmup_steps: int = 100
    weight_decay: float = 0.1  # decoupled; never on norms, biases and embeddings
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8  # AdamW epsilon
    muon_lr: float = 0.02  # Muon's learning rate for 2-D hidden weights
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    label_smoothing: float = 0.0
    # Evaluation and checkpoints.
    eval_every: int = 250  # steps between evaluations; 0 = only at the end
    eval_batches: int = 20  # validation batches per evaluation
    save_every: int = 500  # steps between checkpoints; 0 = only at the end
    keep_last: int = 3  # newest checkpoints kept (plus the best); 0 keeps all
    best_metric: str = "val_loss"  # metric that picks the "best" checkpoint
    # Runtime.
    seed: int = 1337
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N" | "mps"
    dtype: str = "fp32"  # "fp32" | "bf16" (autocast where the device supports it)
    compile: bool = False  # torch.compile the model
    # CUDA fp32 matmuls: "high" = TF32 tensor cores (10-bit mantissa products, fp32 sums; what
    # every GPU trainer uses), "highest" = full fp32. The CPU is never changed.
    matmul_precision: str = "high"
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    log_every: int = 10  # steps between metric lines in metrics.jsonl
    progress: bool = True  # show a progress bar
    tensorboard: bool = False  # also write TensorBoard event files
    wandb: bool = False  # also log to Weights & Biases (project: $WANDB_PROJECT or "attnlab")
    out: str = "runs/default"  # run directory: checkpoints, metrics, plots
    # Fine-tuning (attnlab.train.finetune).
    init_from: str | None = None  # start from this model: a directory or a Hugging Face hub id
    init_revision: str | None = None  # the hub id's branch, tag or commit (default: main)
    freeze: str = ""  # "embeddings", "N" (the first N layers) or both: "embeddings,2"

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("data", "val_data", "out", "init_from"):  # paths (init_from: or a hub id)
            value = getattr(self, name)
            if isinstance(value, str) and "\x00" in value:  # no file system takes one
                _bad(name, value, "contains a NUL character ('\\x00'): remove it from the path")
        for name in ("data", "val_data", "out"):  # ~ and $VARS, also from a TOML file or --set
            value = getattr(self, name)
            if isinstance(value, str) and ("~" in value or "$" in value):
                object.__setattr__(self, name, os.path.expandvars(os.path.expanduser(value)))
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                _bad(name, getattr(self, name), f"must be one of {list(choices)}")
        for name in _POSITIVE:
            if getattr(self, name) <= 0:
                _bad(name, getattr(self, name), "must be > 0")
        for name in _NON_NEGATIVE:
            if getattr(self, name) < 0:
                _bad(name, getattr(self, name), "must be >= 0")
        for name in ("max_src_len", "max_tgt_len"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                _bad(name, getattr(self, name), "must be > 0 (or omitted for model.max_len)")
        for name in ("lr", "eps", "muon_lr"):
            if not getattr(self, name) > 0 or math.isinf(getattr(self, name)):
                _bad(name, getattr(self, name), "must be a finite number > 0")
        for name in ("weight_decay", "grad_clip"):
            if not getattr(self, name) >= 0 or math.isinf(getattr(self, name)):
                _bad(name, getattr(self, name), "must be a finite number >= 0")
        if not 0 <= self.min_lr <= self.lr:
            _bad("min_lr", self.min_lr, f"must be between 0 and lr={self.lr}")
        if not all(0 <= b < 1 for b in self.betas):
            _bad("betas", list(self.betas), "must be two numbers in [0, 1), e.g. [0.9, 0.95]")
        if not 0 <= self.label_smoothing < 1:
            _bad("label_smoothing", self.label_smoothing, "must be in [0, 1)")
        if not 0 < self.val_fraction < 1:
            _bad("val_fraction", self.val_fraction, "must be in (0, 1), e.g. 0.05")
        if self.warmup_steps > self.steps:
            _bad(
                "warmup_steps",
                self.warmup_steps,
                f"must not exceed steps={self.steps}; lower warmup_steps (e.g. to "
                f"{self.steps // 10}) or raise steps",
                also=("steps",),
            )
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device):
            _bad("device", self.device, "must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
        for name in ("data", "out", "best_metric"):
            if not getattr(self, name).strip():
                _bad(name, getattr(self, name), "must not be empty")
        if self.freeze:
            from attnlab.train.finetune import parse_freeze  # finetune imports this module

            parse_freeze(self.freeze)
        metrics = metric_names(self.task, self.data)
        if self.best_metric not in metrics:
            raise ConfigValueError(
                f"train.best_metric={self.best_metric!r} is not a metric of task {self.task!r}, "
                f"so no best checkpoint would ever be chosen; use one of {list(metrics)}, e.g. "
                f"best_metric={metrics[-1]!r}",
                fields=("best_metric",),
            )

    @property
    def higher_is_better(self) -> bool:
        """Whether a larger ``best_metric`` is better (accuracy, BLEU) or worse (loss, ppl)."""
        return not any(word in self.best_metric.lower() for word in _LOWER_IS_BETTER)

    @property
    def effective_batch_size(self) -> int:
        """Sequences per optimizer step in one process: batch_size * grad_accum."""
        return self.batch_size * self.grad_accum

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return _build(cls, data, "train")

    def replace(self, **changes: Any) -> TrainConfig:
        return _build(TrainConfig, {**self.to_dict(), **changes}, "train")


def metric_names(task: str, data: str) -> tuple[str, ...]:
    """The validation metrics training records for ``task`` (attnlab.train.evaluate)."""
    if task == "classify":
        return ("val_loss", "val_accuracy")
    if task == "lm":
        return ("val_loss", "val_ppl")
    text = () if data in TASKS else ("val_bleu", "val_chrf")  # file pairs get BLEU and chrF
    return ("val_loss", "val_ppl", *text, "val_exact_match")


def _bad(name: str, value: Any, rule: str, also: tuple[str, ...] = ()) -> None:
    raise ConfigValueError(f"train.{name}={value!r} {rule}", fields=(name, *also))


# Field types, shared by TrainConfig and ModelConfig ------------------------------------------
def check_types(obj: Any) -> None:
    """Check (and normalise: int -> float, list -> tuple) every field of a frozen dataclass."""
    hints = typing.get_type_hints(type(obj))
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        fixed = _coerce(type(obj).__name__, field.name, value, hints[field.name])
        if fixed is not value:
            object.__setattr__(obj, field.name, fixed)


def _coerce(owner: str, name: str, value: Any, hint: Any) -> Any:
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        args = typing.get_args(hint)
    where = f"{owner}.{name}={value!r} ({type(value).__name__})"
    fields = (name.partition("[")[0],)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigValueError(f"{where} must be true or false", fields=fields)
    elif hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigValueError(
                f"{where} must be a whole number (in TOML: no quotes, no dot)", fields=fields
            )
    elif hint is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigValueError(
                f"{where} must be a number (in TOML: no quotes, e.g. 3e-4)", fields=fields
            )
        return value if isinstance(value, float) else float(value)
    elif hint is str:
        if not isinstance(value, str):
            raise ConfigValueError(
                f'{where} must be a string (in TOML: in quotes, e.g. "{value}")', fields=fields
            )
    elif typing.get_origin(hint) is tuple:
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise ConfigValueError(f"{where} must be a list of {len(args)} values", fields=fields)
        items = tuple(
            _coerce(owner, f"{name}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args))
        )
        return value if items == value and isinstance(value, tuple) else items
    return value


def _build(cls: type, data: Any, table: str) -> Any:
    """``cls(**data)`` with errors that name the table, unknown keys and the valid ones."""
    if not isinstance(data, dict):
        raise ConfigValueError(f"[{table}] must be a table of key = value settings")
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in valid]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k.replace("-", "_"), valid, n=1)
            hints.append(f"{k!r} (did you mean {close[0]!r}?)" if close else repr(k))
        raise ConfigValueError(
            f"unknown [{table}] key(s) {', '.join(hints)}; valid {cls.__name__} keys are: "
            f"{', '.join(valid)}"
        )
    if cls is ModelConfig:  # ModelConfig checks ranges; give it well-typed values first
        field_types = typing.get_type_hints(ModelConfig)
        data = {k: _coerce("ModelConfig", k, v, field_types[k]) for k, v in data.items()}
    try:
        return cls(**data)
    except (ValueError, TypeError) as err:
        if isinstance(err, ConfigError) and cls is not ModelConfig:  # names its table already
            raise
        raise ConfigValueError(f"[{table}] {err}", fields=blamed_fields(err)) from None


# RunConfig and TOML --------------------------------------------------------------------------
@dataclass(frozen=True)
class RunConfig:
    """Everything a training run needs: the model and how to train it."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelConfig) or not isinstance(self.train, TrainConfig):
            raise TypeError("RunConfig needs a ModelConfig and a TrainConfig")

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), "train": self.train.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> RunConfig:
        if not isinstance(data, dict):
            raise ConfigValueError(f"{source}: expected [model] and [train] tables")
        unknown = [k for k in data if k not in ("model", "train")]
        if unknown:
            raise ConfigValueError(
                f"{source}: unknown table(s) or key(s) {unknown} at the top level; a run config "
                f"has only the tables [model] and [train]"
            )
        try:
            model = _build(ModelConfig, data.get("model", {}), "model")
            train = _build(TrainConfig, data.get("train", {}), "train")
        except ConfigError as err:
            raise ConfigValueError(f"{source}: {err}", fields=blamed_fields(err)) from None
        return cls(model, train)


def load_toml(path: str | os.PathLike) -> RunConfig:
    """Read a run config file with tables [model] and [train]."""
    p = Path(path)
    if p.is_dir():
        raise ConfigValueError(
            f"config file {str(p)!r} is a directory; give the TOML file itself, e.g. "
            f"{str(p / 'config.toml')!r}"
        )
    if not p.is_file():
        raise ConfigValueError(
            f"config file {str(p)!r} does not exist; check the path, or write one with "
            f"`attnlab train ... --dump-config {p}`"
        )
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigValueError(
            f"config file {str(p)!r} is not UTF-8 text; save it as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigValueError(
            f"config file {str(p)!r} is not valid TOML: {err}; fix that line (strings need "
            f'quotes, e.g. task = "lm"; lists use brackets, e.g. betas = [0.9, 0.95])'
        ) from None
    return RunConfig.from_dict(data, source=str(p))


def dump_toml(run_config: RunConfig) -> str:
    """The TOML text of ``run_config``; ``load_toml`` of it gives back an equal RunConfig."""
    lines = ["# attnlab run config (load with: attnlab train --config FILE)"]
    for table, obj in (("model", run_config.model), ("train", run_config.train)):
        lines += ["", f"[{table}]"]
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name)
            if value is not None:  # None means "the default"; TOML has no null
                lines.append(f"{field.name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(_toml_char(c) for c in value) + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as a TOML value")


def _toml_char(c: str) -> str:
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    if c in escapes:
        return escapes[c]
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\u{ord(c):04x}"
    return c


def merge_overrides(run_config: RunConfig, flags: dict[str, Any]) -> RunConfig:
    """Apply command-line values over a RunConfig; ``None`` values mean "flag not given".

    Keys are field names of either table (``lr``, ``d-model``), optionally qualified
    (``model.dropout``, ``train.seed``). String values for non-string fields are parsed as TOML
    values, so ``{"betas": "[0.9, 0.99]"}`` and ``{"lr": "3e-4"}`` work.
    """
    tables = {"model": run_config.model.to_dict(), "train": run_config.train.to_dict()}
    hints = {
        "model": typing.get_type_hints(ModelConfig),
        "train": typing.get_type_hints(TrainConfig),
    }
    for key, value in flags.items():
        if value is None:
            continue
        name = key.lstrip("-").replace("-", "_")
        table, _, field = name.rpartition(".")
        candidates = [table] if table else ["train", "model"]
        found = [t for t in candidates if t in tables and field in tables[t]]
        if not found:
            valid = sorted(set(tables["model"]) | set(tables["train"]))
            close = difflib.get_close_matches(field, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigValueError(
                f"unknown setting {key!r}{hint}; valid settings are: {', '.join(valid)}"
            )
        t = found[0]
        if isinstance(value, str) and hints[t][field] not in (str, str | None):
            value = _parse_value(key, value)
        tables[t][field] = value
    return RunConfig.from_dict(tables, source="command-line flags")


def _parse_value(key: str, text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        raise ConfigValueError(
            f"cannot read {key}={text!r} as a value; write numbers like 3e-4, booleans as "
            f"true/false and lists like [0.9, 0.95]"
        ) from None
