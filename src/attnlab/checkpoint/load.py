"""Loading checkpoints back: the model (tied weights re-tied), tokenizer, labels, training state.

Every file read is checked against the sizes and CRC-32 checksums in ``manifest.json``; any problem
is a CheckpointError naming the file and what to do about it. The on-disk layout is described in
:mod:`attnlab.checkpoint.save`, which writes it.
"""

from __future__ import annotations

import json
import os
import warnings
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import safetensors
import torch
from torch import Tensor, nn

from attnlab.checkpoint.rundir import (
    CONFIG,
    FORMAT,
    FORMAT_VERSION,
    LABELS,
    MANIFEST,
    MODEL,
    OPTIMIZER,
    STATE,
    TOKENIZER,
    _resolve,
    _step_of,
    damage_of,
    list_checkpoints,
    newer_than,
)
from attnlab.checkpoint.state import optimizer_state_from_tensors, scheduler_state_from_json
from attnlab.config import ModelConfig
from attnlab.data import LabelSet, load_tokenizer
from attnlab.errors import CheckpointError, UserError
from attnlab.models import build_model


class WrongKindError(CheckpointError):
    """The checkpoint holds another kind of model than the caller needs."""


class Checkpoint(NamedTuple):
    """A loaded checkpoint. The model is in eval mode; ``train_state`` is None for exports."""

    model: nn.Module
    config: ModelConfig
    tokenizer: Any | None  # attnlab.data.Tokenizer
    train_state: dict[str, Any] | None
    step: int
    path: Path
    labels: Any | None = None  # attnlab.data.LabelSet, classifiers only


# Checks --------------------------------------------------------------------------------------
def _load_state_dict(model: nn.Module, tensors: dict[str, Tensor], where: Path) -> None:
    """Strict load with a message naming the first mismatching keys."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in tensors]
    unexpected = [k for k in tensors if k not in expected]
    shapes = [
        f"{k}: file {tuple(tensors[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in tensors and tensors[k].shape != v.shape
    ]
    problems = [
        f"{label} {_few(items)}"
        for label, items in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatches", shapes),
        )
        if items
    ]
    if problems:
        raise CheckpointError(
            f"{where} does not match the model its config.json describes ({'; '.join(problems)}); "
            f"the files come from different runs or were edited: use a checkpoint directory "
            f"exactly as attnlab saved it"
        )
    model.load_state_dict(tensors, strict=True)


OTHER_STEP = "use another checkpoint (see the other step_* directories)"
OTHER_COPY = "export or download the model again"


def check_finite(tensors: dict[str, Tensor], where: Path, fix: str = OTHER_STEP) -> None:
    """A CheckpointError naming the weight tensors that hold NaN or infinite values.

    Training stops before saving a diverged model, so such weights mean a damaged or edited
    file; loaded anyway they make sampling fail and every metric NaN.
    """
    bad = non_finite(tensors)
    if bad:
        raise CheckpointError(
            f"{str(where)!r} holds non-finite weights (NaN or inf) in {_few(bad)}; the file is "
            f"damaged or was edited: {fix}"
        )


def non_finite(tensors: dict[str, Tensor]) -> list[str]:
    """The names of the floating-point tensors holding a NaN or an infinite value."""
    return [k for k, t in tensors.items() if t.is_floating_point() and not bool(t.isfinite().all())]


def refuse_non_finite(model: nn.Module, consequence: str) -> None:
    """The loaders refuse weights holding NaN or inf (:func:`check_finite`), so no writer writes
    them: a CheckpointError naming the tensors and ``consequence`` (what is not written)."""
    bad = non_finite(dict(model.state_dict()))
    if bad:
        raise CheckpointError(
            f"the model holds non-finite weights (NaN or inf) in {_few(bad)}, so {consequence}"
        )


def _few(items: Sequence[str], n: int = 4) -> str:
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def _check_vocab(config: ModelConfig, tokenizer: Any, labels: Any, where: str) -> None:
    if tokenizer is not None and tokenizer.vocab_size != config.vocab_size:
        raise CheckpointError(
            f"checkpoint and tokenizer disagree at {where}: the tokenizer has "
            f"{tokenizer.vocab_size} tokens but the model's vocab_size is {config.vocab_size}; "
            f"build the model with vocab_size=tokenizer.vocab_size and keep the two together"
        )
    if labels is not None and config.n_classes is not None and len(labels) != config.n_classes:
        raise CheckpointError(
            f"checkpoint and labels disagree at {where}: {len(labels)} label names but the "
            f"model has n_classes={config.n_classes}; keep the LabelSet the model was built with"
        )


# Reading and verifying files -----------------------------------------------------------------
def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is missing; the checkpoint is incomplete, use "
            f"another one (see the other step_* directories) or re-save it"
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is not valid JSON ({err}); it was truncated or "
            f"edited, use another checkpoint or restore the file"
        ) from None


def _verify(ckpt: Path, manifest: dict[str, Any] | None, name: str) -> None:
    """Compare a file's size and CRC-32 with the manifest written at save time."""
    entry = (manifest or {}).get("files", {}).get(name)
    path = ckpt / name
    if path.is_dir():
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is a directory, not a file; the checkpoint is "
            f"damaged, use another one (see the other step_* directories)"
        )
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is missing; the checkpoint is incomplete, use "
            f"another one (see the other step_* directories)"
        )
    if not isinstance(entry, dict):
        return
    size = path.stat().st_size
    if size != entry.get("bytes"):
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is truncated or damaged: {size} bytes on disk, "
            f"{entry['bytes']} when saved; use another checkpoint or copy the file again"
        )
    crc = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            crc = zlib.crc32(chunk, crc)
    if crc != entry.get("crc32"):
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is corrupt: its CRC-32 differs from the one recorded "
            f"at save time in manifest.json; use another checkpoint or copy the file again"
        )


