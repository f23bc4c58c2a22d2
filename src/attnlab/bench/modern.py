"""Suite ``modern``: what grouped-query attention buys at decode time, and real-model-shaped decode
against ``transformers``' generate.

Part 1, ``kv_heads``: the medium LM shape (6 layers, 6 query heads, width 384, d_head 64, vocab
65) as a Llama-style decoder (RMSNorm, rotary, SwiGLU) with n_kv_heads = 6 (MHA), 3 and 2 (GQA)
and 1 (MQA), random weights. For each:

    kv_bytes_per_token   bytes the KV cache holds per cached position, measured on the cache
                         object ``model.new_cache`` returns (sum of its K and V buffers / length):
                         2 (K and V) x layers x H_kv x d_head x 4 bytes in fp32
    tokens_per_s         greedy decode, ``attnlab.generate.generate``, batch ``kv_batch``, a
                         ``kv_context``-token prompt then N new tokens (prefill included)

Part 2, ``vs_transformers``: greedy decode of two random-weight models with real shapes, attnlab
(weights copied through ``attnlab.interop``) against ``model.generate`` of transformers in the
same process, interleaved rounds, batch 1, a 64-token prompt, N new tokens (N = the run's
``new_tokens``, at most 200, in both parts):

    gpt2_124m     GPT-2 small: 12 layers, 12 heads, width 768, vocab 50257 (124M parameters)
    llama_135m    SmolLM2-135M's shape: 30 layers, 9 query / 3 key-value heads, width 576,
                  SwiGLU 1536, vocab 49152, tied head (a Llama-family model with GQA)

tokens/s = N / wall time of the whole call. ``tokens_agree`` compares the two outputs (fraction
of equal tokens up to the first divergence), to show both did the same work.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.bench.generation import agreement, make_hf_work
from attnlab.bench.harness import interleave, ratio
from attnlab.config import ModelConfig
from attnlab.generate import GenerationConfig, generate
from attnlab.interop.pretrained import from_hf_model
from attnlab.models import build_model

KV_HEADS = (6, 3, 2, 1)
# Llama's block as ModelConfig fields: rotary positions, RMSNorm, SwiGLU, no biases, untied head.
LLAMA_BLOCK: dict[str, Any] = dict(
    positional="rotary",
    norm="rmsnorm",
    ffn="swiglu",
    activation="silu",
    bias=False,
    tie_embeddings=False,
)


def llama_shape(tiny: bool) -> dict[str, Any]:
    """The medium LM shape as Llama-style ModelConfig fields (tiny: toy sizes for tests)."""
    if tiny:
        return dict(n_layers=2, n_heads=6, d_model=48, d_ff=96, vocab_size=65, max_len=256)
    return dict(n_layers=6, n_heads=6, d_model=384, d_ff=1024, vocab_size=65, max_len=1024)


def modern_config(n_kv_heads: int, tiny: bool):
    return ModelConfig(kind="decoder_lm", n_kv_heads=n_kv_heads, **LLAMA_BLOCK, **llama_shape(tiny))


def kv_bytes_per_token(model, batch: int, length: int) -> float:
    """Bytes of K and V buffers per cached position per sequence, measured on a real cache."""
    cache = model.new_cache(batch, length)
    total = sum(layer.k.nbytes + layer.v.nbytes for layer in cache.layers)
    return total / (batch * length)


def _greedy_work(model, prompts: list[list[int]], n: int, outputs: list):
    cfg = GenerationConfig(max_new_tokens=n, temperature=0.0, stop_token_ids=())

    def work(r: int) -> float:
        tokens = generate(model, prompts, cfg).tokens
        outputs.append(list(tokens[0]))
        return float(sum(len(t) for t in tokens))

    return work


def run_kv_heads(settings, ctx) -> list[dict[str, Any]]:
    n = min(settings.new_tokens, 200)
    context = 32 if settings.tiny else 512
    batch = 1 if settings.tiny else 4
    gen = torch.Generator().manual_seed(5)
    rows, works, models = [], {}, {}
    for h_kv in KV_HEADS:
        torch.manual_seed(0)
        cfg = modern_config(h_kv, settings.tiny).replace(max_len=context + n)
        model = build_model(cfg).eval()
        prompts = torch.randint(0, cfg.vocab_size, (batch, context), generator=gen).tolist()
        name = {cfg.n_heads: "MHA", 1: "MQA"}.get(h_kv, f"GQA-{h_kv}")
        models[name] = (cfg, model)
        works[name] = _greedy_work(model, prompts, n, [])
    ctx.say(
        f"modern kv_heads: decode {n} tokens after {context}, batch {batch}: {', '.join(works)}"
    )
    timings = interleave(
        works, rounds=settings.rounds, warmup=settings.warmup, min_round_s=settings.min_round_s
    )
    mha = timings["MHA"].median_rate
    for name, (cfg, model) in models.items():
        rate = timings[name].median_rate
        rows.append(
            {
                "attention": name,
                "n_heads": cfg.n_heads,
                "n_kv_heads": cfg.kv_heads,
                "kv_bytes_per_token": kv_bytes_per_token(model, 1, 16),
                "params": sum(p.numel() for p in model.parameters()),
                "batch": batch,
                "context": context,
                "new_tokens": n,
                **timings[name].to_dict("tokens"),
                "speed_vs_mha": ratio(rate, mha),
            }
        )
        ctx.say(f"  {name:6s} {rows[-1]['kv_bytes_per_token']:8.0f} B/token  {rate:8.1f} tok/s")
    return rows


def _gpt2_pair(tiny: bool):
    import transformers  # optional (dev extra): the reference only

    shape: dict[str, Any] = dict(
        n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024
    )
    if tiny:
        shape = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=256)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape)).eval()
    return hf, from_hf_model(hf).eval()


# SmolLM2-135M's shape (random weights: nothing is downloaded), and a tiny one for the tests.
SMOLLM2_135M: dict[str, Any] = dict(
    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576,
    intermediate_size=1536, vocab_size=49152, max_position_embeddings=2048,
    tie_word_embeddings=True, rope_theta=100000.0,
)  # fmt: skip
TINY_LLAMA: dict[str, Any] = dict(
    SMOLLM2_135M, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    hidden_size=32, intermediate_size=64, vocab_size=97,
)  # fmt: skip


def _llama_pair(tiny: bool):
    import transformers  # optional (dev extra): the reference only

    shape = TINY_LLAMA if tiny else SMOLLM2_135M
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).eval()
    return hf, from_hf_model(hf).eval()


def run_vs_transformers(settings, ctx) -> list[dict[str, Any]]:
    n = min(settings.new_tokens, 200)
    rows = []
    for name, build in (("gpt2_124m", _gpt2_pair), ("llama_135m", _llama_pair)):
        hf, ours = build(settings.tiny)
        vocab = ours.vocab_size
        prompt = torch.randint(0, vocab, (64,), generator=torch.Generator().manual_seed(7))
        outputs: dict[str, list] = {"attnlab": [], "transformers": []}
        works = {
            "attnlab": _greedy_work(ours, [prompt.tolist()], n, outputs["attnlab"]),
            "transformers": make_hf_work(hf, prompt.tolist(), n, outputs["transformers"]),
        }
        ctx.say(f"modern vs_transformers {name}: {n} new tokens after 64, batch 1")
        timings = interleave(
            works, rounds=settings.rounds, warmup=settings.warmup, min_round_s=settings.min_round_s
        )
        row = {
            "model": name,
            "params": sum(p.numel() for p in ours.parameters()),
            "new_tokens": n,
            "contenders": [{"name": k, **t.to_dict("tokens")} for k, t in timings.items()],
            "attnlab_vs_transformers": ratio(
                timings["attnlab"].median_rate, timings["transformers"].median_rate
            ),
            "tokens_agree": agreement(outputs["attnlab"][0], outputs["transformers"][0]),
        }
        for k, t in timings.items():
            ctx.say(f"  {k:12s} {t.median_rate:8.1f} tok/s")
        rows.append(row)
    return rows


def run(settings, ctx) -> dict[str, Any]:
    import transformers  # optional (dev extra): the reference only

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return {
            "status": "ok",
            "kv_heads": run_kv_heads(settings, ctx),
            "vs_transformers": run_vs_transformers(settings, ctx),
        }
    finally:
        transformers.logging.set_verbosity(verbosity)
