"""Training state as safetensors + JSON: random-number generators, optimizers, LR schedulers.

Resuming bit-identically needs everything that influences the next step besides the weights:
the optimizer's moment/momentum buffers and step counters, the schedule position, and the state of
every random-number generator (dropout masks, data sampling). ``torch.save`` would store all that
as a pickle, and unpickling a file someone handed you runs arbitrary code. So nothing here uses
pickle: tensors go to a safetensors file and everything else to JSON.

``optimizer.state_dict()`` is a nest of dicts (with int keys), lists, tuples, numbers and tensors.
:func:`flatten_state` turns it into ``(json_tree, tensors)``: each tensor is replaced by
``{"__tensor__": key}`` and stored under that key; tuples become ``{"__tuple__": [...]}`` and dicts
whose keys are not plain strings ``{"__dict__": [[key, value], ...]}``, so
:func:`unflatten_state` rebuilds exactly the original structure (same types, same bits).

:func:`write_safetensors` streams tensors to a safetensors file straight from their memory (no
serialised copy of a 1.5 GB optimizer state in RAM), checks every write, fsyncs, and returns the
size and CRC-32 for the checkpoint manifest. Files are read back with the ``safetensors`` library.
"""

from __future__ import annotations

import base64
import json
import os
import random
import struct
import sys
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlab.checkpoint.atomic import storage_errors
from attnlab.errors import CheckpointError

_TAGS = ("__tensor__", "__tuple__", "__dict__")


# Generic (JSON tree, tensors) encoding -------------------------------------------------------
def flatten_state(obj: Any, prefix: str = "") -> tuple[Any, dict[str, Tensor]]:
    """Split a state dict into a JSON-ready tree and a flat ``{key: tensor}`` dict."""
    tensors: dict[str, Tensor] = {}
    tree = _flatten(obj, prefix, tensors, set())
    return tree, tensors


def _flatten(obj: Any, path: str, tensors: dict[str, Tensor], seen: set[int]) -> Any:
    if isinstance(obj, Tensor):
        t = obj.detach().to("cpu").contiguous()
        if t.untyped_storage().data_ptr() in seen and t.numel():  # safetensors refuses sharing
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        key = path or "tensor"
        tensors[key] = t
        return {"__tensor__": key}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [_flatten(v, f"{path}/{i}", tensors, seen) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_flatten(v, f"{path}/{i}", tensors, seen) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and k not in _TAGS for k in obj):
            return {k: _flatten(v, f"{path}/{k}", tensors, seen) for k, v in obj.items()}
        return {
            "__dict__": [
                [_flatten(k, "", {}, set()), _flatten(v, f"{path}/{k}", tensors, seen)]
                for k, v in obj.items()
            ]
        }
    where = path.lstrip("/") or "<root>"
    raise TypeError(
        f"cannot serialise {type(obj).__name__} at {where!r} without pickle; "
        f"state dicts may hold tensors, numbers, strings, None, lists, tuples and dicts"
    )


