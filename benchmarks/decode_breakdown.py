"""Where a compiled one-token decode step spends its time (a diagnostic, not a suite).

    python benchmarks/decode_breakdown.py medium   # or: small

Builds the generate suite's model (random GPT-2 weights copied into attnlab), prefills a 64-token
prompt, then times 499 one-token steps four ways, interleaved over 7 rounds (median ms per step):

  full      ``compiled_step`` as ``generate(compile=True)`` calls it: dynamo's guards, the
            graph's argument collection, AOT autograd's runtime wrapper, inductor's code
  no-guards the same under ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``
  direct    the compiled graph replaying a recorded generation's arguments: no dynamo at all
  call      the generated module's ``call`` on the same arguments: buffer allocation and kernel

All four grow the cache from 64 to 563 positions (``direct`` and ``call`` replay the argument
lists recorded during a warm-up generation, in order). Uses inductor internals
(``PyCodeCache.modules``) that may change between PyTorch releases.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from torch._inductor import config as inductor_config
from torch._inductor.codecache import PyCodeCache
from torch._inductor.compile_fx import compile_fx

from attnlab.bench.generation import build_pair
from attnlab.bench.lm_train import SHAPES
from attnlab.generate import steppers

PROMPT, NEW = 64, 500


def main(shape_name: str) -> None:
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)
    shape = SHAPES[shape_name]
    _, model = build_pair(shape, PROMPT + NEW)
    seen: dict[str, object] = {"calls": [], "record": True}

    def backend(gm, example_inputs):
        with inductor_config.patch(steppers._STEP_OPTIONS):
            compiled = compile_fx(gm, example_inputs)

        def remember(*args):
            seen["fn"] = compiled
            if seen["record"]:
                seen["calls"].append(list(args))
            return compiled(*args)

        return remember

    step = torch.compile(type(model).forward, backend=backend)
    ids = torch.randint(0, shape.vocab, (1, PROMPT), generator=torch.Generator().manual_seed(9))
    token = torch.tensor([[3]])

    def steps(kind: str) -> float:
        """Median-able ms per step over NEW - 1 steps after a fresh prefill."""
        with torch.inference_mode():
            cache = model.new_cache(1, PROMPT + NEW)
            model(ids, cache=cache)
            t0 = time.perf_counter()
            for i in range(NEW - 1):
                if kind == "full":
                    steppers._with_dict_tag_guards(step, model, token, cache=cache)
                elif kind == "no-guards":
                    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                        steppers._with_dict_tag_guards(step, model, token, cache=cache)
                elif kind == "direct":
                    seen["fn"](*recorded[i])
                else:
                    module.call(list(recorded[i]))
            return (time.perf_counter() - t0) / (NEW - 1) * 1e3

    steps("full")  # compiles: static shapes, then dynamic ones for the growing cache length
    seen["calls"].clear()
    steps("full")
    recorded = list(seen["calls"])  # (NEW - 1) argument lists, cache length 64 .. 562
    seen["record"] = False
    module = [m for m in PyCodeCache.modules if hasattr(m, "call")][-1]
    kinds = ("full", "no-guards", "direct", "call")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(7):
        for kind in kinds:
            times[kind].append(steps(kind))
    print(f"{shape_name} model, {NEW - 1} one-token steps after a {PROMPT}-token prompt")
    for kind in kinds:
        print(f"  {kind:10s} {statistics.median(times[kind]):6.3f} ms per step (median of 7)")
    print(f"  graph inputs per call: {len(recorded[0])}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "medium")