def _read_safetensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    try:
        with safetensors.safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            return {k: f.get_tensor(k) for k in f.keys()}, meta  # noqa: SIM118
    except (safetensors.SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(
            f"{str(path)!r} is not a readable safetensors file ({err}); it is truncated or "
            f"corrupt, use another checkpoint (see the other step_* directories)"
        ) from None


# Loading -------------------------------------------------------------------------------------
def read_config(path: str | os.PathLike, expect_kind: str | Sequence[str] | None = None):
    """The ModelConfig of a checkpoint (run dir or checkpoint dir) without loading weights."""
    ckpt = _resolve(path)
    return _read_config(ckpt, expect_kind)[0]


def _read_config(ckpt: Path, expect_kind: str | Sequence[str] | None) -> tuple[ModelConfig, dict]:
    data = _read_json(ckpt / CONFIG)
    where = str(ckpt / CONFIG)
    if not isinstance(data, dict) or data.get("format") != FORMAT or "model" not in data:
        raise CheckpointError(
            f"{where!r} is not an attnlab checkpoint config (no format={FORMAT!r}); for Hugging "
            f"Face weights use the interop import instead"
        )
    if data.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(
            f"{where!r} uses checkpoint format {data['format_version']}, newer than this attnlab "
            f"reads ({FORMAT_VERSION}); upgrade attnlab"
        )
    kind = data.get("kind")
    if expect_kind is not None:
        wanted = (expect_kind,) if isinstance(expect_kind, str) else tuple(expect_kind)
        if kind not in wanted:
            raise WrongKindError(
                f"the checkpoint at {str(ckpt)!r} holds a {kind!r} model but this needs "
                f"{' or '.join(repr(k) for k in wanted)}; pass a checkpoint trained for that task"
            )
    try:
        return ModelConfig.from_dict(data["model"]), data
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{where!r} holds an invalid model config: {err}") from None


def load_checkpoint(
    path: str | os.PathLike,
    *,
    map_location: str | torch.device = "cpu",
    expect_kind: str | Sequence[str] | None = None,
    verify: bool = True,
    fallback: bool = True,
) -> Checkpoint:
    """Load an attnlab checkpoint directory, or the latest checkpoint of a run directory.

    Builds the model from config.json, loads the weights (re-tying shared ones), the tokenizer
    and labels if saved, and ``train_state/state.json``. ``verify`` checks every file read
    against the sizes and CRC-32 checksums in manifest.json. Any problem is a CheckpointError
    naming the file.

    Given a run directory (not one checkpoint), a latest checkpoint that fails these checks is
    skipped with a warning naming it and why, and the newest one that passes is loaded instead
    (``fallback``); nothing on disk changes. Other formats (a single-file safetensors export, a
    Hugging Face directory or hub id) load one floor up, through
    :func:`attnlab.interop.load_checkpoint`, which reads these too.
    """
    if _is_hf_dir(Path(path)):
        raise CheckpointError(
            f"{str(path)!r} is a Hugging Face model directory, not an attnlab checkpoint; load it "
            "with attnlab.interop.load_checkpoint"
        )
    ckpt = _resolve(path)
    whole_run = ckpt != Path(path)  # a run directory (or a pointer) rather than one checkpoint
    if whole_run and fallback:
        report_unfinished(ckpt)
    for _ in range(3):  # a save may retire the checkpoint while we read it (--keep-last)
        try:
            return _load_one(ckpt, map_location, expect_kind, verify)
        except CheckpointError as err:
            error = err
        if not whole_run or ckpt.is_dir() or (newer := _resolve(path)) == ckpt:
            break
        ckpt = newer  # it was moved away, not damaged: read the one latest names now
    if not fallback or isinstance(error, WrongKindError) or not whole_run:
        raise error  # a wrong kind is no damage: the other checkpoints of the run share it
    return load_fallback(
        ckpt, error, lambda c: _load_one(c, map_location, expect_kind, verify), "using"
    )


def _is_hf_dir(path: Path) -> bool:
    """A directory whose config.json names a ``model_type`` and no attnlab format."""
    try:
        data = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "model_type" in data and "format" not in data


def report_unfinished(ckpt: Path, announce: bool = True) -> list[Path]:
    """The step directories newer than ``ckpt`` (the one ``latest`` names), with a warning
    naming them: a save that did not finish, or a damaged checkpoint; neither is read."""
    newer = newer_than(ckpt)
    if newer and announce:
        names = ", ".join(p.name for p in newer)
        warnings.warn(
            f"{names} {'is' if len(newer) == 1 else 'are'} newer than {ckpt.name}, the "
            f"checkpoint the run's 'latest' pointer names: a save that did not finish (or a "
            f"damaged checkpoint); not used",
            stacklevel=3,
        )
    return newer


def load_fallback(
    damaged: Path, error: CheckpointError, load: Any, verb: str, announce: bool = True
) -> Any:
    """``load`` the newest other complete checkpoint of ``damaged``'s run that passes, warning
    which one and why (if ``announce``); re-raise ``error`` (with the others' problems) if none
    does."""
    step = _step_of(damaged)
    others = [
        c
        for c in reversed(list_checkpoints(damaged.parent))
        if c != damaged and (step is None or (_step_of(c) or 0) < step)
    ]
    problems = []
    for older in others:
        try:
            found = load(older)
        except CheckpointError as err:
            problems.append(f"{older.name}: {err}")
            continue
        skipped = "; ".join([f"{damaged.name}: {error}", *problems])
        if not announce:  # e.g. the other processes of a torchrun job: rank 0 says it
            return found
        warnings.warn(
            f"the latest checkpoint cannot be used ({skipped}); {verb} {older.name} (step "
            f"{_step_of(older)}) instead, the newest that verifies; nothing was deleted",
            stacklevel=3,
        )
        return found
    if problems:
        raise CheckpointError(
            f"{error} (no other checkpoint of the run verifies either: {'; '.join(problems)})"
        ) from None
    raise error


def _load_one(ckpt: Path, map_location: Any, expect_kind: Any, verify: bool) -> Checkpoint:
    """Load and check the one checkpoint directory ``ckpt`` (see :func:`load_checkpoint`)."""
    problem = damage_of(ckpt)
    if problem is not None:
        raise CheckpointError(
            f"the checkpoint {str(ckpt)!r} is incomplete: {problem}; use another checkpoint "
            f"(see the other step_* directories) or restore the file"
        )
    config, data = _read_config(ckpt, expect_kind)
    manifest = _read_json(ckpt / MANIFEST)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(
            f"{str(ckpt / MANIFEST)!r} is not a checkpoint manifest (no table of files); it was "
            f"edited or damaged, use another checkpoint (see the other step_* directories)"
        )
    listed = manifest.get("files", {}) if isinstance(manifest, dict) else {}
    names = [
        n
        for n in (MODEL, TOKENIZER, LABELS, STATE)
        if n == MODEL or (ckpt / n).exists() or n in listed  # a listed file must be there
    ]

    def verify_files() -> None:
        for name in names if verify else ():
            _verify(ckpt, manifest, name)

    with ThreadPoolExecutor(max_workers=1) as pool:  # hash the files while the model is built
        checked = pool.submit(verify_files)
        model = build_model(config)
        checked.result()
    tensors, meta = _read_safetensors(ckpt / MODEL)
    try:
        aliases = json.loads(meta.get("attnlab.aliases", "{}"))
    except ValueError:
        aliases = {}
    check_finite(tensors, ckpt / MODEL)
    for alias, source in aliases.items():
        if source in tensors:
            tensors[alias] = tensors[source]
    _load_state_dict(model, tensors, ckpt / MODEL)
    try:
        model.to(map_location).eval()
    except (RuntimeError, AssertionError, ValueError) as err:
        raise UserError(
            f"cannot place the checkpoint's model on {str(map_location)!r} ({err}); choose a "
            f"device this machine has, e.g. 'cpu'"
        ) from None
    tokenizer = labels = None
    if (ckpt / TOKENIZER).is_file():
        try:
            tokenizer = load_tokenizer(ckpt / TOKENIZER)
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{str(ckpt / TOKENIZER)!r} is not a valid tokenizer: {err}"
            ) from None
    if (ckpt / LABELS).is_file():
        try:
            labels = LabelSet.from_dict(_read_json(ckpt / LABELS))
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{str(ckpt / LABELS)!r} is not a valid label list: {err}"
            ) from None
    _check_vocab(config, tokenizer, labels, str(ckpt))
    train_state = _read_json(ckpt / STATE) if (ckpt / STATE).is_file() else None
    step = int((manifest or data).get("step", 0))
    return Checkpoint(model, config, tokenizer, train_state, step, ckpt, labels)


