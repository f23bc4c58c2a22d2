"""Checkpoints: safetensors weights, JSON config/tokenizer/state, written atomically, kept k+best.

A checkpoint is a directory that loads on its own, with no pickle anywhere::

    run_dir/checkpoints/
        latest                      text file naming the newest good checkpoint, e.g. step_00001000
        best                        text file naming the checkpoint with the best metric (if any)
        step_00001000/
            config.json             format version, model kind, step, ModelConfig.to_dict()
            model.safetensors       the state dict; tied weights stored once (see below)
            tokenizer.json          Tokenizer.to_dict(), reloaded with attnlab.data.load_tokenizer
            labels.json             class names (classifiers only)
            train_state/
                optimizer.safetensors   optimizer buffers (attnlab.checkpoint.state)
                state.json              step, scheduler, RNG states, train config, metrics, extra
            manifest.json           size and CRC-32 of every file above; written last

Crash safety. A checkpoint is assembled in ``checkpoints/.tmp-step_...`` (every file fsynced) and
only then renamed to ``step_...`` in one atomic ``os.replace``; the ``latest`` pointer is updated
afterwards with an atomic write. So ``kill -9`` at any instant leaves ``latest`` naming a complete
directory; a stray ``.tmp-*`` is never read and is removed by the next save. Old checkpoints are
renamed to ``.del-*`` before being deleted, so a half-deleted directory never looks complete.

Tied weights. ``lm_head.weight is tok_emb.weight`` appears twice in ``state_dict()``; the
safetensors convention (``save_file`` refuses shared memory) is to store it once. Each storage is
saved under its first name and the other names are listed in the file's metadata
(``attnlab.aliases``); ``build_model`` re-ties the fresh model and loading fills the aliases.

Code. This module writes checkpoints; :mod:`attnlab.checkpoint.load` reads them back
(verifying every file against the manifest) and :mod:`attnlab.checkpoint.rundir` keeps the run
directory (pointers, listing, retention, cleanup after crashes). Every public name of the three is
importable from :mod:`attnlab.checkpoint`.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import warnings
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.checkpoint.atomic import (
    atomic_write_text,
    ensure_writable_dir,
    fsync_dir,
    storage_errors,
    write_synced,
)
from attnlab.checkpoint.load import _check_vocab, refuse_non_finite
from attnlab.checkpoint.rundir import (
    BEST,
    CHECKPOINTS,
    CONFIG,
    FORMAT,
    FORMAT_VERSION,
    LABELS,
    LATEST,
    MANIFEST,
    MODEL,
    OPTIMIZER,
    STATE,
    TOKENIZER,
    TRAIN_STATE,
    _cleanup,
    _current_best,
    _is_ours,
    _place_dir,
    _retain,
)
from attnlab.checkpoint.state import (
    capture_rng_state,
    optimizer_state_to_tensors,
    scheduler_state_to_json,
    write_safetensors,
)
from attnlab.config import ModelConfig
from attnlab.errors import CheckpointError
from attnlab.models import build_model

__all__ = [
    "model_tensors",
    "save_checkpoint",
    "save_inference_checkpoint",
    "unwrap_model",
]


# Model tensors (tied weights saved once) -----------------------------------------------------
def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DistributedDataParallel and/or torch.compile wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def model_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """``model.state_dict()`` without duplicates: (tensors, aliases {dropped name: kept name})."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    owner: dict[tuple, str] = {}
    for name, t in unwrap_model(model).state_dict().items():
        ident = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride(), t.dtype)
        if t.numel() and ident in owner:
            aliases[name] = owner[ident]
            continue
        owner[ident] = name
        tensors[name] = t
    return tensors, aliases


