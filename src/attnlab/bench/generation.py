"""Suite ``generate``: greedy decoding speed, attnlab vs transformers' generate, same weights.

Models: both LM shapes of the ``lm`` suite, small (4 layers, 4 heads, width 128: per-token work
is tiny, so per-token overhead decides) and medium (6 layers, 6 heads, width 384: the weights are
read once per token, so matrix-vector speed decides), vocab 65, each a randomly initialised
``transformers.GPT2LMHeadModel`` (seed 0, eval mode) and the **same weights** in an attnlab
DecoderLM through the GPT-2 mapping (``attnlab.interop.from_transformers``). The issue's target
(>= 4x at both contexts) is checked for both models.

Definition of "context C" (issue 6 says "at context 64 and 512"): the prompt is C tokens long and
we then generate N = 500 new tokens, so the model window is n_positions = C + N (564 and 1012) and
the last new token attends to C + N - 1 earlier positions. Nothing is cropped or slid.

    attnlab   attnlab.generate.generate(model, [prompt], GenerationConfig(max_new_tokens=N,
              temperature=0, stop_token_ids=()))
    attnlab_compiled  the same with compile=True (only with ``--compile``): the one-token decode
              step under torch.compile; its first call (compilation included) is timed
              separately as ``first_call_seconds``
    attnlab_fast_compiled  the same model on the engine (``attnlab.fast.accelerate``): the
              compiled step is replayed without dynamo (only with ``--compile``)
    hf_gpt2   hf_model.generate(ids, attention_mask=ones, max_new_tokens=N, min_new_tokens=N,
              do_sample=False, use_cache=True)

Batch 1, the same prompt in every round. tokens/s = N / wall time of the whole call (prefill of
the C prompt tokens included, as a user experiences it). Both decode greedily from identical
weights, so their tokens should agree; ``tokens_agree`` (fraction of equal positions up to the
first divergence / N) checks that the two are doing the same work, since fp32 rounding can flip a
near-tie late in a long generation.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import Tensor

from attnlab.bench.harness import interleave, ratio, target_entry
from attnlab.bench.lm_train import SHAPES, TINY_SHAPES, hf_gpt2_config
from attnlab.fast import accelerate
from attnlab.generate import GenerationConfig, generate
from attnlab.interop import from_transformers

CONTENDERS = ("attnlab", "attnlab_compiled", "attnlab_fast_compiled", "hf_gpt2")
OURS = (
    ("attnlab", ""),
    ("attnlab_compiled", " (compile=True)"),
    ("attnlab_fast_compiled", " (fast=True, compile=True)"),
)
MODEL_FIELDS = ("name", "n_layers", "n_heads", "d_model", "vocab")
TARGET = 4.0  # attnlab tokens/s >= 4x transformers generate at both contexts (issue 6)


def build_pair(shape, n_positions: int, seed: int = 0):
    """(hf_model, attnlab_model): one random GPT-2 and its attnlab copy, both in eval mode."""
    from transformers import GPT2LMHeadModel  # optional (dev extra): the reference only

    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(hf_gpt2_config(shape, n_positions, "sdpa")).eval()
    ours = from_transformers(hf).eval()
    return hf, ours


def make_attnlab_work(
    model, prompt: list[int], new_tokens: int, outputs: list, compile: bool = False
):
    cfg = GenerationConfig(
        max_new_tokens=new_tokens, temperature=0.0, stop_token_ids=(), compile=compile
    )

    def work(r: int) -> float:
        tokens = generate(model, [prompt], cfg).tokens[0]
        outputs.append(list(tokens))
        return float(len(tokens))

    return work


def hf_greedy(model, ids: Tensor, mask: Tensor, n: int, **extra: Any) -> Tensor:
    """transformers' ``generate``: greedy, exactly ``n`` new tokens, with its KV cache -- the
    contender every generation benchmark times. ids, mask (B, C) -> (B, C + n)."""
    return model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        use_cache=True,
        pad_token_id=0,
        **extra,
    )


def make_hf_work(model, prompt: list[int], new_tokens: int, outputs: list):
    ids = torch.tensor([prompt])  # (1, C)
    mask = torch.ones_like(ids)

    def work(r: int) -> float:
        out = hf_greedy(model, ids, mask, new_tokens)  # (1, C + N)
        tokens = out[0, ids.size(1) :].tolist()
        outputs.append(tokens)
        return float(len(tokens))

    return work


def agreement(a: list[int], b: list[int]) -> float:
    """Length of the common prefix of a and b over max(len): 1.0 = identical."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n / max(len(a), len(b), 1)


