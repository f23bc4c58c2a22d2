"""Suite ``optim``: what Muon costs next to AdamW, per training step, on the device it runs on.

Muon (``attnlab.train.muon``) orthogonalises every hidden matrix's momentum with a Newton-Schulz
iteration; AdamW is a fused elementwise update. On a GPU a small model's Muon step used to be
bound by kernel launches (one chain of products per matrix), so the suite times, in interleaved
rounds on one batch per round, the optimizers the training loop builds
(``attnlab.train.optim.build_optimizers``, the same code ``attnlab train`` runs):

    step_adamw         forward + cross-entropy + backward + AdamW (fused) on every parameter
    step_muon          the same with Muon on the hidden matrices, AdamW on the rest
    opt_adamw          the optimizer update alone (gradients kept from one backward)
    opt_muon           Muon + AdamW update alone: same-shape matrices orthogonalised as a batch
    opt_muon_per_matrix  the same update with one param group per matrix, so every matrix runs
                       its own Newton-Schulz chain: the pre-batching form, kept as the reference

and reports ``step_muon / step_adamw`` (target <= 1.2 on CUDA at nanoGPT's shakespeare-char
shape) and ``opt_muon / opt_muon_per_matrix`` (the batched form must not be slower, on any
device). The model is attnlab's ``DecoderLM`` with rotary positions and QK-norm (the fast recipe's
architecture). Device: CUDA when available (bf16 autocast, nanoGPT's 6 x 384 model, context 256,
batch 64), else the CPU (fp32, the ``baseline-char`` preset's 4 x 128 model, context 64, batch 12).
``--compile`` compiles the model's forward for the two full-step contenders.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.bench.harness import interleave, ratio, target_entry
from attnlab.bench.lm_train import LMShape, attnlab_config, make_batches
from attnlab.models import build_model
from attnlab.train.optim import build_optimizers

TARGET_STEP_RATIO = 1.2  # Muon step <= 1.2 x AdamW step (issue 37), on CUDA
SHAPES = {
    "cuda": LMShape("nanogpt_char", 6, 6, 384, 256, 64),
    "cpu": LMShape("char_4x128", 4, 4, 128, 64, 12),
}
TINY_SHAPE = LMShape("tiny", 2, 2, 32, 16, 2)
CPU_NOTE = (
    "the 1.2 target is for CUDA; on a CPU the Newton-Schulz products are real arithmetic, "
    "not launch overhead, and cost their share of a small model's step"
)


def _model(shape: LMShape, device: torch.device, seed: int = 0):
    torch.manual_seed(seed)
    cfg = attnlab_config(shape).replace(positional="rotary", qk_norm=True)
    return build_model(cfg).to(device).train()


def _optimizers(model, optimizer: str, per_matrix: bool = False):
    """The loop's optimizers (``build_optimizers``); ``per_matrix`` splits Muon's group."""
    cfg = SimpleNamespace(
        optimizer=optimizer, lr=1e-3, muon_lr=0.02, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-8
    )
    opts = build_optimizers(model, cfg)
    if per_matrix and optimizer == "muon":
        muon = opts[0]
        (group,) = muon.param_groups
        params = group.pop("params")
        muon.param_groups = [dict(group, params=[p]) for p in params]
    return opts


def make_works(shape: LMShape, device: torch.device, amp: bool, compiled: bool, rounds: int):
    """{contender: work(r) -> steps} for the five contenders of the module docstring."""
    batches = [(x.to(device), y.to(device)) for x, y in make_batches(shape, max(rounds, 1))]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def loss_of(forward, r: int):
        ids, targets = batches[max(r, 0) % len(batches)]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = forward(ids).logits  # (B, T, V)
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))

    def full_step(optimizer: str):
        model = _model(shape, device)
        forward = torch.compile(model) if compiled else model
        opts = _optimizers(model, optimizer)

        def work(r: int) -> float:
            loss_of(forward, r).backward()
            for opt in opts:
                opt.step()
                opt.zero_grad(set_to_none=True)
            sync()
            return 1.0

        return work

    def update_only(optimizer: str, per_matrix: bool = False):
        model = _model(shape, device)
        loss_of(model, 0).backward()  # gradients kept: each call is one update
        opts = _optimizers(model, optimizer, per_matrix)

        def work(r: int) -> float:
            for opt in opts:
                opt.step()
            sync()
            return 1.0

        return work

    return {
        "step_adamw": full_step("adamw"),
        "step_muon": full_step("muon"),
        "opt_adamw": update_only("adamw"),
        "opt_muon": update_only("muon"),
        "opt_muon_per_matrix": update_only("muon", per_matrix=True),
    }


def run(settings, ctx) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = TINY_SHAPE if settings.tiny else SHAPES[device.type]
    amp = device.type == "cuda"
    ctx.say(f"optim: AdamW vs Muon steps on {device.type}, shape {shape.name}")
    t0 = time.perf_counter()
    works = make_works(shape, device, amp, settings.compile, settings.rounds)
    timings = interleave(
        works, rounds=settings.rounds, warmup=max(settings.warmup, 2),
        min_round_s=settings.min_round_s,
    )  # fmt: skip
    ms = {k: 1e3 * t.median_seconds_per_call for k, t in timings.items()}
    step_ratio = ratio(ms["step_muon"], ms["step_adamw"])
    batched_ratio = ratio(ms["opt_muon"], ms["opt_muon_per_matrix"])
    ctx.say(
        f"  Muon step {ms['step_muon']:.2f} ms vs AdamW {ms['step_adamw']:.2f} ms "
        f"({step_ratio:.2f}x); Muon update batched {ms['opt_muon']:.2f} ms vs per matrix "
        f"{ms['opt_muon_per_matrix']:.2f} ms"
    )
    return {
        "status": "ok",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": shape.__dict__,
        "autocast_bf16": amp,
        "compiled": settings.compile,
        "ms_per_call": ms,
        "contenders": {k: t.to_dict("calls") for k, t in timings.items()},
        "muon_vs_adamw_step": step_ratio,
        "muon_batched_vs_per_matrix": batched_ratio,
        "seconds": time.perf_counter() - t0,
        "targets": [
            target_entry(
                "muon_step_vs_adamw",
                f"training-step time with Muon / with AdamW on {device.type} (lower is better; "
                "the target is set for CUDA)",
                step_ratio,
                TARGET_STEP_RATIO,
                higher_is_better=False,
                note="" if device.type == "cuda" else CPU_NOTE,
            ),
            target_entry(
                "muon_batched_vs_per_matrix",
                "Muon update time, same-shape matrices batched / each matrix alone (lower is "
                "better)",
                batched_ratio,
                1.0,
                higher_is_better=False,
            ),
        ],
    }
