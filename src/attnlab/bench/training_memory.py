"""Suite ``memory``: peak memory of one LM training step at both shapes, per contender.

Same contenders and step as the ``lm`` suite (forward + loss + backward + AdamW step, fp32), each
measured in a child process by :func:`attnlab.bench.memory.measure_case`:

    peak_bytes        resident-set peak during a training step, minus the RSS after imports:
                      parameters + gradients + AdamW moments + activations + temporaries
    step_extra_bytes  the same peak minus the RSS just before the step (after a warm-up step, so
                      parameters and optimizer state already live): activations and gradients

``state_bytes`` = 4 x parameters x 4 bytes (weights, gradients, two AdamW moments) is printed
beside them for scale.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from attnlab.bench import memory
from attnlab.bench.lm_train import SHAPES, TINY_SHAPES, contenders_for


def run(settings, ctx) -> dict[str, Any]:
    shapes = TINY_SHAPES if settings.tiny else SHAPES
    threads = torch.get_num_threads()
    cases: list[dict[str, Any]] = [
        {"module": "lm_train", "contender": name, "shape": asdict(shape), "threads": threads}
        for shape in shapes.values()
        for name in contenders_for(settings)
        if name != "attnlab_compiled"  # same tensors as attnlab; compiling in a child is slow
    ]
    ctx.say(f"memory: {len(cases)} training cases in child processes")
    if settings.fresh_process_per_case:
        results = [memory.run_cases([c])[0] for c in cases]
    else:
        results = memory.run_cases(cases)
    rows = []
    for case, res in zip(cases, results):
        rows.append({"shape": case["shape"]["name"], "contender": case["contender"], **res})
        if res.get("status") == "ok":
            ctx.say(
                f"  {case['shape']['name']:7s} {case['contender']:14s} peak "
                f"{res['peak_bytes'] / 2**20:8.1f} MiB, step "
                f"{res['step_extra_bytes'] / 2**20:8.1f} MiB"
            )
    return {"status": "ok", "method": memory.METHOD, "threads": threads, "cases": rows}
