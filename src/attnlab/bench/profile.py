"""Suite ``profile``: where attnlab's time goes (torch.profiler), to explain unmet targets.

For each LM shape and the seq2seq workload we profile ``steps`` attnlab training steps (after a
warm-up step) and, when ``attnlab.generate`` is available, one greedy generation of 100 tokens
after a 64-token prompt at the medium shape. The result lists the top operators by self CPU time
with their share of the total: the first thing to read when a target is not met (matmuls near the
top = compute bound; copies, layout changes, small elementwise ops = overhead to remove).
``wall_ms`` is the same work timed without the profiler: when the operators' self time
``total_ms`` is well below it, the rest is Python and dispatch overhead between operators.
"""

from __future__ import annotations

import time
from typing import Any, cast

import torch
from torch.profiler import ProfilerActivity, profile

from attnlab.bench import seq2seq_train as s2s
from attnlab.bench.lm_train import (
    SHAPES,
    TINY_SHAPES,
    attnlab_config,
    build_lm,
    make_batches,
    make_train_step,
)
from attnlab.generate import GenerationConfig, generate
from attnlab.models import LanguageModel, build_model

TOP = 15


def top_ops(prof, top: int = TOP) -> tuple[list[dict[str, Any]], float]:
    """(rows, total self CPU ms) from a finished profiler, biggest self time first."""
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total_us = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    rows = [
        {
            "name": e.key,
            "self_cpu_ms": e.self_cpu_time_total / 1e3,
            "share": e.self_cpu_time_total / total_us if total_us else 0.0,
            "calls": e.count,
        }
        for e in events[:top]
    ]
    return rows, total_us / 1e3


def _profile(fn, what: str, repeat: int) -> dict[str, Any]:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    wall_ms = (time.perf_counter() - t0) * 1e3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeat):
            fn()
    rows, total = top_ops(prof)
    return {"what": what, "wall_ms": wall_ms, "total_ms": total, "top_ops": rows}


def run(settings, ctx) -> dict[str, Any]:
    shapes = TINY_SHAPES if settings.tiny else SHAPES
    steps = 2 if settings.tiny else 3
    out = []
    for shape in shapes.values():
        model, forward = build_lm("attnlab", shape)
        work = make_train_step(model, forward, make_batches(shape, 1))
        ctx.say(f"profile: attnlab LM training step, {shape.name}")
        out.append(
            _profile(
                lambda w=work: w(0),
                f"attnlab LM training, {shape.name} shape, {steps} steps",
                steps,
            )
        )
    s2s_shape = s2s.TINY_SHAPE if settings.tiny else s2s.SHAPE
    model, forward = s2s.build_seq2seq("attnlab", s2s_shape)
    work = s2s.make_train_step(
        model, s2s.contender_loss("attnlab", model, forward), s2s.make_batches(s2s_shape, 1)
    )
    ctx.say("profile: attnlab seq2seq training step")
    out.append(_profile(lambda: work(0), f"attnlab seq2seq training, {steps} steps", steps))
    shape = shapes["medium"]
    n_new, n_prompt = (8, 8) if settings.tiny else (100, 64)
    torch.manual_seed(0)
    lm = cast(LanguageModel, build_model(attnlab_config(shape, n_prompt + n_new)).eval())
    cfg = GenerationConfig(max_new_tokens=n_new, temperature=0.0, stop_token_ids=())
    prompt = [list(range(n_prompt))]
    ctx.say("profile: attnlab greedy generation, medium shape")
    out.append(
        _profile(
            lambda: generate(lm, prompt, cfg),
            f"attnlab greedy generate, {n_new} tokens after {n_prompt}",
            1,
        )
    )
    return {"status": "ok", "threads": torch.get_num_threads(), "profiles": out}
