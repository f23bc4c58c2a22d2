"""Medium LM, compiled greedy decode after a CONTEXT-token prompt: plain vs fast vs fast without the
one-query form (fp32 cache), 5 interleaved rounds, one thread.

    PYTHONPATH=src python benchmarks/one_query_ab.py 512
"""

import copy
import sys

import torch

from attnlab.bench.generation import build_pair
from attnlab.bench.harness import interleave, setup_torch
from attnlab.bench.lm_train import SHAPES
from attnlab.fast import accelerate
from attnlab.fast.switches import PATHS
from attnlab.generate import GenerationConfig, generate

setup_torch(1)
ctx, new = int(sys.argv[1]), 200
_, plain = build_pair(SHAPES["medium"], ctx + new + 1)
fast = accelerate(copy.deepcopy(plain))
fast2 = copy.deepcopy(fast)
fast2.__class__ = type("NoOQ", (type(fast),), {})
prompt = torch.randint(
    0, SHAPES["medium"].vocab, (ctx,), generator=torch.Generator().manual_seed(0)
).tolist()
cfg = GenerationConfig(max_new_tokens=new, temperature=0.0, stop_token_ids=(), compile=True)


def w(m, oq=True):
    def work(r):
        PATHS["one_query"] = oq
        try:
            return float(len(generate(m, [prompt], cfg).tokens[0]))
        finally:
            PATHS["one_query"] = True

    return work


t = interleave(
    {"plain_compiled": w(plain), "fast_compiled": w(fast), "fast - one_query": w(fast2, False)},
    rounds=5,
    warmup=2,
    min_round_s=1.0,
)
for k, v in t.items():
    print(ctx, k, [round(x, 1) for x in v.rates])
