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
                optimizer.safetensors   optimizer buffers (attnlab.train.state)
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
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import warnings
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import safetensors
import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.errors import CheckpointError, UserError
from attnlab.train.atomic import (
    atomic_write_text,
    ensure_writable_dir,
    fsync_dir,
    storage_errors,
    write_synced,
)
from attnlab.train.state import (
    capture_rng_state,
    optimizer_state_from_tensors,
    optimizer_state_to_tensors,
    scheduler_state_from_json,
    scheduler_state_to_json,
    write_safetensors,
)

FORMAT = "attnlab-checkpoint"
FORMAT_VERSION = 1
CHECKPOINTS = "checkpoints"
CONFIG, MODEL, TOKENIZER = "config.json", "model.safetensors", "tokenizer.json"
LABELS = "labels.json"
MANIFEST, TRAIN_STATE = "manifest.json", "train_state"
OPTIMIZER, STATE = f"{TRAIN_STATE}/optimizer.safetensors", f"{TRAIN_STATE}/state.json"
LATEST, BEST = "latest", "best"
_STEP_DIR = re.compile(r"^step_(\d{8,})$")


class Checkpoint(NamedTuple):
    """A loaded checkpoint. The model is in eval mode; ``train_state`` is None for exports."""

    model: nn.Module
    config: ModelConfig
    tokenizer: Any | None  # attnlab.data.Tokenizer
    train_state: dict[str, Any] | None
    step: int
    path: Path
    labels: Any | None = None  # attnlab.data.LabelSet, classifiers only


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


def _few(items: Sequence[str], n: int = 4) -> str:
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(items[:n]) + more


# Writing -------------------------------------------------------------------------------------
def _write_checkpoint_files(
    tmp: Path,
    *,
    model: nn.Module,
    config: ModelConfig,
    tokenizer: Any | None,
    labels: Any | None,
    step: int,
    train_state: dict[str, Any] | None,
    opt_tensors: dict[str, Tensor] | None,
    manifest_extra: dict[str, Any],
) -> None:
    """Write every file of a checkpoint into the (new, empty) directory ``tmp``, fsynced.

    Tensors stream from memory to disk (:func:`~attnlab.train.state.write_safetensors`), not via
    ``safetensors.torch.save_file``, which neither avoids a full copy nor reports a full disk.
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
    manifest = {**header, "step": step, **manifest_extra, "files": entries}
    write_synced(tmp / MANIFEST, _json_bytes(manifest))
    if train_state is not None:
        fsync_dir(tmp / TRAIN_STATE)
    fsync_dir(tmp)


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


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


def _place_dir(tmp: Path, final: Path) -> None:
    """Atomically rename the finished ``tmp`` to ``final``, replacing an existing one."""
    old = final.with_name(f".old-{final.name}")
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)  # recovered by _cleanup if we die before the next line
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


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
    back from :func:`restore_training`. Afterwards ``latest`` names this checkpoint, ``best`` the
    one with the best ``metric`` so far, and all but the newest ``keep_last`` (0 = keep all),
    the latest and the best are deleted.
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
    tmp = root / f".tmp-{name}-{os.getpid()}-{secrets.token_hex(3)}"
    final = root / name
    with storage_errors(final, "save the checkpoint"):
        try:
            tmp.mkdir()
            _write_checkpoint_files(
                tmp, model=model, config=config, tokenizer=tokenizer, labels=labels, step=step,
                train_state=train_state, opt_tensors=opt_tensors,
                manifest_extra={"metric": metric, "higher_is_better": higher_is_better},
            )  # fmt: skip
            _place_dir(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
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
    ensure_writable_dir(final.parent)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}-{secrets.token_hex(3)}")
    with storage_errors(final, "export the model"):
        try:
            tmp.mkdir()
            _write_checkpoint_files(
                tmp, model=model, config=config, tokenizer=tokenizer, labels=labels, step=step,
                train_state=None, opt_tensors=None, manifest_extra={},
            )  # fmt: skip
            if final.is_dir() and not any(final.iterdir()):
                final.rmdir()
            _place_dir(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


# Pointers, retention, cleanup ----------------------------------------------------------------
def _step_of(path: Path) -> int | None:
    m = _STEP_DIR.match(path.name)
    return int(m.group(1)) if m else None


def _is_complete(path: Path) -> bool:
    return all((path / f).is_file() for f in (CONFIG, MODEL, MANIFEST))


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoint directories of a run (or of its ``checkpoints/`` dir), oldest first."""
    root = _checkpoint_root(Path(run_dir))
    if root is None:
        return []
    found = [p for p in root.iterdir() if _step_of(p) is not None and _is_complete(p)]
    return sorted(found, key=lambda p: _step_of(p) or 0)


def _checkpoint_root(p: Path) -> Path | None:
    if (p / CHECKPOINTS).is_dir():
        return p / CHECKPOINTS
    if p.is_dir() and ((p / LATEST).is_file() or any(_step_of(c) is not None for c in p.iterdir())):
        return p
    return None