def unflatten_state(tree: Any, tensors: dict[str, Tensor]) -> Any:
    """Inverse of :func:`flatten_state`."""
    if isinstance(tree, list):
        return [unflatten_state(v, tensors) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "__tensor__" in tree:
        key = tree["__tensor__"]
        if key not in tensors:
            raise CheckpointError(
                f"the saved training state refers to tensor {key!r}, which its safetensors file "
                f"lacks; the train_state directory is incomplete, resume from another checkpoint"
            )
        return tensors[key]
    if "__tuple__" in tree:
        return tuple(unflatten_state(v, tensors) for v in tree["__tuple__"])
    if "__dict__" in tree:
        return {
            unflatten_state(k, tensors): unflatten_state(v, tensors) for k, v in tree["__dict__"]
        }
    return {k: unflatten_state(v, tensors) for k, v in tree.items()}


# Streaming safetensors writer -----------------------------------------------------------------
_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip


def write_safetensors(
    path: str | os.PathLike, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None
) -> dict[str, int]:
    """Write ``tensors`` in the safetensors format, fsynced; return ``{"bytes", "crc32"}``.

    Layout (the safetensors spec): an 8-byte little-endian header length N, N bytes of JSON
    ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`` padded
    with spaces to a multiple of 8, then the raw little-endian tensor bytes back to back.
    """
    if sys.byteorder != "little":  # pragma: no cover
        raise RuntimeError("write_safetensors needs a little-endian machine")
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    chunks: list[Any] = []
    offset = 0
    for name, t in tensors.items():
        if t.dtype not in _DTYPES:
            raise TypeError(f"tensor {name!r} has dtype {t.dtype}, which safetensors cannot hold")
        t = t.detach().to("cpu").contiguous()
        nbytes = t.numel() * t.element_size()
        header[name] = {
            "dtype": _DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
        if nbytes:
            chunks.append(t.reshape(-1).view(torch.uint8).numpy())  # a view, not a copy
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)
    crc = 0
    with storage_errors(path), open(path, "wb") as f:
        for chunk in (struct.pack("<Q", len(head)), head, *chunks):
            f.write(chunk)
            crc = zlib.crc32(chunk, crc)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": 8 + len(head) + offset, "crc32": crc}


# Optimizers ----------------------------------------------------------------------------------
def _as_list(obj: Any) -> tuple[list[Any], bool]:
    if isinstance(obj, Sequence) and not isinstance(obj, str):
        return list(obj), False
    return [obj], True


def optimizer_state_to_tensors(
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``optimizer.state_dict()`` (of one optimizer or a list) -> (tensors, JSON metadata).

    Works for any ``torch.optim`` optimizer (AdamW, Muon, SGD, ...): buffers and tensor step
    counters become tensors keyed ``"<i>/state/<param>/<name>"``; param groups (lr, betas,
    weight decay, ...) and int step counters go to the metadata.
    """
    optimizers, single = _as_list(optimizer)
    tensors: dict[str, Tensor] = {}
    states = []
    for i, opt in enumerate(optimizers):
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"expected a torch.optim.Optimizer, got {type(opt).__name__}")
        tree, ts = flatten_state(opt.state_dict(), prefix=str(i))
        tensors.update(ts)
        states.append(tree)
    meta = {
        "single": single,
        "classes": [type(opt).__name__ for opt in optimizers],
        "states": states,
    }
    return tensors, meta


def optimizer_state_from_tensors(
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
    tensors: dict[str, Tensor],
    meta: dict[str, Any],
) -> None:
    """Load what :func:`optimizer_state_to_tensors` produced into freshly built optimizers.

    The optimizers must be built the same way as when saving (same classes, same param groups in
    the same order); a mismatch raises :class:`~attnlab.errors.CheckpointError`.
    """
    optimizers, _ = _as_list(optimizer)
    try:
        classes, states = list(meta["classes"]), list(meta["states"])
    except (KeyError, TypeError):
        raise CheckpointError(
            "the saved optimizer metadata is malformed (no 'classes'/'states'); the checkpoint's "
            "train_state was not written by attnlab, resume from another checkpoint"
        ) from None
    have = [type(opt).__name__ for opt in optimizers]
    if have != classes:
        raise CheckpointError(
            f"the checkpoint holds optimizer state for {classes} but this run built {have}; "
            f"resume with the same optimizer settings (e.g. the same optimizer) as the saved run",
            fields=("optimizer",),
        )
    for opt, tree, name in zip(optimizers, states, classes):
        state_dict = unflatten_state(tree, tensors)
        try:
            opt.load_state_dict(state_dict)
        except (ValueError, KeyError, RuntimeError) as err:
            raise CheckpointError(
                f"the saved {name} state does not fit this run's model ({err}); the model or its "
                f"parameter groups changed since the checkpoint was written; resume with the "
                f"original model config, or start a fresh run"
            ) from None


# LR schedulers -------------------------------------------------------------------------------
def scheduler_state_to_json(scheduler: Any) -> Any:
    """``scheduler.state_dict()`` (one, a list, or None) -> JSON-ready data without tensors."""
    if scheduler is None:
        return None
    schedulers, single = _as_list(scheduler)
    trees = []
    for s in schedulers:
        tree, tensors = flatten_state(s.state_dict())
        if tensors:
            raise TypeError(
                f"{type(s).__name__}.state_dict() holds tensors ({sorted(tensors)[:3]}); "
                f"schedulers must keep plain numbers to be saved as JSON"
            )
        trees.append(tree)
    return {"single": single, "classes": [type(s).__name__ for s in schedulers], "states": trees}


def scheduler_state_from_json(scheduler: Any, data: Any) -> None:
    """Load what :func:`scheduler_state_to_json` produced into freshly built schedulers."""
    if scheduler is None:
        return
    schedulers, _ = _as_list(scheduler)
    if not isinstance(data, dict) or "states" not in data:
        raise CheckpointError(
            "the checkpoint has no LR-scheduler state to restore (it was saved without one); "
            "resume with the same schedule settings as the saved run, or start a fresh run"
        )
    have = [type(s).__name__ for s in schedulers]
    if have != list(data.get("classes", [])):
        raise CheckpointError(
            f"the checkpoint holds LR-scheduler state for {data.get('classes')} but this run "
            f"built {have}; resume with the same schedule settings as the saved run"
        )
    for s, tree in zip(schedulers, data["states"]):
        s.load_state_dict(unflatten_state(tree, {}))


# Random-number generators --------------------------------------------------------------------
def _b64(t: Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def _pack_words(words: Any) -> str:
    """Mersenne-Twister words (each < 2**32) as compact base64 rather than 625 JSON numbers."""
    return base64.b64encode(np.asarray(words, dtype="<u4").tobytes()).decode("ascii")


def _unpack_words(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<u4").astype(np.uint32)


def capture_rng_state() -> dict[str, Any]:
    """The state of Python ``random``, NumPy's global RNG, torch CPU (and CUDA/MPS if present)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # noqa: NPY002
    state: dict[str, Any] = {
        "python": {"version": version, "state": _pack_words(internal), "gauss": gauss},
        "numpy": {
            "name": name,
            "keys": _pack_words(keys),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    if hasattr(torch, "mps") and torch.backends.mps.is_available():
        state["mps"] = _b64(torch.mps.get_rng_state())
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` returned; call it last when resuming.

    CUDA/MPS states are restored when that device exists here, and ignored otherwise (a run
    resumed on another kind of machine cannot be bit-identical anyway).
    """
    try:
        py = state["python"]
        random.setstate((py["version"], tuple(_unpack_words(py["state"]).tolist()), py["gauss"]))
        npst = state["numpy"]
        keys = _unpack_words(npst["keys"])
        np.random.set_state(  # noqa: NPY002
            (npst["name"], keys, npst["pos"], npst["has_gauss"], npst["cached_gaussian"])
        )
        torch.set_rng_state(_unb64(state["torch"]))
        if "cuda" in state and torch.cuda.is_available():
            cuda = [_unb64(s) for s in state["cuda"]]
            if len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda)
        if "mps" in state and hasattr(torch, "mps") and torch.backends.mps.is_available():
            torch.mps.set_rng_state(_unb64(state["mps"]))
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(
            f"the saved random-number-generator state is malformed ({type(err).__name__}: "
            f"{err}); the checkpoint's train_state/state.json was edited or damaged, resume "
            f"from another checkpoint"
        ) from None