def check_model_fits_config(model: nn.Module, config: ModelConfig) -> None:
    """A ValueError unless ``model``'s tensors are those ``build_model(config)`` makes (names and
    shapes, compared with a copy built on the meta device): a checkpoint whose config.json
    describes another model could never be loaded back."""
    with torch.device("meta"):
        expected = {
            k: tuple(t.shape) for k, t in build_model(config, fast=False).state_dict().items()
        }
    tensors, aliases = model_tensors(model)
    got = {k: tuple(t.shape) for k, t in tensors.items()}
    got.update({alias: got[source] for alias, source in aliases.items() if source in got})
    if got != expected:
        wrong = sorted(set(got) ^ set(expected)) or [k for k in got if got[k] != expected[k]]
        raise ValueError(
            f"config describes a {config.kind!r} model that does not match the model's tensors "
            f"(first differences: {', '.join(wrong[:4])}); save with the ModelConfig the model "
            f"was built from"
        )


# Writing -------------------------------------------------------------------------------------
def _write_checkpoint_files(
    tmp: Path,
    *,
    model: nn.Module,
    config: ModelConfig,
    tokenizer: Any | None,
    labels: Any | None,
    step: int,
    train_state: dict[str, Any] | None = None,
    opt_tensors: dict[str, Tensor] | None = None,
    manifest_extra: dict[str, Any] | None = None,
) -> None:
    """Write every file of a checkpoint into the (new, empty) directory ``tmp``, fsynced.

    Tensors stream from memory to disk (:func:`~attnlab.checkpoint.state.write_safetensors`),
    not via ``safetensors.torch.save_file``, which neither avoids a full copy nor reports a full
    disk.
    """
    entries: dict[str, dict[str, Any]] = {}

    def put(name: str, data: bytes) -> None:
        write_synced(tmp / name, data)
        entries[name] = {"bytes": len(data), "crc32": zlib.crc32(data)}

    tensors, aliases = model_tensors(model)
    meta = {"format": "pt", "attnlab.aliases": json.dumps(aliases)}
    entries[MODEL] = write_safetensors(tmp / MODEL, tensors, meta)
    header = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": config.kind}
    put(CONFIG, _json_bytes({**header, "step": step, "model": config.to_dict()}))
    if tokenizer is not None:
        put(TOKENIZER, _json_bytes(tokenizer.to_dict()))
    if labels is not None:
        put(LABELS, _json_bytes(labels.to_dict()))
    if train_state is not None:
        (tmp / TRAIN_STATE).mkdir()
        if opt_tensors is not None:
            entries[OPTIMIZER] = write_safetensors(tmp / OPTIMIZER, opt_tensors, {"format": "pt"})
        put(STATE, _json_bytes(train_state))
    manifest = {**header, "step": step, **(manifest_extra or {}), "files": entries}
    write_synced(tmp / MANIFEST, _json_bytes(manifest))
    if train_state is not None:
        fsync_dir(tmp / TRAIN_STATE)
    fsync_dir(tmp)


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def save_checkpoint(
    run_dir: str | os.PathLike,
    *,
    model: nn.Module,
    config: ModelConfig,
    tokenizer: Any | None = None,
    step: int,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
    scheduler: Any | None = None,
    extra_state: dict[str, Any] | None = None,
    train_config: dict[str, Any] | None = None,
    keep_last: int = 3,
    metric: float | None = None,
    higher_is_better: bool = False,
    labels: Any | None = None,
) -> Path:
    """Write ``run_dir/checkpoints/step_{step:08d}/`` atomically and return its path.

    Captures the RNG states now (``extra_state["rng"]`` overrides, e.g. gathered per rank); the
    caller restores them last on resume. ``extra_state`` (JSON: epoch, data position, ...) comes
    back from :func:`~attnlab.checkpoint.load.restore_training`. A model holding a NaN or
    infinite weight is refused (no loader would read it back). Afterwards ``latest`` names this
    checkpoint, ``best`` the one with the best ``metric`` so far, and all but the newest
    ``keep_last`` (0 = keep all), the latest and the best are deleted.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    if not isinstance(keep_last, int) or keep_last < 0:
        raise ValueError(f"keep_last must be an int >= 0 (0 keeps all), got {keep_last!r}")
    extra = dict(extra_state or {})
    reserved = sorted({"step", "best_metric"} & set(extra))
    if reserved:
        raise ValueError(f"extra_state keys {reserved} are reserved; they are saved by themselves")
    check_model_fits_config(model, config)
    refuse_non_finite(
        model,
        f"step {step} is not saved (no command could load it); the earlier checkpoints are kept: "
        "resume from the latest one, with a lower learning rate if training diverged",
    )
    rng = extra.pop("rng", None) or capture_rng_state()
    root = ensure_writable_dir(Path(run_dir) / CHECKPOINTS)
    name = f"step_{step:08d}"
    _check_vocab(config, tokenizer, labels, str(root / name))
    if metric is not None:
        metric = float(metric)
    best_name, best_metric = _current_best(root)
    is_best = (
        metric is not None
        and not math.isnan(metric)
        and (
            best_metric is None
            or (metric > best_metric if higher_is_better else metric < best_metric)
        )
    )
    opt_tensors, opt_meta = optimizer_state_to_tensors(optimizer) if optimizer else (None, None)
    train_state = {
        "step": step,
        "metric": metric,
        "higher_is_better": higher_is_better,
        "best_metric": metric if is_best else best_metric,
        "optimizer": opt_meta,
        "scheduler": scheduler_state_to_json(scheduler),
        "rng": rng,
        "train_config": train_config,
        "extra": extra,
    }
    try:  # fail before touching the disk if extra_state is not plain JSON
        _json_bytes(train_state)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"extra_state and train_config must hold only JSON values (numbers, strings, "
            f"lists, dicts): {err}"
        ) from None
    final = root / name
    with storage_errors(final, "save the checkpoint"):
        _write_via(
            final,
            model=model,
            config=config,
            tokenizer=tokenizer,
            labels=labels,
            step=step,
            train_state=train_state,
            opt_tensors=opt_tensors,
            manifest_extra={"metric": metric, "higher_is_better": higher_is_better},
        )
        atomic_write_text(root / LATEST, name + "\n")
        if is_best:
            atomic_write_text(root / BEST, name + "\n")
            best_name = name
    try:  # housekeeping: the checkpoint is safe already, so a failure here only warns
        _retain(root, keep_last, protect={name, best_name})
        _cleanup(root)
    except OSError as err:
        warnings.warn(f"could not remove old checkpoints in {root}: {err}", stacklevel=2)
    return final


def save_inference_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    config: ModelConfig,
    tokenizer: Any | None = None,
    labels: Any | None = None,
    step: int = 0,
) -> Path:
    """Write a standalone inference checkpoint (no train_state) to ``path``, atomically.

    An existing attnlab checkpoint at ``path`` is replaced; any other existing directory is left
    alone with an error.
    """
    final = Path(path)
    if final.exists() and not _is_ours(final) and (not final.is_dir() or any(final.iterdir())):
        raise CheckpointError(
            f"{str(final)!r} exists and is not an attnlab checkpoint; choose a new or empty "
            f"directory so nothing of yours is overwritten"
        )
    _check_vocab(config, tokenizer, labels, str(final))
    refuse_non_finite(model, f"{str(final)!r} is not written (no command could load it)")
    ensure_writable_dir(final.parent)
    with storage_errors(final, "export the model"):
        _write_via(
            final,
            replace_empty=True,
            model=model,
            config=config,
            tokenizer=tokenizer,
            labels=labels,
            step=step,
        )
    return final


def _write_via(final: Path, *, replace_empty: bool = False, **files: Any) -> None:
    """Write the checkpoint files into a fresh sibling directory ``.tmp-NAME-PID-HEX``, then move
    it to ``final`` (an empty directory there first removed, with ``replace_empty``); on any
    failure the temporary directory is removed and ``final`` is left as it was."""
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}-{secrets.token_hex(3)}")
    try:
        tmp.mkdir()
        _write_checkpoint_files(tmp, **files)
        if replace_empty and final.is_dir() and not any(final.iterdir()):
            final.rmdir()
        _place_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
