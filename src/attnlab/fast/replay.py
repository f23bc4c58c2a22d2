"""The compiled decode step replayed without dynamo: ``generate(compile=True)`` on a fast model.

``attnlab.generate.steppers.CompiledStep`` calls ``model.forward`` (LM) or ``model.decode``
(seq2seq) through ``torch.compile`` on every token. :class:`ReplayingStep`, its drop-in
replacement on the engine, records the compiled graph's calls (the :class:`_Capture` backend)
and, once two steps in a row differ only by the new token and cache lengths one larger, calls
the graph itself (:class:`Replay`), skipping dynamo's per-call guards and input collection.

Shapes: R rows, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from attnlab.fast.switches import PATHS
from attnlab.generate.steppers import STEP_OPTIONS, CompiledStep, compiled_step


class GraphCall(NamedTuple):
    """One call of a compiled graph: the graph, its flat arguments and outputs, and the step's
    token ids and logits (as the stepper passed and received them)."""

    fn: Callable[..., Any]
    args: list[Any]
    outputs: Any
    ids: Tensor
    logits: Tensor


_Call = tuple[Callable[..., Any], list[Any], Any]  # a compiled graph, its arguments, its outputs


class _Capture:
    """The ``torch.compile`` backend of the step: inductor with ``_STEP_OPTIONS``, whose graphs
    report each call made inside :meth:`recording` (the graph, its arguments and outputs)."""

    def __init__(self):
        self.calls: list[_Call] | None = None

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        from torch._inductor.compile_fx import compile_fx  # heavy: only when compiling

        # called on a graph (not in AOT mode), compile_fx returns the compiled callable
        compiled = cast(
            Callable[..., Any], compile_fx(gm, example_inputs, config_patches=STEP_OPTIONS)
        )

        def run(*args: Any) -> Any:
            outputs = compiled(*args)
            if self.calls is not None:
                self.calls.append((compiled, list(args), outputs))
            return outputs

        return run

    @contextmanager
    def recording(self) -> Iterator[list[_Call]]:
        self.calls = []
        try:
            yield self.calls
        finally:
            self.calls = None


_CAPTURE = _Capture()


class Replay:
    """The compiled step's graph called directly, without dynamo, while only the token and the
    cache length change from one step to the next.

    Each call through ``torch.compile`` pays dynamo's guards and its collection of the graph's
    inputs (every parameter, each layer's k/v buffers and fill length), a large part of a small
    model's step (``benchmarks/decode_breakdown.py``). Between two tokens of one generation the
    inputs are the same tensors but for the new token, and the lengths are one more, so once two
    recorded steps in a row show exactly that (:meth:`between`), the next steps call the graph
    with those two changes and advance the layers' lengths as the model's Python code would
    (checked when recording; attnlab's models have no other Python side effect in a cached
    one-token step, the cross-attention memory of a seq2seq cache being set by the eager first
    step). Anything else -- a slide of the window (a new cache), a reorder (beam search), padded
    rows (positions change), a hook -- goes back through dynamo, whose guards then apply. Within
    one generation the model must not be replaced piecewise (a new parameter object): in-place
    updates are seen, replaced tensors are not.
    """

    def __init__(
        self, call: GraphCall, token_at: int, length_at: list[int], logits_at: int, layers: list
    ):
        self.fn, self.args = call.fn, list(call.args)
        self.token_at, self.length_at, self.logits_at = token_at, length_at, logits_at
        self.layers = layers

    @classmethod
    def between(cls, prev: GraphCall, cur: GraphCall, layers: list[Any]) -> Replay | None:
        """A replay of ``cur`` when it repeats ``prev`` with a new token and lengths + 1."""
        if cur.fn is not prev.fn or len(cur.args) != len(prev.args):
            return None
        token_at = [j for j, arg in enumerate(cur.args) if arg is cur.ids]
        logits_at = [j for j, out in enumerate(cur.outputs) if out is cur.logits]
        if len(token_at) != 1 or len(logits_at) != 1 or prev.args[token_at[0]] is not prev.ids:
            return None
        length_at = []
        for j, (a, b) in enumerate(zip(prev.args, cur.args)):
            if j == token_at[0]:
                continue
            if type(a) is int and type(b) is int and b == a + 1:
                length_at.append(j)
            elif a is not b:
                return None
        return cls(cur, token_at[0], length_at, logits_at[0], layers)

    def fits(self) -> bool:
        """True while one more position goes in place: no sliding-window layer is about to drop
        its old keys (that copy is Python code of the cache, which the graph does not replay)."""
        return all(layer.start_after(1) == layer.start for layer in self.layers)

    def __call__(self, ids: Tensor) -> Tensor:
        """ids (R, 1) -> logits (R, 1, V); the cache gains one position."""
        if self.layers[0].length >= self.layers[0].max_len:
            raise ValueError(
                f"KV cache overflow: the cache holds {self.layers[0].max_len} positions; "
                "allocate a longer cache or slide the window"
            )
        self.args[self.token_at] = ids
        for j in self.length_at:
            self.args[j] += 1
        logits = self.fn(*self.args)[self.logits_at]
        for layer in self.layers:
            layer.length += 1
        return logits


class ReplayingStep(CompiledStep):
    """:class:`~attnlab.generate.steppers.CompiledStep` on the engine: called through dynamo
    and recorded until two steps in a row allow a :class:`Replay`, then replayed until
    :meth:`reset`.

    A replay bypasses dynamo's guards, so it runs only while no module of the model has a hook
    (a hook point in use by ``attnlab.inspect``, or any other forward hook): when one appears the
    step goes back through dynamo, and replays are allowed again only after two new recorded
    steps without hooks.
    """

    def __init__(self, model: torch.nn.Module, method: str):
        self.traced = compiled_step(model, method, backend=_CAPTURE)
        self.modules = list(model.modules())
        self.replay: Replay | None = None
        self.last_call: GraphCall | None = None

    def reset(self) -> None:
        """The cache or the batch changed: back through dynamo (and its guards)."""
        self.replay = self.last_call = None

    def __call__(self, ids: Tensor, *args: Any, cache: Any) -> Tensor:
        if _hooked(self.modules) or not PATHS["replay"]:
            self.reset()
            return self.traced(ids, *args, cache=cache).logits
        if self.replay is not None and self.replay.fits():
            return self.replay(ids)
        self.replay = None  # a windowed cache trims itself: through dynamo, then record again
        before = cache.length
        with _CAPTURE.recording() as calls:
            out = self.traced(ids, *args, cache=cache)
        call = None
        if len(calls) == 1 and all(layer.length == before + 1 for layer in cache.layers):
            call = GraphCall(*calls[0], ids, out.logits)
        if call is not None and self.last_call is not None:
            self.replay = Replay.between(self.last_call, call, cache.layers)
        self.last_call = call
        return out.logits


def _hooked(modules: list[torch.nn.Module]) -> bool:
    """True when any of ``modules`` (or every module, globally) has a forward hook."""
    if _global_forward_hooks or _global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)
