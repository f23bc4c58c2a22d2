"""Where a compiled one-token decode step spends its time (a diagnostic, not a suite).

    python benchmarks/decode_breakdown.py medium   # or: small; --tiny: a toy run for the tests

Builds the generate suite's model (random GPT-2 weights copied into attnlab), prefills a 64-token
prompt, then times 499 one-token steps four ways, interleaved over 7 rounds (median ms per step):

  full      ``compiled_step`` through dynamo, as ``generate(compile=True)`` runs its first steps:
            dynamo's guards, the graph's argument collection, AOT autograd's runtime wrapper,
            inductor's code
  no-guards the same under ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``
  direct    the compiled graph replaying a recorded generation's arguments: no dynamo at all,
            which is how ``generate(compile=True)`` runs its later steps
            (``attnlab.fast.replay.Replay``)
  call      the generated module's ``call`` on the same arguments: buffer allocation and kernel

All four grow the cache from 64 to 563 positions (``direct`` and ``call`` replay the argument
lists recorded during a warm-up generation, in order, and return the same logits: checked).
Uses inductor internals (``PyCodeCache.modules``) that may change between PyTorch releases, and
needs a fresh process: it finds the generated module among those loaded during its own compile.
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
from attnlab.bench.lm_train import SHAPES, TINY_SHAPES, LMShape
from attnlab.generate import steppers

KINDS = ("full", "no-guards", "direct", "call")
PROMPT, NEW = 64, 500  # prompt tokens, new tokens


def breakdown(shape: LMShape, prompt: int = PROMPT, new: int = NEW, rounds: int = 7) -> dict:
    """Median ms per one-token step for each of KINDS, and the number of graph inputs."""
    _, model = build_pair(shape, prompt + new)
    seen: dict = {"calls": [], "record": True}
    modules_before = set(map(id, PyCodeCache.modules))

    def backend(gm, example_inputs):
        with inductor_config.patch(steppers.STEP_OPTIONS):
            compiled = compile_fx(gm, example_inputs)

        def remember(*args):
            seen["fn"] = compiled
            if seen["record"]:
                seen["calls"].append(list(args))
            return compiled(*args)

        return remember

    step = torch.compile(type(model).forward, backend=backend)
    ids = torch.randint(0, shape.vocab, (1, prompt), generator=torch.Generator().manual_seed(9))
    token = torch.tensor([[3]])

    def steps(kind: str) -> tuple[float, torch.Tensor]:
        """ms per step over ``new - 1`` steps after a fresh prefill, and the last logits (1, V)."""
        with torch.inference_mode():
            cache = model.new_cache(1, prompt + new)
            model(ids, cache=cache)
            t0 = time.perf_counter()
            for i in range(new - 1):
                if kind == "full":
                    out = steppers._with_step_config(step, model, token, cache=cache)
                elif kind == "no-guards":
                    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                        out = steppers._with_step_config(step, model, token, cache=cache)
                elif kind == "direct":
                    out = seen["fn"](*recorded[i])
                else:
                    out = module.call(list(recorded[i]))
            seconds = time.perf_counter() - t0
        logits = out.logits if kind in ("full", "no-guards") else out[0]
        return seconds / (new - 1) * 1e3, logits.reshape(1, -1)

    steps("full")  # compiles: static shapes, then dynamic ones for the growing cache length
    seen["calls"].clear()
    _, reference = steps("full")
    recorded = list(seen["calls"])  # (new - 1) argument lists, cache length prompt .. prompt+new-2
    seen["record"] = False
    new_modules = [m for m in PyCodeCache.modules if id(m) not in modules_before]
    graphs = [m for m in new_modules if hasattr(m, "call")]
    if not graphs:
        raise RuntimeError("no newly generated module found: run this script in a fresh process")
    module = graphs[-1]  # the dynamic-shape graph
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(rounds):
        for kind in KINDS:
            ms, logits = steps(kind)
            if not torch.allclose(logits, reference, rtol=1e-4, atol=1e-5):
                raise AssertionError(f"{kind}: the last step's logits differ from the full path's")
            times[kind].append(ms)
    return {
        "ms_per_step": {k: statistics.median(v) for k, v in times.items()},
        "graph_inputs": len(recorded[0]),
    }


def main(argv: list[str]) -> None:
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)
    name = next((a for a in argv if not a.startswith("--")), "medium")
    shape, prompt, new, rounds = SHAPES[name], PROMPT, NEW, 7
    if "--tiny" in argv:
        shape, prompt, new, rounds = TINY_SHAPES[name], 8, 12, 1
    result = breakdown(shape, prompt, new, rounds)
    print(f"{name} model, {new - 1} one-token steps after a {prompt}-token prompt")
    for kind, ms in result["ms_per_step"].items():
        print(f"  {kind:10s} {ms:6.3f} ms per step (median of {rounds})")
    print(f"  graph inputs per call: {result['graph_inputs']}")


if __name__ == "__main__":
    main(sys.argv[1:])
