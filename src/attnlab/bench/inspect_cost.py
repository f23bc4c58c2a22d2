"""Suite ``inspect``: what caching every named activation costs, and what the hook points cost
when nothing is cached (issue 18: the plain forward must not regress).

At the LM suite's small and medium shapes (``attnlab.bench.lm_train.SHAPES``), eval mode, no
gradients, one (B, T) batch of random ids per round, timed in interleaved rounds:

    no_hook_points  the same model with every HookPoint taken out (a bare identity call in its
                    place): the forward as it was before hook points existed
    plain           ``model(ids)``: hook points present, none active
    explicit_path   ``model(ids, need_weights=True)``: the attention path a cache of the scores,
                    weights or per-head outputs makes every layer take
    cache_all       ``attnlab.inspect.run_with_cache(model, ids)``: every named activation cached

The contenders alternate every ~0.1 s over many rounds (6x the run's ``rounds``) rather than
every second over a few: the differences measured here are small, and on a shared machine a load
spike then hits all four alike instead of one round of one contender.

The price of idle hook points is also bounded without timing noise: ``points_per_forward`` (how
many points a forward passes) times ``idle_point_call_us`` (one idle ``HookPoint`` call, timed over
100,000 calls) as a fraction of the plain forward's time, ``idle_points_fraction``.

Ratios: ``plain_vs_no_hook_points`` (1.0 = free hook points), ``cache_all_vs_plain`` and
``cache_all_vs_explicit_path`` (the price of the cache itself, beyond the path it forces).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from attnlab.bench.harness import interleave, ratio
from attnlab.bench.lm_train import SHAPES, TINY_SHAPES, attnlab_config
from attnlab.inspect import hook_points, run_with_cache
from attnlab.models import build_model
from attnlab.nn.hooks import HookPoint

CONTENDERS = ("no_hook_points", "plain", "explicit_path", "cache_all")


class _Bare:
    """A plain identity call standing in for a removed HookPoint (not a module, never active)."""

    active = False

    def __call__(self, x):
        return x


def without_hook_points(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose HookPoints are replaced by a bare identity call."""
    bare = copy.deepcopy(model)
    for module in list(bare.modules()):
        for name, child in list(module._modules.items()):
            if isinstance(child, HookPoint):
                del module._modules[name]
                object.__setattr__(module, name, _Bare())
    return bare


def idle_point_call_us(calls: int = 100_000) -> float:
    """Microseconds per call of a HookPoint with no hook (the plain forward's only extra work)."""
    point, x = HookPoint(), torch.zeros(1)
    t0 = time.perf_counter()
    for _ in range(calls):
        point(x)
    return (time.perf_counter() - t0) / calls * 1e6


def _workloads(model: nn.Module, batches: list[torch.Tensor]) -> dict[str, Any]:
    bare = without_hook_points(model)
    tokens = batches[0].numel()

    def make(fn):
        def work(r: int) -> float:
            with torch.no_grad():
                fn(batches[max(r, 0) % len(batches)])
            return tokens

        return work

    return {
        "no_hook_points": make(lambda ids: bare(ids)),
        "plain": make(lambda ids: model(ids)),
        "explicit_path": make(lambda ids: model(ids, need_weights=True)),
        "cache_all": make(lambda ids: run_with_cache(model, ids)),
    }


def run(settings, ctx) -> dict[str, Any]:
    shapes = TINY_SHAPES if settings.tiny else SHAPES
    out = []
    for shape in shapes.values():
        torch.manual_seed(0)
        model = build_model(attnlab_config(shape)).eval()
        if not hook_points(model):
            return {"status": "not_available", "reason": "DecoderLM has no hook points yet"}
        rounds = 6 * settings.rounds
        batches = [
            torch.randint(0, shape.vocab, (shape.batch, shape.context)) for _ in range(rounds)
        ]
        ctx.say(f"inspect: forward with and without the activation cache, {shape.name}")
        timings = interleave(
            _workloads(model, batches),
            rounds=rounds,
            warmup=settings.warmup,
            min_round_s=settings.min_round_s / 10,
        )
        rows = [{"name": n, **timings[n].to_dict("tokens")} for n in CONTENDERS]
        rate = {r["name"]: r["tokens_per_s"] for r in rows}
        with torch.no_grad():
            _, cache = run_with_cache(model, batches[0])
        points = sum(len(cache.calls(n)) for n in cache)
        point_us = idle_point_call_us()
        forward_s = timings["plain"].median_seconds_per_call
        out.append(
            {
                "shape": shape.name,
                "batch": shape.batch,
                "context": shape.context,
                "d_model": shape.d_model,
                "n_layers": shape.n_layers,
                "contenders": rows,
                "points_per_forward": points,
                "idle_point_call_us": point_us,
                "idle_points_fraction": points * point_us * 1e-6 / forward_s,
                "ratios": {
                    "plain_vs_no_hook_points": ratio(rate["plain"], rate["no_hook_points"]),
                    "cache_all_vs_plain": ratio(rate["cache_all"], rate["plain"]),
                    "cache_all_vs_explicit_path": ratio(rate["cache_all"], rate["explicit_path"]),
                },
            }
        )
    return {"status": "ok", "threads": torch.get_num_threads(), "shapes": out}