def run(settings, ctx) -> dict[str, Any]:
    import transformers  # optional (dev extra): the reference only

    n = settings.new_tokens
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # no per-call "Setting pad_token_id" chatter
    try:
        rows, targets = [], []
        for shape in (TINY_SHAPES if settings.tiny else SHAPES).values():
            for context in settings.contexts:
                rows.append(_one_context(settings, ctx, shape, context, n))
                for name, how in OURS:
                    suffix = name.removeprefix("attnlab")
                    if f"{name}_vs_hf_gpt2" in rows[-1]["ratios"]:
                        targets.append(
                            target_entry(
                                f"generate_{shape.name}_ctx{context}{suffix}_vs_hf",
                                f"greedy tokens/s, {shape.name} model, batch 1, {n} new tokens "
                                f"after a {context}-token prompt, attnlab{how} / "
                                "transformers generate",
                                rows[-1]["ratios"][f"{name}_vs_hf_gpt2"],
                                TARGET,
                            )
                        )
    finally:
        transformers.logging.set_verbosity(verbosity)
    return {"status": "ok", "new_tokens": n, "runs": rows, "targets": targets}


def _one_context(settings, ctx, shape, context: int, n: int) -> dict[str, Any]:
    hf, ours = build_pair(shape, context + n)
    gen = torch.Generator().manual_seed(99)
    prompt = torch.randint(0, shape.vocab, (context,), generator=gen).tolist()
    outputs: dict[str, list] = {"attnlab": [], "hf_gpt2": []}
    works, info, first_call = {}, {}, {}
    works["attnlab"] = make_attnlab_work(ours, prompt, n, outputs["attnlab"])
    if settings.compile:
        models = {
            "attnlab_compiled": ours,
            "attnlab_fast_compiled": accelerate(copy.deepcopy(ours)),
        }
        for name, model in models.items():
            works[name] = make_attnlab_work(model, prompt, n, [], compile=True)
            ctx.say(f"generate {shape.name} ctx {context}: compiling the decode step ({name})")
            t0 = time.perf_counter()
            works[name](-1)
            first_call[name] = time.perf_counter() - t0
    works["hf_gpt2"] = make_hf_work(hf, prompt, n, outputs["hf_gpt2"])
    ctx.say(f"generate {shape.name} ctx {context}: timing {', '.join(works)} ({n} new tokens)")
    for name, timing in interleave(
        works, rounds=settings.rounds, warmup=settings.warmup, min_round_s=settings.min_round_s
    ).items():
        info[name] = {"name": name, "status": "ok", **timing.to_dict("tokens")}
        if name in first_call:
            info[name]["first_call_seconds"] = first_call[name]
        ctx.say(f"  {name:14s} {info[name]['tokens_per_s']:10.1f} tok/s")
    row: dict[str, Any] = {
        "model": {k: getattr(shape, k) for k in MODEL_FIELDS},
        "context": context,
        "prompt_tokens": context,
        "new_tokens": n,
        "n_positions": context + n,
        "contenders": [info[c] for c in CONTENDERS if c in info],
        "ratios": {
            f"{name}_vs_hf_gpt2": ratio(info[name]["tokens_per_s"], info["hf_gpt2"]["tokens_per_s"])
            for name, _ in OURS
            if name in info
        },
    }
    if outputs["attnlab"] and outputs["hf_gpt2"]:
        row["tokens_agree"] = agreement(outputs["attnlab"][0], outputs["hf_gpt2"][0])
    return row
