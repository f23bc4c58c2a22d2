"""Suite ``decode``: greedy decoding with reduced-precision weights against fp32 and transformers.

Models (random weights, seed 0, the same weights in every contender through the GPT-2 mapping,
``attnlab.interop.from_transformers``): the ``medium`` LM shape (6 layers, 6 heads, width 384,
vocab 65; 42.5 MB of fp32 linear weights) and GPT-2 small (``gpt2-124M``: 12 layers, 12 heads,
width 768, vocab 50257; 124M parameters, 496 MB of fp32 linear weights with the tied head).

Contenders, each timed in the same interleaved rounds (batch B, a C-token prompt per row, N new
tokens, no stop token; one model per shape for every context and batch):

    fp32, bf16, int8, int4   attnlab's decode loop on the engine (``attnlab.fast.accelerate``)
                             after ``quantize_weights(model, mode)``; with
                             ``--compile`` the batch-1 rows run ``compile=True`` (the case the
                             compiled step is for: a batch-1 step is dispatch-bound), batch 8 eager
    int8_kvbf16, int4_kvbf16 int8 / int4 weights with a bf16 KV cache (``GenerationConfig
                             (cache_dtype="bf16")``, ``--kv-cache bf16``; the suite's
                             ``kv_cache`` setting, ``attnlab bench --kv-cache``)
    int8_eager               (batch 1 with ``--compile``) int8 without compile: what ``attnlab
                             generate --weights int8`` gives without ``--compile``
    hf_gpt2                  ``GPT2LMHeadModel.generate`` (sdpa), fp32, the usual way

Decode speed is timed apart from the prompt's prefill, inside the same calls: attnlab's loop is
clocked from its first new token to its last, transformers' through a stopping criterion that
records the time of every new token (and never stops), so

    decode ms per step = (time of token N - time of token 1) / (N - 1)   (median of the rounds)
    decode tokens/s    = B / decode seconds per step

and ``tokens_per_s`` is the whole call's rate, prefill included.

Each mode's floor: a decode step must read every linear weight once (``bytes_per_token``: codes
plus scales) and the KV cache (2 L B C_avg D values of the cache dtype, 4 or 2 bytes, at the
average cache length C_avg = C + N / 2); at the memory bandwidth the suite measures (a 2-thread
``sum`` streaming 256 MB),

    floor ms per step = bytes per step / bandwidth,       of floor = floor ms / measured ms.

Weights that fit in the 32 MB L3 cache (the medium model below fp32) can beat the DRAM floor.
Targets (issue 22): medium >= 4x transformers, GPT-2 small >= 3x at batch 1 (decode tokens/s).
"""

from __future__ import annotations

import copy
import statistics
import time
import warnings
from typing import Any

import torch

from attnlab.bench.generation import build_pair, hf_greedy
from attnlab.bench.harness import interleave, ratio, target_entry
from attnlab.bench.lm_train import SHAPES, LMShape
from attnlab.fast import accelerate
from attnlab.generate import GenerationConfig
from attnlab.generate.lm import prepare_lm
from attnlab.generate.weights import bytes_per_token, quantize_weights

GPT2_SMALL = LMShape("gpt2-124M", 12, 12, 768, 1024, 1, vocab=50257)
TINY_GPT2 = LMShape("gpt2-124M", 2, 2, 64, 32, 1, vocab=500)
TINY_MEDIUM = LMShape("medium", 2, 2, 64, 32, 1)  # int4 needs widths divisible by 32
MODES = ("fp32", "bf16", "int8", "int4")
TARGETS = {"medium": 4.0, "gpt2-124M": 3.0}
TARGET_MODES = ("int8", "int4")
KV_MODES = ("int8", "int4")  # weight modes also timed with each extra cache dtype
CACHE_BYTES = {"fp32": 4, "bf16": 2}
NEW_TOKENS, TINY_NEW_TOKENS = 32, 4
BATCHES, TINY_BATCHES = (1, 8), (1, 2)
BANDWIDTH_BYTES = 256 * 2**20


