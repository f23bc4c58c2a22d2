"""Optimisers and the learning-rate schedule: AdamW with decoupled weight decay, optional Muon.

AdamW (Loshchilov & Hutter 2019) applies weight decay outside the adaptive update:

    theta <- theta - lr * (m_hat / (sqrt(v_hat) + eps) + wd * theta)

Decay is a prior that large weights are unlikely; it makes sense for matrices that mix features
(Linear / recurrent weights) and not for norm gains, biases, embedding tables or position tables,
whose scale carries meaning. :func:`parameter_groups` decides by the module that owns a parameter
and by its dimension, so it works for every model family without naming conventions. A tied
parameter (``lm_head.weight is tok_emb.weight``) is one tensor: it is counted once, and because an
Embedding owns it, it is not decayed.

Muon (Jordan et al. 2024; :class:`attnlab.train.muon.Muon`, ``torch.optim.Muon`` with its
Newton-Schulz iteration in fp32 where bf16 is emulated) orthogonalises the momentum of 2-D hidden
weight matrices with a Newton-Schulz iteration. It is meant for hidden matrices only, so embeddings,
the output head, norms and biases stay with AdamW (:func:`build_optimizers` returns both).

The schedule is a plain function of the step (no ``LambdaLR`` state), so resuming at step s
needs nothing but s:

    warm-up   lr_s = lr * (s + 1) / warmup_steps                       for s < warmup_steps
    cosine    lr_s = min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,  p = (s - W) / (S - W)
    linear    lr_s = lr - (lr - min_lr) * p
    constant  lr_s = lr
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from attnlab.errors import ConfigValueError
from attnlab.train.muon import Muon

# Modules whose parameters are never decayed nor given to Muon: tables and normalisers.
_TABLES = (nn.Embedding, nn.EmbeddingBag)
_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.RMSNorm)
_HEAD_NAMES = ("lm_head", "head", "classifier", "out_head", "output")


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, _NORMS) or "norm" in type(module).__name__.lower()


def _owners(model: nn.Module) -> dict[int, list[tuple[str, nn.Module]]]:
    """For every parameter tensor (by identity) the (qualified name, module) pairs that own it."""
    owners: dict[int, list[tuple[str, nn.Module]]] = {}
    for mod_name, module in model.named_modules(remove_duplicate=False):
        for p_name, p in module.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            owners.setdefault(id(p), []).append((full, module))
    return owners


def _head_ids(model: nn.Module) -> set[int]:
    """Parameters of the output projection (``lm_head`` / a classifier ``head``), by name.

    Widths cannot tell a head apart (a vocabulary may be as wide as d_model), names can: every
    attnlab model calls its output projection ``lm_head`` or ``head``.
    """
    ids: set[int] = set()
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in _HEAD_NAMES:
            ids.update(id(p) for p in module.parameters(recurse=False))
    return ids


def split_parameters(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Partition trainable parameters into ``decay``, ``no_decay`` and ``hidden_matrices``.

    ``hidden_matrices`` (a subset of ``decay``) are the 2-D weights Muon may take: every decayed
    2-D weight that is not the output head. Each tensor appears once, under its first name.
    """
    owners = _owners(model)
    heads = _head_ids(model)
    groups: dict[str, list[tuple[str, nn.Parameter]]] = {
        "decay": [],
        "no_decay": [],
        "hidden_matrices": [],
    }
    for name, p in model.named_parameters():  # deduplicates tied tensors
        if not p.requires_grad:
            continue
        mods = [m for _, m in owners.get(id(p), [])]
        table = any(isinstance(m, _TABLES) for m in mods)
        norm = any(_is_norm(m) for m in mods)
        if p.dim() < 2 or table or norm:
            groups["no_decay"].append((name, p))
            continue
        groups["decay"].append((name, p))
        if p.dim() == 2 and id(p) not in heads:
            groups["hidden_matrices"].append((name, p))
    return groups


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups: weight matrices decayed, everything else not."""
    split = split_parameters(model)
    return [
        {"params": [p for _, p in split["decay"]], "weight_decay": weight_decay},
        {"params": [p for _, p in split["no_decay"]], "weight_decay": 0.0},
    ]


def build_optimizers(model: nn.Module, cfg: Any) -> list[torch.optim.Optimizer]:
    """The optimisers of a run (``cfg`` is a TrainConfig): ``[AdamW]`` or ``[Muon, AdamW]``.

    Each param group records its peak rate as ``base_lr``; :func:`set_lr` scales it each step.
    """
    split = split_parameters(model)
    adam_kw = dict(betas=tuple(cfg.betas), eps=cfg.eps, fused=fused_available(model))
    if cfg.optimizer == "adamw":
        groups = parameter_groups(model, cfg.weight_decay)
        groups = [dict(g, lr=cfg.lr, base_lr=cfg.lr) for g in groups if g["params"]]
        return [torch.optim.AdamW(groups, **adam_kw)]
    if cfg.optimizer != "muon":
        raise ConfigValueError(
            f"unknown optimizer {cfg.optimizer!r}; choose 'adamw' or 'muon'", fields=("optimizer",)
        )
    hidden = {id(p) for _, p in split["hidden_matrices"]}
    if not hidden:
        raise ConfigValueError(
            "optimizer='muon' found no 2-D hidden weight matrices in the model; "
            "use optimizer='adamw'",
            fields=("optimizer",),
        )
    rest_decay = [p for _, p in split["decay"] if id(p) not in hidden]
    rest = [
        {"params": rest_decay, "weight_decay": cfg.weight_decay, "lr": cfg.lr, "base_lr": cfg.lr},
        {
            "params": [p for _, p in split["no_decay"]],
            "weight_decay": 0.0,
            "lr": cfg.lr,
            "base_lr": cfg.lr,
        },
    ]
    muon_group = {
        "params": [p for _, p in split["hidden_matrices"]],
        "lr": cfg.muon_lr,
        "base_lr": cfg.muon_lr,
        "weight_decay": cfg.weight_decay,
    }
    muon = Muon([muon_group], lr=cfg.muon_lr, weight_decay=cfg.weight_decay)
    adamw = torch.optim.AdamW([g for g in rest if g["params"]], **adam_kw)
    return [muon, adamw]


def fused_available(model: nn.Module) -> bool:
    """Whether AdamW can run its fused kernel: one pass per tensor instead of ~10 foreach ops.

    PyTorch's fused AdamW takes floating-point parameters on CPU or CUDA (same update rule, the
    arithmetic in one kernel); anything else falls back to the default implementation.
    """
    params = list(model.parameters())
    return bool(params) and all(
        p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params
    )


def lr_multiplier(step: int, cfg: Any) -> float:
    """The schedule's factor in [min_lr/lr, 1] for optimiser step ``step`` (0-based)."""
    warmup, total = cfg.warmup_steps, cfg.steps
    if step < warmup:
        return (step + 1) / warmup
    floor = cfg.min_lr / cfg.lr
    if cfg.lr_schedule == "constant":
        return 1.0
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    if cfg.lr_schedule == "linear":
        return 1.0 - (1.0 - floor) * p
    if cfg.lr_schedule == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown lr_schedule {cfg.lr_schedule!r}")


def lr_at(step: int, cfg: Any) -> float:
    """The (AdamW) learning rate at optimiser step ``step``: warm-up, then the decay above."""
    return cfg.lr * lr_multiplier(step, cfg)


def set_lr(optimizers: Iterable[torch.optim.Optimizer], step: int, cfg: Any) -> float:
    """Apply the schedule of ``step`` to every param group; return the AdamW rate."""
    factor = lr_multiplier(step, cfg)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group.get("base_lr", cfg.lr) * factor
    return cfg.lr * factor


def clip_gradients(parameters: Iterable[nn.Parameter], max_norm: float) -> float:
    """Scale gradients so their global L2 norm is at most ``max_norm`` (0 = only measure it).

    Returns the norm before clipping (a useful training signal; inf/NaN means divergence).
    """
    return float(clip_gradient_norm(parameters, max_norm))


def clip_gradient_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """:func:`clip_gradients` with the norm left on the device as a 0-d tensor (no host sync)."""
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return torch.zeros(())
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    norms = torch.stack([g.detach().norm() for p in params if (g := p.grad) is not None])
    return norms.norm()