def check_same_model(checkpoint: Checkpoint, config: ModelConfig) -> None:
    """Raise a CheckpointError naming the fields where ``config`` differs from the checkpoint's.

    For resuming: the run's model settings must be the ones the checkpoint was trained with.
    """
    saved, wanted = checkpoint.config.to_dict(), config.to_dict()
    diffs = [
        f"{k} {saved[k]!r} (checkpoint) vs {wanted[k]!r}" for k in saved if saved[k] != wanted[k]
    ]
    if diffs:
        raise CheckpointError(
            f"the checkpoint at {str(checkpoint.path)!r} holds a different model: "
            f"{_few(diffs)}; to resume, use the checkpoint's model settings (leave the changed "
            f"[model] settings unset), or train into a new out directory",
            fields=("out",),
        )


def check_resumable(checkpoint: Checkpoint) -> None:
    """A CheckpointError unless the checkpoint holds a complete, verified training state: the
    optimizer file (size and CRC-32 as saved), the step and the random-number states."""
    state = checkpoint.train_state
    where = str(checkpoint.path)
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{where!r} has no training state (train_state/state.json): it was exported for "
            f"inference; start a new run from its weights instead of resuming"
        )
    if not state.get("optimizer"):
        raise CheckpointError(
            f"{where!r} was saved without optimizer state; it cannot resume training "
            f"bit-identically, start a new run from its weights instead"
        )
    if not isinstance(state.get("rng"), dict) or not isinstance(state.get("step"), int):
        raise CheckpointError(
            f"{str(checkpoint.path / STATE)!r} lacks the step or the random-"
            f"number states; it was edited or damaged"
        )
    manifest_path = checkpoint.path / MANIFEST
    manifest = _read_json(manifest_path) if manifest_path.is_file() else None
    _verify(checkpoint.path, manifest, OPTIMIZER)


