"""Hook points: the named places where a quantity of the notes can be read or replaced.

A :class:`HookPoint` is an identity module placed on one line of an equation (Q = X W_q, the
scores Q K^T, the weights A, ...). It does nothing until someone registers a forward hook on it:
``attnlab.inspect`` does, to cache the value (return nothing) or to replace it (return a tensor).
Modules own their points as attributes named ``hook_<symbol>`` (``hook_Q``, ``hook_A``); the
public name of a point is its module path with the ``hook_`` prefix dropped from the last part
(``blocks.0.attn.hook_A`` -> ``blocks.0.attn.A``), see ``attnlab.inspect``.

An inactive point costs one dictionary test: ``__call__`` returns its input untouched unless a
hook is registered, so the plain forward keeps its speed.
"""

from __future__ import annotations

from torch import Tensor, nn


class HookPoint(nn.Module):
    """Identity on one named value; forward hooks registered on it read or replace that value."""

    def __call__(self, x: Tensor) -> Tensor:
        if not (self._forward_hooks or self._forward_pre_hooks):
            return x
        return super().__call__(x)

    def forward(self, x: Tensor) -> Tensor:
        return x

    @property
    def active(self) -> bool:
        """True while a hook is registered (modules may then take their explicit path)."""
        return bool(self._forward_hooks or self._forward_pre_hooks)


def hook_name(module_path: str) -> str:
    """``blocks.0.attn.hook_A`` -> ``blocks.0.attn.A`` (the name users pass to attnlab.inspect)."""
    head, _, last = module_path.rpartition(".")
    last = last.removeprefix("hook_")
    return f"{head}.{last}" if head else last
