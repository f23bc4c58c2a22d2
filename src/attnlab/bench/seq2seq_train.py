"""Suite ``seq2seq``: encoder-decoder training throughput, attnlab vs torch.nn.Transformer.

Configuration (issue 6): D = 256, 3 encoder + 3 decoder layers, 8 heads, F = 512, a shared
(joint BPE) vocabulary of 8000, dropout 0, pre-norm, ReLU, learned positions, target embedding
tied to the output layer, fp32, AdamW (same settings as the ``lm`` suite).

    attnlab    attnlab.models.TransformerEncoderDecoder, masks True = real token (the plain
               form, the default)
    attnlab_fast  the same model on the engine, ``build_model(cfg, fast=True)`` (packed teacher
               forcing with attention on row groups, ``attnlab.fast``); the target is its ratio
    torch_nn   nn.Embedding (source, target, two position tables) + nn.Transformer(
               norm_first=True, batch_first=True) + tied head, with src/tgt/memory key padding
               masks (True = pad, PyTorch's convention) and a causal tgt_mask

Workload: batches of 64 sentence pairs in random order (not bucketed), each padded to its longest
sentence, the same batches for both contenders. Lengths imitate Multi30k: on its training set the
word+punctuation token counts are log-normal with median ~12-13 and sigma 0.30 (en) / 0.33 (de),
and log(len_de / len_en) has sd 0.17; subword units lengthen that by ~10%, so we draw

    S ~ round(exp(N(log 14, 0.30))),  clipped to [4, 40]
    L ~ round(S * exp(N(0, 0.17))),   clipped to [4, 40];  tgt_in = [BOS] y,  tgt_out = y [EOS]

One step = forward + token cross-entropy (ignoring pads) + backward + AdamW step, each the way
its users write it: attnlab's step is the one ``attnlab train`` runs (``batch_loss``: logits only
at the real target positions, ``real_only=True``); the nn.Transformer step computes the head over
all B x T positions and ignores pads in the loss (``ignore_index``), as PyTorch's tutorial does.
Throughput
counts **real target tokens** (non-pad positions of tgt_out) per second. ``achieved_gflops``
counts the matmul FLOPs of the padded tensors (:func:`step_flops`) and ``fraction_of_peak``
divides it by the fp32 matmul rate (the larger of the ``matmul`` suite's peak and a matmul timed
in the same rounds), as in the ``lm`` suite.

Shapes: B sentences, S source length, T target length, D width, V vocabulary.
"""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.bench.harness import interleave, ratio, target_entry
from attnlab.bench.matmul_peak import make_matmul, sizes_for
from attnlab.config import ModelConfig
from attnlab.models import build_model

PAD, BOS, EOS = 0, 1, 2
CONTENDERS = ("attnlab", "attnlab_fast", "torch_nn")
TARGET = 2.0  # attnlab tokens/s >= 2x nn.Transformer (issue 6)


@dataclass(frozen=True)
class Seq2SeqShape:
    d_model: int = 256
    n_heads: int = 8
    n_layers: int = 3  # encoder and decoder each
    d_ff: int = 512
    vocab: int = 8000
    batch: int = 64
    max_len: int = 64
    median_len: float = 14.0
    min_len: int = 4
    max_sentence: int = 40


SHAPE = Seq2SeqShape()
TINY_SHAPE = Seq2SeqShape(
    d_model=32,
    n_heads=4,
    n_layers=1,
    d_ff=64,
    vocab=100,
    batch=4,
    max_len=16,
    median_len=6.0,
    min_len=2,
    max_sentence=12,
)


class Batch(NamedTuple):
    """One padded batch (pad = 0) and its count of real target tokens."""

    src: Tensor  # (B, S)
    tgt_in: Tensor  # (B, T)
    tgt_out: Tensor  # (B, T)
    tokens: int


