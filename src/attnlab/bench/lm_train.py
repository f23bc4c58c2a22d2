"""Suite ``lm``: language-model training throughput, attnlab vs GPT-2 (HF) vs nn.TransformerEncoder.

One training step = forward + cross-entropy over every position + backward + AdamW step, fp32,
dropout 0, on (B, T) random character ids (vocab 65, the tinyshakespeare character set). All
contenders are the same architecture: pre-norm GPT-2 blocks (LayerNorm, fused QKV, W^O, GELU
feed-forward with F = 4D, learned positions, final LayerNorm, head tied to the embedding):

    attnlab        attnlab.models.DecoderLM, activation gelu_tanh
    attnlab_compiled  the same under ``torch.compile`` (only with ``--compile``); its first step
                   (compilation included) is timed separately as ``first_step_seconds``
    hf_gpt2_sdpa   transformers.GPT2LMHeadModel, attn_implementation="sdpa" (HF's default)
    hf_gpt2_eager  the same with attn_implementation="eager" (explicit softmax(QK^T)V)
    torch_nn       nn.Embedding x2 + nn.TransformerEncoder(norm_first=True, batch_first=True,
                   activation="gelu") with a causal mask (is_causal=True) + LayerNorm + tied head
    attnlab_bf16, hf_gpt2_bf16  attnlab and GPT-2 (sdpa) under
                   ``torch.autocast("cpu", dtype=torch.bfloat16)`` (fp32 weights and optimizer,
                   bf16 matmuls): timed only when the CPU runs bf16 natively (AVX-512 BF16 / AMX)
                   and not in --quick; they show what bf16 autocast buys and are not part of the
                   fp32 targets (their FLOP/s are still divided by the fp32 matmul peak)

Every contender uses ``torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)`` with
PyTorch's default implementation, and in round r every contender trains on the same batch r.

Achieved FLOP/s (Kaplan et al. 2020; PaLM App. B): per token, 6 N + 12 L D T, where N counts the
non-embedding parameters (the tied head is the embedding matrix), L layers, D width, T context.
``fraction_of_peak`` divides that by the dense fp32 matmul rate measured in the same run: the
larger of the ``matmul`` suite's peak and a square fp32 matmul timed as one more contender in the
same interleaved rounds as the LM steps (so a load spike during either cannot inflate the
fraction).

Shapes: B batch, T context, D width, L layers, H heads, V vocabulary.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.bench.harness import Workload, interleave, ratio, target_entry
from attnlab.bench.matmul_peak import make_matmul, sizes_for
from attnlab.config import ModelConfig
from attnlab.models import build_model
from attnlab.runtime import cpu_has_native_bf16

VOCAB = 65
CONTENDERS = (
    "attnlab",
    "attnlab_compiled",
    "hf_gpt2_sdpa",
    "hf_gpt2_eager",
    "torch_nn",
    "attnlab_bf16",
    "hf_gpt2_bf16",
)
BASELINE = "hf_gpt2_sdpa"
TARGETS = {"small": 2.2, "medium": 1.5}  # attnlab tokens/s >= target x GPT-2's (issue 6)
PEAK_TARGET = 0.75  # fraction of matmul FLOP/s at the medium shape


@dataclass(frozen=True)
class LMShape:
    """One benchmark shape: depth, heads, width, context, batch."""

    name: str
    n_layers: int
    n_heads: int
    d_model: int
    context: int
    batch: int
    vocab: int = VOCAB


SHAPES = {
    "small": LMShape("small", 4, 4, 128, 64, 12),  # the classic CPU character-level recipe
    "medium": LMShape("medium", 6, 6, 384, 256, 8),  # nanoGPT's shakespeare-char model
}
TINY_SHAPES = {  # --tiny: toy sizes for tests
    "small": LMShape("small", 2, 2, 32, 16, 2),
    "medium": LMShape("medium", 2, 2, 48, 24, 2),
}


class TorchEncoderLM(nn.Module):
    """The plain-PyTorch baseline: what a user writes with nn.TransformerEncoder.

    ids (B, T) -> logits (B, T, V). Causal through ``mask`` + ``is_causal=True``.
    """

    def __init__(self, shape: LMShape, max_len: int | None = None):
        super().__init__()
        d = shape.d_model
        self.tok_emb = nn.Embedding(shape.vocab, d)
        self.pos_emb = nn.Embedding(max_len or shape.context, d)
        layer = nn.TransformerEncoderLayer(
            d,
            shape.n_heads,
            dim_feedforward=4 * d,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, shape.n_layers, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, shape.vocab, bias=False)
        self.lm_head.weight = self.tok_emb.weight

    def forward(self, ids: Tensor) -> Tensor:
        t = ids.size(1)
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(t, device=ids.device))  # (B, T, D)
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)  # (T, T)
        x = self.encoder(x, mask=mask, is_causal=True)  # (B, T, D)
        return self.lm_head(self.final_norm(x))  # (B, T, V)


def hf_gpt2_config(shape: LMShape, n_positions: int, attn: str = "sdpa") -> Any:
    """A transformers GPT2Config of ``shape``: dropout 0, no special tokens (65-char vocab)."""
    from transformers import GPT2Config  # optional (dev extra): the reference only

    return GPT2Config(
        vocab_size=shape.vocab,
        n_positions=n_positions,
        n_embd=shape.d_model,
        n_layer=shape.n_layers,
        n_head=shape.n_heads,
        n_inner=4 * shape.d_model,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation=attn,
    )


def attnlab_config(shape: LMShape, max_len: int | None = None) -> Any:
    return ModelConfig(
        kind="decoder_lm",
        vocab_size=shape.vocab,
        d_model=shape.d_model,
        n_heads=shape.n_heads,
        n_layers=shape.n_layers,
        d_ff=4 * shape.d_model,
        max_len=max_len or shape.context,
        dropout=0.0,
        positional="learned",
        norm="layernorm",
        norm_placement="pre",
        activation="gelu_tanh",
        tie_embeddings=True,
    )


def build_lm(contender: str, shape: LMShape, seed: int = 0):
    """(model, forward) where forward(ids (B, T)) -> logits (B, T, V)."""
    if contender.endswith("_bf16"):
        base = {"attnlab_bf16": "attnlab", "hf_gpt2_bf16": "hf_gpt2_sdpa"}[contender]
        model, forward = build_lm(base, shape, seed)

        def autocast_forward(ids: Tensor) -> Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return forward(ids).float()  # (B, T, V) fp32 logits for the loss

        return model, autocast_forward
    torch.manual_seed(seed)
    if contender in ("attnlab", "attnlab_compiled"):
        model = build_model(attnlab_config(shape))
        if contender == "attnlab_compiled":
            compiled = torch.compile(model)
            return model, lambda ids: compiled(ids).logits
        return model, lambda ids: model(ids).logits
    if contender in ("hf_gpt2_sdpa", "hf_gpt2_eager"):
        from transformers import GPT2LMHeadModel  # optional (dev extra): the reference only

        cfg = hf_gpt2_config(shape, shape.context, contender.rsplit("_", 1)[1])
        model = GPT2LMHeadModel(cfg)
        return model, lambda ids: model(input_ids=ids, use_cache=False).logits
    if contender == "torch_nn":
        model = TorchEncoderLM(shape)
        return model, model
    raise ValueError(f"unknown LM contender {contender!r}; choose from {CONTENDERS}")


def make_batches(shape: LMShape, n: int, seed: int = 1234) -> list[tuple[Tensor, Tensor]]:
    """``n`` (ids, targets) pairs of shape (B, T); batch r is shared by every contender."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        seq = torch.randint(0, shape.vocab, (shape.batch, shape.context + 1), generator=gen)
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))  # (B, T) each
    return out


