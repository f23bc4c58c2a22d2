"""Suite ``quality``: what reduced-precision weights cost in perplexity and in greedy tokens.

1. A character LM trained here (4 layers, 4 heads, width 128, context 128, AdamW, ``STEPS``
   steps of 16 windows) on ``--text`` (e.g. tinyshakespeare) or, without it, on a generated
   text of simple sentences. The last 10% of the text is held out and never trained on.
   For fp32 and every mode of ``attnlab.generate.WEIGHT_MODES``:

       perplexity = exp(mean NLL of the held-out characters), windows of the context length
       change     = perplexity / fp32 perplexity - 1                (issue 22: |change| <= 1%)
       top-1      = fraction of held-out positions whose argmax equals fp32's (teacher-forced)
       greedy     = common prefix of 200 greedy tokens with fp32's / 200 (a held-out prompt)

   With a bf16 KV cache (``cache_dtype="bf16"``; the suite's ``kv_cache`` setting) the same
   four figures are reported for fp32, int8 and int4 weights ("int8_kvbf16" ...): perplexity
   then runs each window through a fresh cache in that dtype, so every attention reads its
   keys and values back from it, as in decoding.

2. A random-weight GPT-2 small shape (124M; ``bench.decode.GPT2_SMALL``): random weights have
   no held-out text to score, so only the greedy prefix and the top-1 agreement along fp32's
   greedy continuation are reported. Random logits are close to ties, so this is the harsh case.

Run with ``attnlab bench --suite quality [--text FILE]``; ``--tiny`` shrinks everything (tests).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F

from attnlab.bench.decode import GPT2_SMALL, TINY_GPT2, quantize
from attnlab.bench.generation import agreement, build_pair
from attnlab.bench.harness import target_entry
from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer
from attnlab.generate import GenerationConfig, generate
from attnlab.generate.weights import WEIGHT_MODES
from attnlab.models import DecoderLM, build_model

STEPS, TINY_STEPS = 200, 20
GREEDY_TOKENS, TINY_GREEDY_TOKENS = 200, 20
HELDOUT_CHARS, TINY_HELDOUT_CHARS = 16384, 512
TARGET_CHANGE = 0.01
CACHE_MODES = ("fp32", "int8", "int4")  # weight modes also scored with each extra cache dtype
_WORDS = (
    "the",
    "cat",
    "dog",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "ran",
    "to",
    "see",
    "my",
    "old",
    "red",
    "hat",
    "by",
    "sea",
    "when",
    "it",
    "was",
    "cold",
)


def run(settings, ctx) -> dict[str, Any]:
    tiny = settings.tiny
    modes = WEIGHT_MODES[1:]
    cached = [(m, c) for c in settings.kv_cache for m in CACHE_MODES]
    text, source = _text(settings)
    ctx.say(f"quality: training a char LM on {source}")
    char = char_lm_quality(text, modes, tiny=tiny, cached=cached)
    char["text"] = source
    ctx.say(
        "quality: "
        + ", ".join(
            f"{m} ppl {r['perplexity_change']:+.3%}"
            for m, r in char["modes"].items()
            if m != "fp32"
        )
    )
    shape = TINY_GPT2 if tiny else GPT2_SMALL
    n = TINY_GREEDY_TOKENS if tiny else GREEDY_TOKENS
    ctx.say(f"quality: greedy agreement of a random {shape.name} over {n} tokens")
    gpt2 = gpt2_agreement(shape, modes, n, cached=cached)
    targets = [
        target_entry(
            f"quality_char_lm_{mode}_perplexity_change",
            f"|perplexity change| of a char LM with {_label(mode)} against fp32 (held-out text)",
            abs(r["perplexity_change"]),
            TARGET_CHANGE,
            higher_is_better=False,
        )
        for mode, r in char["modes"].items()
        if mode != "fp32"
    ]
    return {"status": "ok", "greedy_tokens": n, "char_lm": char, "gpt2": gpt2, "targets": targets}


def _label(name: str) -> str:
    """ "int8" -> "int8 weights", "int8_kvbf16" -> "int8 weights and a bf16 KV cache"."""
    mode, _, cache = name.partition("_kv")
    return f"{mode} weights" + (f" and a {cache} KV cache" if cache else "")


def _variants(model, modes: tuple[str, ...], cached: Sequence[tuple[str, str]]):
    """(name, model, cache dtype) for each weight mode, then each (mode, cache) pair."""
    reduced = {"fp32": model, **{m: quantize(model, m) for m in modes}}
    out = [(m, reduced[m], None) for m in modes]
    return out + [(f"{m}_kv{c}", reduced[m], c) for m, c in cached]


def char_lm_quality(
    text: str,
    modes: tuple[str, ...],
    *,
    tiny: bool = False,
    cached: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """Train a char LM on the first 90% of ``text``; score every mode (and each (mode, KV
    cache dtype) pair of ``cached``) on the rest."""
    tok = CharTokenizer(set(text))
    ids = torch.tensor(tok.encode(text))
    split = int(len(ids) * 0.9)
    model, final_loss = train_char_lm(ids[:split], tok.vocab_size, tiny=tiny)
    heldout = ids[split:][: TINY_HELDOUT_CHARS if tiny else HELDOUT_CHARS]
    n = TINY_GREEDY_TOKENS if tiny else GREEDY_TOKENS
    prompt = heldout[:32].tolist()
    base = _score(model, heldout)
    base_tokens = _greedy(model, prompt, n)
    results = {
        "fp32": {
            "perplexity": base["perplexity"],
            "perplexity_change": 0.0,
            "greedy_prefix": 1.0,
            "top1_agreement": 1.0,
        }
    }
    for name, reduced, cache in _variants(model, modes, cached):
        scored = _score(reduced, heldout, cache)
        results[name] = {
            "perplexity": scored["perplexity"],
            "perplexity_change": scored["perplexity"] / base["perplexity"] - 1,
            "greedy_prefix": agreement(_greedy(reduced, prompt, n, cache), base_tokens),
            "top1_agreement": (scored["argmax"] == base["argmax"]).float().mean().item(),
        }
    cfg = model.cfg
    return {
        "model": f"{cfg.n_layers}L {cfg.n_heads}H {cfg.d_model}D, context {cfg.max_len}",
        "steps": TINY_STEPS if tiny else STEPS,
        "final_train_loss": final_loss,
        "heldout_tokens": len(heldout),
        "modes": results,
    }


def gpt2_agreement(
    shape, modes: tuple[str, ...], n: int, cached: Sequence[tuple[str, str]] = ()
) -> dict[str, Any]:
    """Greedy prefix and teacher-forced top-1 agreement of each mode with fp32 (random GPT-2)."""
    _, model = build_pair(shape, 32 + n)
    prompt = torch.randint(0, shape.vocab, (32,), generator=torch.Generator().manual_seed(7))
    base_tokens = _greedy(model, prompt.tolist(), n)
    seq = torch.tensor([prompt.tolist() + base_tokens[:-1]])  # (1, 32 + n - 1)
    with torch.inference_mode():
        base_argmax = model(seq).logits.argmax(-1)  # (1, 32 + n - 1)
    results = {}
    for name, reduced, cache in _variants(model, modes, cached):
        with torch.inference_mode():
            argmax = _logits(reduced, seq, cache).argmax(-1)
        results[name] = {
            "greedy_prefix": agreement(_greedy(reduced, prompt.tolist(), n, cache), base_tokens),
            "top1_agreement": (argmax[:, 31:] == base_argmax[:, 31:]).float().mean().item(),
        }
    return {"model": f"{shape.name} (random weights)", "modes": results}


def train_char_lm(
    ids: torch.Tensor, vocab_size: int, *, tiny: bool = False, seed: int = 0
) -> tuple[DecoderLM, float]:
    """A small DecoderLM trained with AdamW on random windows of ``ids``: (the model in eval
    mode, the last step's training loss)."""
    torch.manual_seed(seed)
    width, layers, context = (64, 2, 32) if tiny else (128, 4, 128)
    cfg = ModelConfig(
        kind="decoder_lm",
        vocab_size=vocab_size,
        d_model=width,
        n_heads=4,
        n_layers=layers,
        d_ff=4 * width,
        max_len=context,
        dropout=0.0,
    )
    model = cast(DecoderLM, build_model(cfg))  # kind="decoder_lm"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    steps = TINY_STEPS if tiny else STEPS
    gen = torch.Generator().manual_seed(seed)
    loss = torch.tensor(math.nan)
    for step in range(steps):
        for group in opt.param_groups:  # linear warm-up over 10% of the steps, then cosine
            warm = min(1.0, (step + 1) / max(1, steps // 10))
            group["lr"] = 3e-3 * warm * 0.5 * (1 + math.cos(math.pi * step / steps))
        start = torch.randint(0, len(ids) - context - 1, (16,), generator=gen)
        window = torch.stack([ids[s : s + context + 1] for s in start.tolist()])  # (16, C + 1)
        logits = model(window[:, :-1]).logits  # (16, C, V)
        loss = F.cross_entropy(logits.reshape(-1, vocab_size), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval(), loss.item()


def _logits(model, ids: torch.Tensor, cache: str | None) -> torch.Tensor:
    """model(ids).logits (B, T, V); with a ``cache`` dtype, through a fresh KV cache of that
    dtype, so every attention reads keys and values stored in it."""
    if cache is None:
        return model(ids).logits
    return model(ids, cache=model.new_cache(ids.size(0), ids.size(1), dtype=cache)).logits


@torch.inference_mode()
def _score(model, ids: torch.Tensor, cache: str | None = None) -> dict[str, Any]:
    """Perplexity of ``ids`` in non-overlapping windows of the model's context, and the argmax
    prediction at every scored position."""
    context = model.max_len
    n = (len(ids) - 1) // context * context
    inputs = ids[:n].reshape(-1, context)  # (W, C)
    targets = ids[1 : n + 1].reshape(-1, context)  # (W, C)
    logits = _logits(model, inputs, cache).float()  # (W, C, V)
    nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
    return {"perplexity": math.exp(nll.item()), "argmax": logits.argmax(-1)}


def _greedy(model, prompt: list[int], n: int, cache: str | None = None) -> list[int]:
    cfg = GenerationConfig(max_new_tokens=n, temperature=0.0, stop_token_ids=(), cache_dtype=cache)
    return generate(model, [prompt], cfg).tokens[0]


def _text(settings) -> tuple[str, str]:
    if settings.text:
        with open(settings.text, encoding="utf-8") as fh:
            return fh.read(), settings.text
    rng = random.Random(0)
    sentences = (
        " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 9))) + ". "
        for _ in range(600 if settings.tiny else 12000)
    )
    return "".join(sentences), "a generated text of simple sentences (no --text given)"
