"""Cache named activations during a forward pass: ``run_with_cache`` and ``capture``.

    logits, cache = run_with_cache(model, ids)                 # every named activation
    out, cache = run_with_cache(model, ids, names="*.A")       # only the attention weights
    cache["blocks.0.self_attn.A"]                              # (B, H, T, S)

Caching registers a forward hook that stores the value and returns nothing, so the forward pass
computes exactly what it computes without the cache (bit-identical logits on the same path; asking
for scores, mask, A or per-head outputs makes an attention module take its explicit path, the one
``need_weights=True`` takes).

A point fires once per forward call, except points inside a recurrence (the LSTM decoder's e,
alpha, v_l), which fire once per step: the cache stacks those on their step axis (dim 1), so
``cache["alpha"]`` is (B, T, S) like a Transformer's weights. When a point fired in several
forward calls (generation with a KV cache calls the model once per token), ``cache.calls(name)``
lists the values call by call and ``cache[name]`` asks for that.

With ``detach=False`` the cached tensors stay in the autograd graph, so a user can take gradients
of the loss with respect to any activation (``torch.autograd.grad(loss, cache["...A"])``).
``grads=True`` does that for every cached name at once: ``cache.grads[name]`` is dM/da for a
metric M (the LM loss by default; ``attnlab.inspect.gradients``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.inspect.names import InspectError, Selection, hook_points, select, unknown_name_message


class ActivationCache(Mapping[str, Tensor]):
    """Named activations of one run: a read-only mapping {name: tensor}.

    ``cache[name]`` is the value (stacked over steps for recurrent points, see the module
    docstring); ``cache.calls(name)`` every value it took, call by call; ``cache.names`` the
    names that fired, in order. Unknown names raise an error that lists the cached ones.
    """

    def __init__(self) -> None:
        self.grads: ActivationCache | None = None  # dM/da by name, after run_with_cache(grads=True)
        self.metric: Tensor | None = None  # M of that run
        self._calls: dict[str, list[Tensor]] = {}
        self._step_axis: dict[str, int | None] = {}
        self._stacked: dict[str, list[Tensor]] = {}  # per forward call, steps (recurrent points)
        self._current: dict[str, list[Tensor]] = {}

    @classmethod
    def from_dict(cls, values: Mapping[str, Tensor]) -> ActivationCache:
        """A cache holding ``values`` ({name: tensor}), e.g. edited activations to patch in."""
        cache = cls()
        for name, value in values.items():
            cache._record(name, value, None)
        return cache

    # ---------------------------------------------------------------- recording (by capture)
    def _record(self, name: str, value: Tensor, step_axis: int | None) -> None:
        self._step_axis[name] = step_axis
        if step_axis is None:
            self._calls.setdefault(name, []).append(value)
        else:
            self._current.setdefault(name, []).append(value)

    def _end_call(self) -> None:
        """Close one forward call: the steps a recurrent point took become one stacked value."""
        for name, steps in self._current.items():
            axis = self._step_axis[name]
            assert axis is not None  # only recurrent points (with a step axis) are in _current
            self._calls.setdefault(name, []).append(torch.stack(steps, dim=axis))
        self._current = {}

    # ---------------------------------------------------------------- reading
    def __getitem__(self, name: str) -> Tensor:
        calls = self.calls(name)
        if len(calls) > 1:
            raise InspectError(
                f"activation {name!r} was recorded in {len(calls)} forward calls (generation "
                "with a KV cache calls the model once per token); use cache.calls(name) for "
                "the list, or run_with_cache on the full sequence for one tensor"
            )
        return calls[0]

    def calls(self, name: str) -> list[Tensor]:
        """Every value ``name`` took, one per forward call."""
        if name not in self._calls:
            if not self._calls:
                raise InspectError(f"the cache is empty, so it has no {name!r}")
            raise InspectError(unknown_name_message(name, self._calls, "this cache"))
        return list(self._calls[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._calls)

    def __len__(self) -> int:
        return len(self._calls)

    def __contains__(self, name: object) -> bool:
        return name in self._calls

    @property
    def names(self) -> list[str]:
        return list(self._calls)

    def step_axis(self, name: str) -> int | None:
        """The axis a recurrent point's steps are stacked on (None for per-call points)."""
        self.calls(name)
        return self._step_axis[name]

    def select(self, names: Selection) -> dict[str, Tensor]:
        """{name: value} for a selection (names, globs or a predicate) of the cached names."""
        return {n: self[n] for n in select(self._calls, names)}

    def to(self, device: torch.device | str) -> ActivationCache:
        """A copy with every tensor on ``device``."""
        out = ActivationCache()
        out._calls = {n: [v.to(device) for v in vs] for n, vs in self._calls.items()}
        out._step_axis = dict(self._step_axis)
        return out

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}: {tuple(v[-1].shape)}" for n, v in list(self._calls.items())[:6])
        more = f", ... ({len(self)} names)" if len(self) > 6 else ""
        return f"ActivationCache({shown}{more})"