def make_batches(shape: Seq2SeqShape, n: int, seed: int = 4321) -> list[Batch]:
    """``n`` padded batches with Multi30k-like lengths (see module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        b = shape.batch
        src_len = torch.exp(math.log(shape.median_len) + 0.30 * torch.randn(b, generator=gen))
        tgt_len = src_len * torch.exp(0.17 * torch.randn(b, generator=gen))
        src_len = src_len.round().clamp(shape.min_len, shape.max_sentence).long()
        tgt_len = tgt_len.round().clamp(shape.min_len, shape.max_sentence).long()
        s, t = int(src_len.max()), int(tgt_len.max()) + 1  # +1: BOS / EOS
        src = torch.randint(3, shape.vocab, (b, s), generator=gen)  # (B, S)
        src[torch.arange(s) >= src_len[:, None]] = PAD
        words = torch.randint(3, shape.vocab, (b, t), generator=gen)  # (B, T)
        tgt_in = torch.cat([torch.full((b, 1), BOS), words[:, :-1]], dim=1)  # (B, T)
        tgt_out = words.clone()
        tgt_out[torch.arange(b), tgt_len] = EOS
        pad = torch.arange(t) > tgt_len[:, None]  # (B, T) beyond EOS
        tgt_in[pad], tgt_out[pad] = PAD, PAD
        out.append(
            Batch(src=src, tgt_in=tgt_in, tgt_out=tgt_out, tokens=int((tgt_out != PAD).sum()))
        )
    return out


class TorchSeq2Seq(nn.Module):
    """The plain-PyTorch baseline: embeddings + nn.Transformer + tied head."""

    def __init__(self, shape: Seq2SeqShape):
        super().__init__()
        d = shape.d_model
        self.src_emb = nn.Embedding(shape.vocab, d)
        self.tgt_emb = nn.Embedding(shape.vocab, d)
        self.src_pos = nn.Embedding(shape.max_len, d)
        self.tgt_pos = nn.Embedding(shape.max_len, d)
        with warnings.catch_warnings():  # "enable_nested_tensor is True, but ... norm_first"
            warnings.simplefilter("ignore", UserWarning)
            self.transformer = nn.Transformer(
                d,
                shape.n_heads,
                shape.n_layers,
                shape.n_layers,
                shape.d_ff,
                dropout=0.0,
                activation="relu",
                batch_first=True,
                norm_first=True,
            )
        self.lm_head = nn.Linear(d, shape.vocab, bias=False)
        self.lm_head.weight = self.tgt_emb.weight

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        s, t = src.size(1), tgt_in.size(1)
        x = self.src_emb(src) + self.src_pos(torch.arange(s))  # (B, S, D)
        y = self.tgt_emb(tgt_in) + self.tgt_pos(torch.arange(t))  # (B, T, D)
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)  # (T, T) True = future: ignore
        src_pad, tgt_pad = src == PAD, tgt_in == PAD  # True = ignore (PyTorch's convention)
        h = self.transformer(
            x,
            y,
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )  # (B, T, D)
        return self.lm_head(h)  # (B, T, V)


def attnlab_config(shape: Seq2SeqShape):
    """The attnlab ModelConfig of ``shape`` (the suite's configuration, module docstring)."""
    return ModelConfig(  # and the defaults: dropout 0, learned positions, pre-norm, ReLU, tied
        kind="encoder_decoder",
        vocab_size=shape.vocab,
        d_model=shape.d_model,
        n_heads=shape.n_heads,
        n_layers=shape.n_layers,
        d_ff=shape.d_ff,
        max_len=shape.max_len,
        pad_id=PAD,
    )


def build_seq2seq(contender: str, shape: Seq2SeqShape, seed: int = 0):
    """(model, forward) where forward(src, tgt_in) -> logits (B, T, V)."""
    torch.manual_seed(seed)
    if contender in ("attnlab", "attnlab_fast"):
        model = build_model(attnlab_config(shape), fast=contender == "attnlab_fast")

        def forward(src: Tensor, tgt_in: Tensor) -> Tensor:
            return model(src, tgt_in, src_mask=src != PAD, tgt_mask=tgt_in != PAD).logits

        return model, forward
    if contender == "torch_nn":
        model = TorchSeq2Seq(shape)
        return model, model
    raise ValueError(f"unknown seq2seq contender {contender!r}; choose from {CONTENDERS}")


def padded_loss(forward):
    """loss(batch): logits at every (B, T) position, pads ignored by the cross-entropy."""

    def loss(batch: Batch) -> Tensor:
        logits = forward(batch.src, batch.tgt_in)  # (B, T, V)
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1), ignore_index=PAD
        )

    return loss


def real_only_loss(model: nn.Module):
    """loss(batch) as attnlab's trainer computes it: logits (N, V) at the N real targets only."""

    def loss(batch: Batch) -> Tensor:
        real = batch.tgt_in != PAD  # (B, T), the same positions as tgt_out != PAD
        logits = model(
            batch.src, batch.tgt_in, src_mask=batch.src != PAD, tgt_mask=real, real_only=True
        ).logits  # (N, V)
        return F.cross_entropy(logits, batch.tgt_out[real])

    return loss


