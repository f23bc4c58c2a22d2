"""Optimiser parameter groups, Muon split, the learning-rate schedule and gradient clipping."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.models import build_model
from attnlab.train.optim import (
    build_optimizers,
    clip_gradients,
    lr_at,
    parameter_groups,
    split_parameters,
)
from attnlab.train.run_config import TrainConfig
from tiny_configs import tiny_config


def _model(kind: str = "decoder_lm", **kw) -> nn.Module:
    return build_model(tiny_config(kind, **{"vocab_size": 40, **kw}))


def _names(pairs) -> set[str]:
    return {n for n, _ in pairs}


def test_no_decay_on_norms_biases_embeddings_and_tied_head_counted_once():
    model = _model(tie_embeddings=True)
    split = split_parameters(model)
    decay, no_decay = _names(split["decay"]), _names(split["no_decay"])
    assert not decay & no_decay
    every = {id(p) for p in model.parameters()}  # parameters() deduplicates the tied tensor
    grouped = [id(p) for _, p in split["decay"] + split["no_decay"]]
    assert sorted(grouped) == sorted(every)  # each tensor exactly once
    assert "embed.tok_emb.weight" in no_decay and "lm_head.weight" not in decay | no_decay
    assert "embed.pos_enc.table.weight" in no_decay  # learned positions are a table too
    assert all(n.endswith("bias") or "norm" in n or "embed" in n for n in no_decay)
    assert decay == {n for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n}
    groups = parameter_groups(model, 0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]


def test_untied_head_is_decayed_but_never_given_to_muon():
    model = _model(tie_embeddings=False)
    split = split_parameters(model)
    assert "lm_head.weight" in _names(split["decay"])
    hidden = _names(split["hidden_matrices"])
    assert "lm_head.weight" not in hidden and not any("emb" in n for n in hidden)
    assert "blocks.0.self_attn.qkv_proj.weight" in hidden


def test_muon_takes_hidden_matrices_and_adamw_the_rest():
    model = _model("encoder_decoder")
    muon, adamw = build_optimizers(model, TrainConfig(optimizer="muon", muon_lr=0.01))
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    in_adam = {id(p) for g in adamw.param_groups for p in g["params"]}
    assert not in_muon & in_adam
    assert in_muon | in_adam == {id(p) for p in model.parameters()}
    assert all(p.dim() == 2 for g in muon.param_groups for p in g["params"])
    assert muon.param_groups[0]["base_lr"] == 0.01
    (opt,) = build_optimizers(model, TrainConfig(optimizer="adamw"))
    assert isinstance(opt, torch.optim.AdamW)


def test_recurrent_models_get_groups_too():
    pytest.importorskip("attnlab.models.rnn_lm")
    model = _model("rnn_lm")
    split = split_parameters(model)
    assert split["decay"] and split["no_decay"]
    assert not any(n.endswith("bias") for n in _names(split["decay"]))


def test_warmup_then_cosine_to_min_lr():
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, steps=110)
    assert lr_at(0, cfg) == pytest.approx(1e-4)  # (0 + 1) / 10 of the peak
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(60, cfg) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(110, cfg) == pytest.approx(1e-4)
    rates = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))  # monotone decay


def test_linear_and_constant_schedules():
    lin = TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=0, steps=100, lr_schedule="linear")
    assert lr_at(50, lin) == pytest.approx(0.5)
    const = TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=5, steps=100, lr_schedule="constant")
    assert lr_at(2, const) == pytest.approx(0.6) and lr_at(99, const) == 1.0


def test_clip_gradients_scales_to_max_norm_and_reports_the_old_norm():
    p = nn.Parameter(torch.zeros(4))
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0])
    assert clip_gradients([p], 1.0) == pytest.approx(5.0)
    assert float(p.grad.norm()) == pytest.approx(1.0)
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0])
    assert clip_gradients([p], 0.0) == pytest.approx(5.0)  # 0 = measure only
    assert float(p.grad.norm()) == pytest.approx(5.0)


def test_adamw_uses_the_fused_kernel_on_cpu_and_matches_the_default_update():
    model = _model()
    cfg = TrainConfig(task="lm", data="x", lr=1e-2, weight_decay=0.1)
    (fused,) = build_optimizers(model, cfg)
    assert all(g["fused"] for g in fused.param_groups)
    reference = _model()
    reference.load_state_dict(model.state_dict())
    (plain,) = build_optimizers(reference, cfg)
    for g in plain.param_groups:
        g["fused"] = False
    ids = torch.randint(0, 40, (2, 8))
    for net, opt in ((model, fused), (reference, plain)):
        for _ in range(3):
            net(ids).logits.square().mean().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
