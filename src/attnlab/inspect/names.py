"""Activation names: which quantities of a model can be read or replaced, and how users pick them.

Every :class:`~attnlab.nn.hooks.HookPoint` a model owns is one named activation. Its public name is
its module path with the ``hook_`` prefix dropped from the last part (``blocks.0.self_attn.hook_A``
-> ``blocks.0.self_attn.A``); the names follow the notes' symbols (X, P, Q, K, V, A, f, e, alpha;
the table is in docs/inspect.md). Names are discovered from ``model.named_modules()``, so any
model that owns hook points works, including ones built outside attnlab.

A selection of names (the ``names`` argument across attnlab.inspect) is one of:

* ``None``: every name;
* a string or a list of strings, each an exact name or a glob (``"blocks.*.self_attn.A"``,
  ``"*.Q"``); a string that matches nothing is an error that lists the valid names;
* a predicate ``fn(name) -> bool``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable

from torch import nn

from attnlab.errors import UserError
from attnlab.nn.hooks import HookPoint, hook_name

Selection = str | Iterable[str] | Callable[[str], bool] | None

# Points whose value can be read but not replaced (the mask actually applied is a fact about the
# input, not an activation; change the input or the padding mask instead).
READ_ONLY = frozenset({"mask"})


class InspectError(UserError, ValueError):
    """A bad request to attnlab.inspect: unknown name, head out of range, wrong patch shape..."""


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every named activation of ``model``: {public name: its HookPoint}, in the order of the
    module tree (each module's own points before its children's; not the forward pass's order).
    Points this model never reaches (the rotated
    Q_rot, K_rot without rotary positions; P where no signal is added) are left out, so that
    asking for them is an error rather than a silent no-op."""
    if not isinstance(model, nn.Module):
        raise InspectError(f"attnlab.inspect needs a torch.nn.Module, got {type(model).__name__}")
    points = {}
    for owner_path, owner in model.named_modules():
        for attr, child in owner._modules.items():
            if isinstance(child, HookPoint) and not _dormant(owner, attr):
                points[hook_name(f"{owner_path}.{attr}" if owner_path else attr)] = child
    return points


def _dormant(owner: nn.Module, attr: str) -> bool:
    """True for a point its owner never calls in this configuration."""
    if attr in ("hook_Q_rot", "hook_K_rot"):
        return not getattr(owner, "rotates", False)
    if attr == "hook_P" and hasattr(owner, "pos_enc"):
        return not getattr(owner.pos_enc, "embeds", True)  # the scheme adds no signal P
    return False


def activation_names(model: nn.Module, names: Selection = None) -> list[str]:
    """The public activation names of ``model`` (all, or those a selection picks)."""
    return select(hook_points(model), names)


def select(points: Iterable[str], names: Selection) -> list[str]:
    """Resolve a selection (see the module docstring) against the names ``points`` (a
    ``{name: HookPoint}`` dict, or any iterable of names)."""
    available = list(points)
    if not available:
        raise InspectError(
            "this model has no hook points, so nothing can be cached or changed; "
            "attnlab models own them as hook_<symbol> attributes (attnlab.nn.hooks.HookPoint)"
        )
    if names is None:
        return available
    if callable(names):
        return [n for n in available if names(n)]
    if not isinstance(names, str | Iterable) or isinstance(names, bytes):
        raise InspectError(
            f"names={names!r} ({type(names).__name__}) is not a selection; give a name or glob "
            f"such as 'blocks.0.self_attn.A', a list of them, a predicate, or None for all"
        )
    patterns = [names] if isinstance(names, str) else list(names)
    if not all(isinstance(p, str) for p in patterns):
        raise InspectError(
            f"names={names!r} must hold names or globs (strings), e.g. ['blocks.*.self_attn.A']"
        )
    chosen: dict[str, None] = {}
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise InspectError(
                f"activation names must be strings or globs, got {type(pattern).__name__}"
            )
        matched = [n for n in available if n == pattern or fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise InspectError(unknown_name_message(pattern, available))
        chosen.update(dict.fromkeys(matched))
    return list(chosen)


def unknown_name_message(name: str, available: Iterable[str], holder: str = "this model") -> str:
    """One paragraph: the name is unknown, here are the valid ones (grouped by layer)."""
    available = list(available)
    verb = "has" if holder == "this model" else "holds"
    return (
        f"unknown activation name {name!r}; {holder} {verb} {len(available)} names: "
        f"{', '.join(compact_names(available))}. Use attnlab.inspect.activation_names(model) "
        "for the full list; globs like 'blocks.*.self_attn.A' are accepted"
    )


def compact_names(names: Iterable[str]) -> list[str]:
    """Collapse names that differ only in their layer index: blocks.0.x, blocks.1.x -> blocks.*.x
    (keeping the order of first appearance), so an error message stays readable."""
    out: dict[str, None] = {}
    for name in names:
        parts = ["*" if p.isdigit() else p for p in name.split(".")]
        out[".".join(parts)] = None
    return list(out)


def is_read_only(name: str) -> bool:
    return name.rpartition(".")[2] in READ_ONLY