def _is_ours(path: Path) -> bool:
    """Whether ``path`` is an attnlab checkpoint directory (safe to replace)."""
    try:
        return json.loads((path / CONFIG).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _read_pointer(root: Path, name: str) -> Path | None:
    """The complete checkpoint a pointer file names (or its displaced copy mid re-save)."""
    try:
        target = root / (root / name).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if _step_of(target) is None:
        return None
    for candidate in (target, root / f".old-{target.name}"):  # see _place_dir
        if _is_complete(candidate):
            return candidate
    return None


def _current_best(root: Path) -> tuple[str | None, float | None]:
    best = _read_pointer(root, BEST)
    if best is None:
        return None, None
    try:
        metric = json.loads((best / MANIFEST).read_text(encoding="utf-8")).get("metric")
    except (OSError, ValueError):
        return None, None
    return best.name, metric


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint to resume from: ``latest``'s target, else the highest complete step dir.

    ``run_dir`` may be a run directory, its ``checkpoints/`` directory, or a checkpoint directory
    itself (returned as is). None when there is nothing to resume from.
    """
    p = Path(run_dir)
    if (p / CONFIG).is_file():
        return p
    root = _checkpoint_root(p)
    if root is None:
        return None
    target = _read_pointer(root, LATEST)
    if target is not None:
        return target
    found = list_checkpoints(root)
    return found[-1] if found else None


def best_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint with the best metric, or None if no save passed a metric."""
    root = _checkpoint_root(Path(run_dir))
    return None if root is None else _read_pointer(root, BEST)


def _retain(root: Path, keep_last: int, protect: set[str | None]) -> None:
    if keep_last == 0:
        return
    found = list_checkpoints(root)
    for path in found[: max(len(found) - keep_last, 0)]:
        if path.name not in protect:
            doomed = root / f".del-{path.name}-{secrets.token_hex(3)}"
            os.replace(path, doomed)  # never leave a half-deleted dir that looks complete
            shutil.rmtree(doomed, ignore_errors=True)


def _cleanup(root: Path) -> None:
    """Remove leftovers of crashed saves; restore a checkpoint displaced by a crashed re-save."""
    for p in root.iterdir():
        stale_tmp = p.name.startswith(".tmp-") and not _owner_alive(p.name)
        if stale_tmp or p.name.startswith(".del-"):
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith((f".{LATEST}.tmp-", f".{BEST}.tmp-")) and p.is_file():
            p.unlink(missing_ok=True)  # a pointer write killed before its os.replace
        elif p.name.startswith(".old-"):
            original = root / p.name[len(".old-") :]
            if original.exists():
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.replace(p, original)


def _owner_alive(name: str) -> bool:
    """Whether the process that named ``.tmp-<what>-<pid>-<hex>`` still runs (and is not us)."""
    parts = name.rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


# Loading -------------------------------------------------------------------------------------
def _resolve(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise CheckpointError(
            f"no checkpoint at {str(p)!r}: the path does not exist; pass a run directory "
            f"(with checkpoints/ inside) or a checkpoint directory such as "
            f"runs/NAME/checkpoints/step_00001000"
        )
    if p.is_file():
        if p.name in (LATEST, BEST) and (target := _read_pointer(p.parent, p.name)) is not None:
            return target
        raise CheckpointError(
            f"{str(p)!r} is a file, but a checkpoint is a directory (config.json + "
            f"model.safetensors); pass the directory that contains it"
        )
    found = latest_checkpoint(p)
    if found is None:
        raise CheckpointError(
            f"no checkpoint in {str(p)!r}: it holds neither config.json nor a checkpoints/ "
            f"directory with a complete step_* checkpoint; train first (attnlab train --out "
            f"{p}) or pass the right directory"
        )
    return found


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
            raise CheckpointError(
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
) -> Checkpoint:
    """Load a checkpoint directory, or the latest checkpoint of a run directory.

    Builds the model from config.json, loads the weights (re-tying shared ones), the tokenizer
    and labels if saved, and ``train_state/state.json``. ``verify`` checks every file read
    against the sizes and CRC-32 checksums in manifest.json. Any problem is a CheckpointError
    naming the file.
    """
    from attnlab.data import LabelSet, load_tokenizer
    from attnlab.models import build_model

    ckpt = _resolve(path)
    config, data = _read_config(ckpt, expect_kind)
    manifest = _read_json(ckpt / MANIFEST) if (ckpt / MANIFEST).is_file() else None
    names = [n for n in (MODEL, TOKENIZER, LABELS, STATE) if n == MODEL or (ckpt / n).is_file()]
    with ThreadPoolExecutor(max_workers=1) as pool:  # hash the files while the model is built
        checked = pool.submit(lambda: [_verify(ckpt, manifest, n) for n in names if verify])
        model = build_model(config)
        checked.result()
    tensors, meta = _read_safetensors(ckpt / MODEL)
    try:
        aliases = json.loads(meta.get("attnlab.aliases", "{}"))
    except ValueError:
        aliases = {}
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
            f"{_few(diffs)}; to resume, use the checkpoint's model settings (drop the changed "
            f"flags or [model] keys), or train into a new --out directory"
        )


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
        if not state.get("optimizer"):
            raise CheckpointError(
                f"{str(checkpoint.path)!r} was saved without optimizer state; it cannot resume "
                f"training bit-identically, start a new run from its weights instead"
            )
        manifest_path = checkpoint.path / MANIFEST
        manifest = _read_json(manifest_path) if manifest_path.is_file() else None
        _verify(checkpoint.path, manifest, OPTIMIZER)
        tensors, _ = _read_safetensors(checkpoint.path / OPTIMIZER)
        optimizer_state_from_tensors(optimizer, tensors, state["optimizer"])
    if scheduler is not None:
        scheduler_state_from_json(scheduler, state.get("scheduler"))
    try:
        extra = dict(state.get("extra") or {})
        return {**extra, "rng": state["rng"], "step": int(state["step"]),
                "best_metric": state.get("best_metric")}  # fmt: skip
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"{str(checkpoint.path / STATE)!r} is malformed (no valid {err}); it was edited or "
            f"damaged, resume from another checkpoint"
        ) from None
