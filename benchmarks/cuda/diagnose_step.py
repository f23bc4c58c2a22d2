"""Where a GPU training step of the nanoGPT-char model goes, by model feature (issue 37).

Times an eager bf16-autocast training step (forward, cross-entropy, backward; no optimizer) of
attnlab's 6 x 384 decoder at context 256, batch 64, for learned positions, rotary, QK-norm and
both, and counts the host-device copies and synchronisations one step makes (torch.profiler),
then times one validation pass of 100 batches as ``attnlab train`` runs it.

    PYTHONPATH=src python benchmarks/cuda/diagnose_step.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from attnlab.config import ModelConfig
from attnlab.models import build_model

BASE = dict(kind="decoder_lm", vocab_size=69, d_model=384, n_heads=6, n_layers=6, max_len=256,
            dropout=0.2, activation="gelu", bias=False)  # fmt: skip
VARIANTS = {
    "learned": dict(positional="learned"),
    "rotary": dict(positional="rotary"),
    "qk_norm": dict(positional="learned", qk_norm=True),
    "rotary+qk_norm": dict(positional="rotary", qk_norm=True),
}


def step_fn(model, ids, targets):
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids).logits
        F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).backward()

    return step


def timed(step, n: int) -> float:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / n


def host_events(step) -> dict[str, int]:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    names = ("cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize", "aten::_to_copy")
    counts = {n: 0 for n in names}
    for e in prof.key_averages():
        if e.key in counts:
            counts[e.key] = e.count
    return counts


def main() -> None:
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 69, (64, 257), generator=gen).to(device)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    for name, kw in VARIANTS.items():
        torch.manual_seed(0)
        model = build_model(ModelConfig(**BASE, **kw)).to(device).train()
        step = step_fn(model, x, y)
        ms = timed(step, 10)
        print(f"{name:16s} eager step {ms:7.2f} ms   host events {host_events(step)}", flush=True)
    from attnlab.data.batching import LMBatch
    from attnlab.train.evaluate import GPU_EVAL_TOKENS, merged_lm_batches

    model = build_model(ModelConfig(**BASE, positional="learned")).to(device).eval()
    windows = [LMBatch(x, y)] * 100
    for label, batches in (
        ("64 x 256", windows),
        ("merged", merged_lm_batches(windows, GPU_EVAL_TOKENS)),
    ):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for b in batches:
                model(b.x).logits.float().sum()
        torch.cuda.synchronize()
        print(f"validation pass, 100 batches ({label}): {time.perf_counter() - t0:.3f} s")


if __name__ == "__main__":
    main()