def contender_loss(contender: str, model: nn.Module, forward):
    """The training loss each contender's users run (see the module docstring)."""
    return real_only_loss(model) if contender.startswith("attnlab") else padded_loss(forward)


def make_train_step(model: nn.Module, loss_fn, batches: list[Batch]):
    """work(r) -> real target tokens of one optimizer step on batch r."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)

    def work(r: int) -> float:
        batch = batches[max(r, 0) % len(batches)]
        loss = loss_fn(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(batch.tokens)

    return work


def step_flops(shape: Seq2SeqShape, batch: Batch) -> float:
    """Matmul FLOPs of one training step (forward + backward = 3x forward) on padded tensors.

    Per source position: 6 L (4 D^2 + 2 D F) (projections and FFN) + 12 L D S (self-attention
    scores and mixing); per target position: 6 L (8 D^2 + 2 D F) + 6 D V (the output layer)
    + 12 L D T (self-attention) + 12 L D S (cross-attention). Biases, norms and softmax are
    left out, as in the LM suite's 6 N + 12 L D T.
    """
    d, f, n, v = shape.d_model, shape.d_ff, shape.n_layers, shape.vocab
    b, s = batch.src.shape
    t = batch.tgt_in.size(1)
    per_src = 6 * n * (4 * d * d + 2 * d * f) + 12 * n * d * s
    per_tgt = 6 * n * (8 * d * d + 2 * d * f) + 6 * d * v + 12 * n * d * (t + s)
    return float(b * s * per_src + b * t * per_tgt)


def run(settings, ctx) -> dict[str, Any]:
    shape = TINY_SHAPE if settings.tiny else SHAPE
    batches = make_batches(shape, settings.rounds)
    peak = ctx.matmul_peak_gflops()
    works, rows = {}, {}
    for name in CONTENDERS:
        model, forward = build_seq2seq(name, shape)
        rows[name] = {
            "name": name,
            "status": "ok",
            "params": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        }
        works[name] = make_train_step(model, contender_loss(name, model, forward), batches)
    ctx.say(f"seq2seq: timing {', '.join(works)} (+ a matmul reference)")
    works["matmul_ref"] = make_matmul(max(sizes_for(settings)))
    timings = interleave(
        works, rounds=settings.rounds, warmup=settings.warmup, min_round_s=settings.min_round_s
    )
    same_rounds = timings.pop("matmul_ref").median_rate / 1e9
    used_peak = same_rounds if math.isnan(peak) else max(peak, same_rounds)
    flops = [step_flops(shape, b) for b in batches]
    for name, timing in timings.items():
        row = rows[name]
        row.update(timing.to_dict("tokens"))
        row["achieved_gflops"] = statistics.median(
            timing.repeats * flops[r] / sec / 1e9 for r, sec in enumerate(timing.seconds)
        )
        row["fraction_of_peak"] = ratio(row["achieved_gflops"], used_peak)
        ctx.say(
            f"  {name:14s} {row['tokens_per_s']:10.0f} target tok/s  "
            f"{row['achieved_gflops']:6.1f} GFLOP/s"
        )
    value = ratio(rows["attnlab"]["tokens_per_s"], rows["torch_nn"]["tokens_per_s"])
    fast = ratio(rows["attnlab_fast"]["tokens_per_s"], rows["torch_nn"]["tokens_per_s"])
    real = sum(b.tokens for b in batches)
    padded = sum(b.tgt_out.numel() for b in batches)
    return {
        "status": "ok",
        "shape": asdict(shape),
        "batches": [
            {
                "src_shape": list(b.src.shape),
                "tgt_shape": list(b.tgt_in.shape),
                "target_tokens": b.tokens,
                "step_flops": f,
            }
            for b, f in zip(batches, flops)
        ],
        "target_padding_fraction": 1.0 - real / padded,
        "matmul_same_rounds_gflops": same_rounds,
        "peak_gflops_used": used_peak,
        "contenders": [rows[n] for n in CONTENDERS],
        "ratios": {"attnlab_vs_torch_nn": value, "attnlab_fast_vs_torch_nn": fast},
        "targets": [
            target_entry(
                "seq2seq_vs_torch",
                "encoder-decoder training target tokens/s, attnlab (fast=True) / nn.Transformer",
                fast,
                TARGET,
            ),
            target_entry(
                "seq2seq_plain_vs_torch",
                "the same, attnlab's plain form (the default) / nn.Transformer",
                value,
                TARGET,
            ),
        ],
    }
