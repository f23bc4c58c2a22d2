"""Interventions: replace named activations for the duration of a ``with`` block.

    with intervene(model, {"blocks.1.self_attn.A": lambda A: A * 0.5}):
        logits = model(ids).logits
    with patch(model, cache_b, "blocks.1.*"):       # activation patching from another input
        logits = model(ids_a).logits
    with scale_positions(model, 0.0):               # the model without its position signal P
        ...

Each value is a tensor (used in place of the activation) or a function ``fn(value) -> value``
(returning None leaves it unchanged). A tensor must have the activation's shape and dtype; it is
moved to the activation's device, so a CPU tensor can patch a CUDA model. A point inside a
recurrence (the LSTM decoder's e, alpha, v_l) takes either one step's shape, used at every step,
or the stacked shape of ``run_with_cache`` (steps on dim 1), sliced step by step.

Interventions compose: nested ``with`` blocks (or several names in one call) all apply, inner ones
after outer ones on the same point. They work wherever the model is called, including inside
``attnlab.generate`` (a whole generation with a head ablated), under ``torch.no_grad`` and with
gradients. Every hook is removed when the block exits, normally or by an exception, so the model
afterwards computes bit for bit what it computed before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

from torch import Tensor, nn

from attnlab.inspect.cache import ActivationCache
from attnlab.inspect.names import (
    InspectError,
    Selection,
    hook_points,
    is_read_only,
    select,
    unknown_name_message,
)
from attnlab.nn.positional import Positions

Replacement = Tensor | Callable[[Tensor], Tensor | None]


@contextmanager
def intervene(model: nn.Module, changes: Mapping[str, Replacement]) -> Iterator[None]:
    """Replace the named activations of ``model`` inside the block (see the module docstring).

    ``changes``: {name or glob: tensor | fn(value) -> value}. A glob applies its value to every
    name it matches.
    """
    if not isinstance(changes, Mapping):
        raise InspectError(
            f"intervene needs a dict {{name: tensor or function}}, got {type(changes).__name__}"
        )
    points = hook_points(model)
    plan: list[tuple[str, Replacement]] = []
    for pattern, replacement in changes.items():
        if not (isinstance(replacement, Tensor) or callable(replacement)):
            raise InspectError(
                f"the value for {pattern!r} must be a tensor or a function value -> value, "
                f"got {type(replacement).__name__}"
            )
        for name in select(points, [pattern]):
            if is_read_only(name):
                raise InspectError(
                    f"{name!r} is read-only (the mask the input implies); change the input or "
                    "its key_padding_mask instead, or intervene on the scores or weights A"
                )
            plan.append((name, replacement))
    handles = []
    try:
        for name, replacement in plan:
            point = points[name]
            hook = _replace_hook(name, replacement, getattr(point, "step_axis", None))
            handles.append(point.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _replace_hook(name: str, replacement: Replacement, step_axis: int | None):
    """A forward hook returning the replacement for ``name`` (checked against the value)."""
    step = [0]  # steps seen, for stacked replacements of recurrent points

    def hook(module, args, value):
        if callable(replacement) and not isinstance(replacement, Tensor):
            new = replacement(value)
            if new is None:
                return None
            if not isinstance(new, Tensor):
                raise InspectError(
                    f"the function for {name!r} returned {type(new).__name__}; "
                    "return a tensor (or None to leave the value unchanged)"
                )
            _check_like(name, new, value, "the function's result")
            return new
        new = replacement
        if step_axis is not None and new.dim() == value.dim() + 1:
            i = step[0]
            step[0] += 1
            if i >= new.size(step_axis):
                raise InspectError(
                    f"the replacement for {name!r} holds {new.size(step_axis)} steps on dim "
                    f"{step_axis} but the model took step {i + 1}; give one step's value "
                    f"{tuple(value.shape)} (used at every step) or one value per step"
                )
            new = new.select(step_axis, i)
        _check_like(name, new, value, "the replacement")
        return new.to(value.device)

    return hook


def _check_like(name: str, new: Tensor, value: Tensor, what: str) -> None:
    if new.shape != value.shape:
        raise InspectError(
            f"{what} for {name!r} has shape {tuple(new.shape)} but the activation has "
            f"{tuple(value.shape)}; give a tensor of that shape (e.g. from run_with_cache on "
            "an input of the same shape)"
        )
    if new.dtype != value.dtype:
        raise InspectError(
            f"{what} for {name!r} has dtype {new.dtype} but the activation has {value.dtype}; "
            f"convert it with .to({value.dtype})"
        )


@contextmanager
def patch(model: nn.Module, source: ActivationCache, names: Selection = None) -> Iterator[None]:
    """Activation patching: inside the block the selected activations take the values cached
    from another input (``source``, from run_with_cache on that input).

    ``names`` selects among the model's names (None = every name in ``source``); each must be in
    the cache. The cached input must have the same shape as the one the model runs on.
    """
    if not isinstance(source, ActivationCache):
        raise InspectError(
            f"patch needs an ActivationCache from run_with_cache, got {type(source).__name__}"
        )
    points = hook_points(model)
    chosen = list(source) if names is None else select(points, names)
    changes = {}
    for name in chosen:
        if name not in points:
            raise InspectError(unknown_name_message(name, points))
        if name not in source:
            raise InspectError(
                f"{name!r} is not in the source cache; run run_with_cache on the source input "
                "with names that include it (or names=None for all)"
            )
        if is_read_only(name):
            continue  # the mask is a fact of the input, implied by the patched values
        changes[name] = source[name]
    with intervene(model, changes):
        yield


def position_names(model: nn.Module) -> list[str]:
    """The names of the position signal P (one per embedding that adds or concatenates one)."""
    points = hook_points(model)
    found = [n for n in points if n.rpartition(".")[2] == "P"]
    if not found:
        schemes = [getattr(m, "pos_enc", None) for m in model.modules()]
        scheme = next((p for p in schemes if isinstance(p, Positions)), None)
        hint = " Recurrent models and models built with positional='none' have none."
        if scheme is not None and scheme.rotates:
            rotary = [n for n in points if n.endswith("_rot")]
            hint = (
                f" This model uses {scheme.kind} positions, which act inside attention: "
                f"intervene on {rotary[0]!r} and the matching K_rot instead."
            )
        elif scheme is not None and scheme.biases:
            scaled = [n for n in points if n.endswith(".scaled")]
            hint = (
                f" This model's {scheme.kind} positions are a bias on the attention logits: "
                f"intervene on {scaled[0]!r} (the logits, bias included) instead."
            )
        raise InspectError(f"this model adds no position signal P.{hint}")
    return found


@contextmanager
def scale_positions(model: nn.Module, factor: float) -> Iterator[None]:
    """Multiply the position signal P by ``factor`` inside the block (0 removes it)."""
    with intervene(model, {n: (lambda p: p * factor) for n in position_names(model)}):
        yield


@contextmanager
def replace_positions(model: nn.Module, value: Tensor) -> Iterator[None]:
    """Use ``value`` as the position signal P inside the block (same shape and dtype as P,
    e.g. another model's P or P at shuffled positions from run_with_cache)."""
    if not isinstance(value, Tensor):
        raise InspectError(f"replace_positions needs a tensor, got {type(value).__name__}")
    with intervene(model, dict.fromkeys(position_names(model), value)):
        yield


def compose(*contexts: AbstractContextManager[Any]) -> AbstractContextManager[None]:
    """Enter several intervention contexts as one: ``with compose(ablate_heads(..), patch(..))``;
    they apply together and are all removed on exit."""

    @contextmanager
    def both():
        with ExitStack() as stack:
            for ctx in contexts:
                stack.enter_context(ctx)
            yield

    return both()


__all__ = [
    "compose",
    "intervene",
    "patch",
    "position_names",
    "replace_positions",
    "scale_positions",
]
