"""The fixed cost a compiled CUDA run pays to PyTorch before its first step (issue 37 item 3).

Times, in a fresh process each round: ``import torch``, the CUDA context's start-up, importing
torch._dynamo (which torch.optim's first optimizer imports), ``torch.compile`` of a module (which
imports torch._inductor) and its first compiled call with a warm cache, and then ``import
attnlab.cli`` on top. attnlab cannot go below the torch rows short of not using torch.compile.

    PYTHONPATH=src python benchmarks/cuda/import_floor.py [--rounds 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, time
t = time.perf_counter(); out = {}
def lap(name):
    global t
    now = time.perf_counter(); out[name] = round(now - t, 3); t = now
import torch; lap("import torch")
device = torch.device(sys.argv[1])
x = torch.zeros(8, 64, device=device)
if device.type == "cuda": torch.cuda.synchronize()
lap("device start-up")
import torch._dynamo; lap("import torch._dynamo")
f = torch.compile(torch.nn.Linear(64, 64).to(device)); lap("torch.compile()")
f(x).sum().backward()
if device.type == "cuda": torch.cuda.synchronize()
lap("first compiled call")
import attnlab.cli; lap("import attnlab.cli")
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    rounds = []
    for _ in range(args.rounds + 1):  # the first warms the compile cache, not reported
        res = subprocess.run([sys.executable, "-c", CHILD, args.device], capture_output=True,
                             text=True, check=True)  # fmt: skip
        rounds.append(json.loads(res.stdout.strip().splitlines()[-1]))
    rounds = rounds[1:]
    for name in rounds[0]:
        print(f"{name:22s} " + " / ".join(f"{r[name]:6.2f}" for r in rounds) + " s")
    total = [sum(r.values()) for r in rounds]
    print(f"{'total':22s} " + " / ".join(f"{v:6.2f}" for v in total) + " s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