@contextmanager
def capture(
    model: nn.Module, names: Selection = None, *, detach: bool = True
) -> Iterator[ActivationCache]:
    """Record the selected activations of every forward call made inside the block.

        with capture(model, "*.A") as cache:
            attnlab.generate(model, "hello", config)     # one entry per decode step
        cache.calls("blocks.0.self_attn.A")

    The hooks are removed when the block exits, also when it exits by an exception.
    """
    points = hook_points(model)
    chosen = select(points, names)
    cache = ActivationCache()
    handles = []

    def make_hook(name: str, step_axis: int | None):
        def hook(module, args, output):
            cache._record(name, output.detach() if detach else output, step_axis)

        return hook

    def end_call(module, args, output):
        cache._end_call()

    try:
        for name in chosen:
            point = points[name]
            handles.append(
                point.register_forward_hook(make_hook(name, getattr(point, "step_axis", None)))
            )
        if any(getattr(points[n], "step_axis", None) is not None for n in chosen):
            handles.append(model.register_forward_hook(end_call))
            handles.extend(_end_call_on_decode(model, end_call))
        yield cache
    finally:
        for handle in handles:
            handle.remove()
        cache._end_call()


def _end_call_on_decode(model: nn.Module, end_call) -> list:
    """Seq2seq generation calls ``model.decode`` directly (not ``forward``): close a call there
    too. ``decode`` is a method, not a module, so it is wrapped for the life of the capture."""
    decode = getattr(type(model), "decode", None)
    if decode is None:
        return []

    original = model.__dict__.get("decode")

    def wrapped(*args, **kwargs):
        out = decode(model, *args, **kwargs)
        end_call(model, args, out)
        return out

    model.__dict__["decode"] = wrapped  # an instance attribute shadowing the class's method

    class _Restore:
        def remove(self) -> None:
            if original is None:
                model.__dict__.pop("decode", None)
            else:
                model.__dict__["decode"] = original

    return [_Restore()]


def run_with_cache(
    model: nn.Module,
    *args,
    names: Selection = None,
    detach: bool = True,
    grads: bool = False,
    **kwargs,
) -> tuple[Any, ActivationCache]:
    """``model(*args, **kwargs)`` once, returning (its output, the cache of named activations).

    ``names``: which activations to keep (None = all; names, globs or a predicate, see
    attnlab.inspect.names). ``detach=False`` keeps them in the autograd graph. ``grads=True``
    also fills ``cache.grads`` with dM/da and ``cache.metric`` with M, where the keywords
    ``metric`` ("loss", "logprob" or a function of the output), ``targets``, ``token`` and
    ``position`` choose M (``attnlab.inspect.gradients.run_with_grads``).
    """
    if grads:
        from attnlab.inspect.gradients import run_with_grads  # gradients imports this module

        run = run_with_grads(model, *args, names=names, **kwargs)
        run.cache.grads, run.cache.metric = run.grads, run.metric
        return run.output, run.cache
    with capture(model, names, detach=detach) as cache:
        output = model(*args, **kwargs)
    return output, cache