def measure_bandwidth(n_bytes: int = BANDWIDTH_BYTES, reps: int = 7) -> float:
    """Bytes per second of a ``sum`` streaming an fp32 tensor of ``n_bytes`` (best of reps)."""
    x = torch.ones(n_bytes // 4)
    x.sum()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return n_bytes / best


def run(settings, ctx) -> dict[str, Any]:
    import transformers  # optional (dev extra): the reference only

    tiny = settings.tiny
    shapes = [TINY_MEDIUM, TINY_GPT2] if tiny else [SHAPES["medium"], GPT2_SMALL]
    n = TINY_NEW_TOKENS if tiny else NEW_TOKENS
    n_bytes = 2**20 if tiny else BANDWIDTH_BYTES
    bandwidth = measure_bandwidth(n_bytes)
    ctx.say(f"decode: memory bandwidth {bandwidth / 1e9:.1f} GB/s (sum over {n_bytes >> 20} MiB)")
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    runs, targets = [], []
    try:
        for shape in shapes:
            hf, ours = build_pair(shape, max(settings.contexts) + n)
            accelerate(ours)  # the engine: the compiled step is replayed, attention as reductions
            models = {"fp32": (ours, None)}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # bf16 where emulated: the numbers show it
                for mode in MODES[1:]:
                    models[mode] = (quantize(ours, mode), None)
            for cache in settings.kv_cache:
                models.update({f"{m}_kv{cache}": (models[m][0], cache) for m in KV_MODES})
            weight_bytes = {m: bytes_per_token(ours, m) for m in MODES}
            for batch in TINY_BATCHES if tiny else BATCHES:
                for context in settings.contexts:
                    row = _one_case(settings, ctx, shape, models, hf, context, batch, n)
                    positions = 2 * shape.n_layers * batch * (context + n / 2) * shape.d_model
                    for c in row["contenders"]:
                        mode, _, cache = c["name"].removesuffix("_eager").partition("_kv")
                        if mode in weight_bytes:
                            c["cache_dtype"] = cache or "fp32"
                            kv = positions * CACHE_BYTES[c["cache_dtype"]]
                            c["bytes_per_step"] = weight_bytes[mode] + kv
                            c["floor_ms_per_step"] = c["bytes_per_step"] / bandwidth * 1e3
                            c["of_floor"] = ratio(c["floor_ms_per_step"], c["decode_ms_per_step"])
                    runs.append(row)
                    if batch == 1:
                        targets += _targets(shape, context, n, row, settings.kv_cache)
            del hf, ours, models
    finally:
        transformers.logging.set_verbosity(verbosity)
    return {
        "status": "ok",
        "new_tokens": n,
        "bandwidth_bytes_per_s": bandwidth,
        "runs": runs,
        "targets": targets,
    }


def quantize(model, mode: str):
    return quantize_weights(copy.deepcopy(model), mode)


def _one_case(settings, ctx, shape, models, hf, context: int, batch: int, n: int) -> dict:
    gen = torch.Generator().manual_seed(99)
    prompts = torch.randint(0, shape.vocab, (batch, context), generator=gen).tolist()
    compiled = settings.compile and batch == 1
    works: dict[str, Any] = {}
    decode_s: dict[str, list[float]] = {}
    for name, (model, cache) in models.items():
        decode_s[name] = []
        works[name] = _attnlab_work(model, prompts, n, compiled, decode_s[name], cache)
    if compiled:
        decode_s["int8_eager"] = []
        works["int8_eager"] = _attnlab_work(
            models["int8"][0], prompts, n, False, decode_s["int8_eager"]
        )
    decode_s["hf_gpt2"] = []
    works["hf_gpt2"] = _hf_work(hf, prompts, n, decode_s["hf_gpt2"])
    label = f"decode {shape.name} ctx {context} batch {batch}"
    ctx.say(f"{label}: timing {', '.join(works)} ({n} new tokens)")
    timings = interleave(works, rounds=settings.rounds, warmup=settings.warmup, min_round_s=0.0)
    info = {}
    for name, timing in timings.items():
        step_ms = statistics.median(decode_s[name]) / (n - 1) * 1e3
        info[name] = {
            "name": name,
            "status": "ok",
            "compiled": compiled and name in models,
            **timing.to_dict("tokens"),
            "decode_seconds_rounds": decode_s[name],
            "decode_ms_per_step": step_ms,
            "decode_tokens_per_s": batch / step_ms * 1e3,
        }
        whole = info[name]["tokens_per_s"]
        ctx.say(
            f"  {name:10s} {batch / step_ms * 1e3:9.1f} decode tok/s ({step_ms:.2f} ms/step; "
            f"whole call {whole:.1f} tok/s)"
        )
    hf_rate = info["hf_gpt2"]["decode_tokens_per_s"]
    return {
        "model": {
            "name": shape.name,
            "n_layers": shape.n_layers,
            "n_heads": shape.n_heads,
            "d_model": shape.d_model,
            "vocab": shape.vocab,
        },
        "context": context,
        "batch": batch,
        "new_tokens": n,
        "compile": compiled,
        "contenders": list(info.values()),
        "ratios": {
            f"{k}_vs_hf_gpt2": ratio(v["decode_tokens_per_s"], hf_rate)
            for k, v in info.items()
            if k != "hf_gpt2"
        },
    }


def _attnlab_work(
    model, prompts: list[list[int]], n: int, compile: bool, decode_s: list, cache: str | None = None
):
    """One greedy generation through the decode loop (KV cache in ``cache``, or the compute
    dtype); the time after the first new token (the prefill) is appended to ``decode_s`` for
    timed rounds."""
    cfg = GenerationConfig(
        max_new_tokens=n, temperature=0.0, stop_token_ids=(), compile=compile, cache_dtype=cache
    )

    def work(r: int) -> float:
        loop = prepare_lm(model, prompts, cfg, None).loop()
        loop.step()  # the prefill and the first new token
        t0 = time.perf_counter()
        while loop.step() is not None:
            pass
        if r >= 0:
            decode_s.append(time.perf_counter() - t0)
        return float(len(prompts) * n)

    return work


def _hf_work(hf, prompts: list[list[int]], n: int, decode_s: list):
    """``hf.generate``; a stopping criterion (never stopping) clocks each new token."""
    # optional (dev extra): the reference only
    from transformers import StoppingCriteria, StoppingCriteriaList

    ids = torch.tensor(prompts)  # (B, C)
    mask = torch.ones_like(ids)
    clock: list[float] = []

    class Clock(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            clock.append(time.perf_counter())
            return torch.zeros(input_ids.size(0), dtype=torch.bool)

    def work(r: int) -> float:
        clock.clear()
        out = hf_greedy(hf, ids, mask, n, stopping_criteria=StoppingCriteriaList([Clock()]))
        if r >= 0:
            decode_s.append(clock[-1] - clock[0])  # tokens 2..n
        return float(out[:, ids.size(1) :].numel())

    return work


def _targets(shape, context: int, n: int, row: dict, caches: tuple[str, ...]) -> list[dict]:
    how = "compile=True" if row["compile"] else "eager"
    names = [(m, m, "") for m in TARGET_MODES]
    names += [(f"{m}_kv{c}", m, f", {c} KV cache") for c in caches for m in KV_MODES]
    return [
        target_entry(
            f"decode_{shape.name}_ctx{context}_{name}_vs_hf",
            f"greedy decode tokens/s, {shape.name}, batch 1, {context}-token prompt, {n} new "
            f"tokens, attnlab {mode} weights{cache} ({how}) / transformers generate fp32",
            row["ratios"].get(f"{name}_vs_hf_gpt2"),
            TARGETS[shape.name],
        )
        for name, mode, cache in names
    ]