def make_train_step(model: nn.Module, forward, batches: list[tuple[Tensor, Tensor]]):
    """work(r) -> tokens: one optimizer step on batch r (batch 0 for warm-up calls)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)

    def work(r: int) -> float:
        ids, targets = batches[max(r, 0) % len(batches)]
        logits = forward(ids)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(ids.numel())

    return work


def non_embedding_params(model: nn.Module) -> int:
    """Parameters outside nn.Embedding tables (each tensor once, so a tied head is not counted)."""
    embedding = {
        id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    }
    unique = {id(p): p for p in model.parameters()}
    return sum(p.numel() for k, p in unique.items() if k not in embedding)


def flops_per_token(n_non_embedding: int, shape: LMShape) -> float:
    """6 N + 12 L D T: forward+backward matmul FLOPs per trained token (Kaplan; PaLM App. B)."""
    return 6.0 * n_non_embedding + 12.0 * shape.n_layers * shape.d_model * shape.context


def memory_case(spec: dict[str, Any]):
    """A training step for :mod:`attnlab.bench.memory` (spec: contender, shape)."""
    shape = LMShape(**spec["shape"])
    model, forward = build_lm(spec["contender"], shape)
    work = make_train_step(model, forward, make_batches(shape, 1))
    return lambda: work(0)


def contenders_for(settings) -> list[str]:
    names = list(CONTENDERS)
    if not settings.hf_eager:
        names.remove("hf_gpt2_eager")
    if not settings.compile:
        names.remove("attnlab_compiled")
    if settings.quick or settings.tiny or not cpu_has_native_bf16():
        names = [n for n in names if not n.endswith("_bf16")]
    return names


def run(settings, ctx) -> dict[str, Any]:
    """Time every contender at both shapes; ratios vs GPT-2 (sdpa) and fraction of matmul peak."""
    shapes = TINY_SHAPES if settings.tiny else SHAPES
    peak = ctx.matmul_peak_gflops()
    results, targets = [], []
    for shape in shapes.values():
        batches = make_batches(shape, settings.rounds)
        works: dict[str, Workload] = {}
        info: dict[str, dict[str, Any]] = {}
        for name in contenders_for(settings):
            try:
                model, forward = build_lm(name, shape)
            except ImportError as err:
                info[name] = {"name": name, "status": "not_available", "reason": str(err)}
                continue
            n = non_embedding_params(model)
            info[name] = {
                "name": name,
                "status": "ok",
                "params": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
                "non_embedding_params": n,
                "flops_per_token": flops_per_token(n, shape),
            }
            works[name] = make_train_step(model, forward, batches)
            if name == "attnlab_compiled":  # the first step compiles: time it, untimed later
                ctx.say(f"lm {shape.name}: compiling attnlab (torch.compile)")
                t0 = time.perf_counter()
                works[name](-1)
                info[name]["first_step_seconds"] = time.perf_counter() - t0
        ctx.say(f"lm {shape.name}: timing {', '.join(works)} (+ a matmul reference)")
        ref_n = max(sizes_for(settings))
        works["matmul_ref"] = make_matmul(ref_n)
        timings = interleave(
            works, rounds=settings.rounds, warmup=settings.warmup, min_round_s=settings.min_round_s
        )
        same_rounds = timings.pop("matmul_ref").median_rate / 1e9
        used_peak = same_rounds if math.isnan(peak) else max(peak, same_rounds)
        for name, timing in timings.items():
            row = info[name]
            row.update(timing.to_dict("tokens"))
            row["achieved_gflops"] = row["tokens_per_s"] * row["flops_per_token"] / 1e9
            row["fraction_of_peak"] = ratio(row["achieved_gflops"], used_peak)
            ctx.say(
                f"  {name:14s} {row['tokens_per_s']:10.0f} tok/s  "
                f"{row['achieved_gflops']:6.1f} GFLOP/s"
            )
        rows = [info[n] for n in contenders_for(settings) if n in info]
        base = info.get(BASELINE, {}).get("tokens_per_s")
        ratios = {
            f"attnlab_vs_{r['name']}": ratio(
                info.get("attnlab", {}).get("tokens_per_s"), r.get("tokens_per_s")
            )
            for r in rows
            if r["name"] != "attnlab"
        }
        if "attnlab_bf16" in info and "hf_gpt2_bf16" in info:
            ratios["attnlab_bf16_vs_hf_gpt2_bf16"] = ratio(
                info["attnlab_bf16"].get("tokens_per_s"), info["hf_gpt2_bf16"].get("tokens_per_s")
            )
        results.append(
            {
                "shape": asdict(shape),
                "contenders": rows,
                "ratios": ratios,
                "matmul_same_rounds_gflops": same_rounds,
                "matmul_same_rounds_n": ref_n,
                "peak_gflops_used": used_peak,
            }
        )
        targets.append(
            target_entry(
                f"lm_{shape.name}_vs_gpt2",
                f"LM training tokens/s, {shape.name} shape, attnlab / GPT2LMHeadModel (sdpa)",
                ratio(info.get("attnlab", {}).get("tokens_per_s"), base),
                TARGETS[shape.name],
            )
        )
        if shape.name == "medium":
            targets.append(
                target_entry(
                    "lm_medium_fraction_of_peak",
                    "attnlab LM training FLOP/s / matmul FLOP/s, medium shape",
                    info.get("attnlab", {}).get("fraction_of_peak"),
                    PEAK_TARGET,
                )
            )
    return {
        "status": "ok",
        "matmul_peak_gflops": peak,
        "optimizer": OPTIMIZER,
        "shapes": results,
        "targets": targets,
    }


OPTIMIZER = "torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1), default impl"
