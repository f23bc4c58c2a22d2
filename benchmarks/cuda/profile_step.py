"""Where the gpu-char step's time goes: the kernels of its step, eager and compiled.

Times a bf16-autocast training step (forward, cross-entropy, backward; no optimizer) of the
nanoGPT-char model (6 x 384, context 256, batch 64, dropout 0.2) for several position/norm
variants, eager and under ``torch.compile(model)``, and prints the CUDA kernels that take the
most time in one step of the ones worth reading (torch.profiler). One candidate change is tried by
patching the class here, before any lands in ``attnlab.nn``:

  qk_norm:fp32   RMSNorm written out in float32 (a * rsqrt(mean a^2 + eps) * g), which inductor
                 fuses into one kernel, instead of F.rms_norm on a bf16 input with a cast weight

(On 28 Nov 2026 a second patch, rotary cos/sin read from a table, measured 10.6 ms against 29.5 ms
for the float64 cos/sin that inductor inlined into the rotation kernel; that table is now
``RotaryPositions``' own compiled path, so the rotary rows here measure it.)

    PYTHONPATH=src python benchmarks/cuda/profile_step.py [--tiny] [--out DIR]

``--tiny`` runs a 2-layer model on the CPU (a check of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from diagnose_step import BASE  # the nanoGPT-char model diagnose_step.py times
from torch.profiler import ProfilerActivity, profile

from attnlab.config import ModelConfig
from attnlab.models import build_model
from attnlab.nn.norms import RMSNorm

TINY = dict(BASE, d_model=64, n_heads=2, n_layers=2, max_len=32)
# (name, model options, patches, compiled)
RUNS = [
    ("learned", dict(positional="learned"), (), False),
    ("rotary", dict(positional="rotary"), (), False),
    ("qk_norm", dict(positional="learned", qk_norm=True), (), False),
    ("qk_norm:fp32", dict(positional="learned", qk_norm=True), ("fp32",), False),
    ("rotary+qk_norm", dict(positional="rotary", qk_norm=True), (), False),
    ("learned", dict(positional="learned"), (), True),
    ("rotary+qk_norm", dict(positional="rotary", qk_norm=True), (), True),
    ("rotary+qk_norm:fp32", dict(positional="rotary", qk_norm=True), ("fp32",), True),
]
KERNEL_TABLES = {("rotary", False), ("rotary+qk_norm", True), ("qk_norm", False)}


def rms_fp32(self: RMSNorm, a: torch.Tensor) -> torch.Tensor:
    x = a.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    if self.weight is not None:
        x = x * self.weight.float()
    return x.to(a.dtype)


@contextlib.contextmanager
def patched(names: tuple[str, ...]):
    forward = RMSNorm.forward
    if "fp32" in names:
        RMSNorm.forward = rms_fp32
    try:
        yield
    finally:
        RMSNorm.forward = forward


def make_step(model, ids, targets, device):
    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(ids).logits
        F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).backward()

    return step


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(step, n: int, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return 1e3 * (time.perf_counter() - t0) / n


def kernel_table(step, device, rows: int = 14) -> list[dict]:
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        step()
        sync(device)
    key = "device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key, 0) > 0]
    if device.type == "cuda":  # kernels only (no aten:: wrappers, which double-count)
        events = [e for e in events if not e.key.startswith(("aten::", "autograd::", "cuda"))]
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    return [
        {"kernel": e.key[:110], "calls": e.count, "ms": round(getattr(e, key) / 1e3, 3)}
        for e in events[:rows]
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="2 layers on the CPU: checks the script")
    p.add_argument("--out", type=Path, default=None, help="folder for profile_step.json")
    p.add_argument("--steps", type=int, default=20, help="timed steps per row")
    args = p.parse_args(argv)
    device = torch.device("cpu" if args.tiny else "cuda")
    base, batch = (TINY, 4) if args.tiny else (BASE, 64)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 69, (batch, base["max_len"] + 1), generator=gen).to(device)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    rows = []
    for name, kw, patches, compiled in RUNS:
        torch.manual_seed(0)
        with patched(patches):
            model = build_model(ModelConfig(**base, **kw)).to(device).train()
            if compiled:  # a new model of the same structure would reuse the last graph
                torch._dynamo.reset()
            net = torch.compile(model) if compiled else model
            step = make_step(net, x, y, device)
            t0 = time.perf_counter()
            step()
            sync(device)
            first = time.perf_counter() - t0
            for _ in range(3):
                step()
            ms = timed(step, 2 if args.tiny else args.steps, device)
            row = {"variant": name, "compiled": compiled, "step_ms": round(ms, 2),
                   "first_step_s": round(first, 2)}  # fmt: skip
            if (name, compiled) in KERNEL_TABLES:
                row["kernels"] = kernel_table(step, device)
        rows.append(row)
        mode = "compiled" if compiled else "eager"
        print(f"{name:28s} {mode:8s} step {ms:8.2f} ms  (first step {first:5.1f} s)", flush=True)
        for k in row.get("kernels", []):
            print(f"      {k['ms']:8.3f} ms {k['calls']:5d} x  {k['kernel']}", flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "profile_step.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