def restore_training(
    checkpoint: Checkpoint,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
    scheduler: Any | None = None,
) -> dict[str, Any]:
    """Load optimizer and scheduler state; return ``extra_state`` plus ``"rng"`` and ``"step"``.

    Restore the RNG states last (``restore_rng_state(result["rng"])``), right before the next
    step, so nothing else consumes random numbers in between.
    """
    state = checkpoint.train_state
    if state is None:
        raise CheckpointError(
            f"{str(checkpoint.path)!r} has no training state (train_state/state.json): it was "
            f"exported for inference; start a new run from its weights instead of resuming"
        )
    if optimizer is not None:
        check_resumable(checkpoint)
        tensors, _ = _read_safetensors(checkpoint.path / OPTIMIZER)
        optimizer_state_from_tensors(optimizer, tensors, state["optimizer"])
    if scheduler is not None:
        scheduler_state_from_json(scheduler, state.get("scheduler"))
    try:
        extra = dict(state.get("extra") or {})
        return {
            **extra,
            "rng": state["rng"],
            "step": int(state["step"]),
            "best_metric": state.get("best_metric"),
        }
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"{str(checkpoint.path / STATE)!r} is malformed (no valid {err}); it was edited or "
            f"damaged, resume from another checkpoint"
        ) from None
