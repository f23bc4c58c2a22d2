"""Markdown tables of the ``decode`` and ``quality`` suites (registered in ``tables._RENDER``)."""

from __future__ import annotations

from typing import Any


def render_decode(s: dict[str, Any]) -> list[str]:
    from attnlab.bench.tables import fmt_num, md_table  # tables imports this module

    out = [
        f"Random GPT-2 weights shared by every contender; {s['new_tokens']} new tokens after the "
        "prompt. decode tok/s = batch / ms per step, timed from the first new token to the last "
        "(prefill excluded; whole-call tok/s includes it); ratio = decode tok/s / transformers'; "
        "batch-1 rows of a --compile run use compile=True (int8_eager: without). Floor = "
        "(linear weights in the mode + the KV cache in its dtype, fp32 or bf16 (_kvbf16), at "
        f"its average length) / the measured bandwidth, "
        f"**{s['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s**; of floor = floor ms / measured ms "
        "(> 1: the weights stay in cache).",
        "",
    ]
    rows = []
    for row in s["runs"]:
        m = row["model"]
        for c in row["contenders"]:
            rows.append(
                [
                    f"{m['name']} ({m['n_layers']}L, {m['d_model']}D)",
                    str(row["context"]),
                    str(row["batch"]),
                    c["name"],
                    fmt_num(c["decode_tokens_per_s"], ",.1f"),
                    fmt_num(c["decode_ms_per_step"], ".2f"),
                    fmt_num(c["tokens_per_s"], ",.1f"),
                    ""
                    if c["name"] == "hf_gpt2"
                    else fmt_num(row["ratios"].get(f"{c['name']}_vs_hf_gpt2"), ".2f"),
                    fmt_num(c.get("bytes_per_step", 0) / 2**20, ".1f")
                    if "bytes_per_step" in c
                    else "",
                    fmt_num(c.get("floor_ms_per_step"), ".2f"),
                    fmt_num(c.get("of_floor"), ".2f"),
                    fmt_num(c["rel_spread"], ".0%"),
                ]
            )
    header = [
        "model",
        "context",
        "batch",
        "contender",
        "decode tok/s",
        "ms/step",
        "whole-call tok/s",
        "ratio",
        "MiB read/step",
        "floor ms",
        "of floor",
        "spread",
    ]
    return out + md_table(header, rows)


def render_quality(s: dict[str, Any]) -> list[str]:
    from attnlab.bench.tables import fmt_num, md_table  # tables imports this module

    lm = s["char_lm"]
    out = [
        f"Char LM ({lm['model']}) trained here for {lm['steps']} steps on {lm['text']}; "
        f"perplexity on {lm['heldout_tokens']:,} held-out characters. Greedy agreement: common "
        f"prefix of {s['greedy_tokens']} greedy tokens / {s['greedy_tokens']}; top-1 agreement: "
        "the fraction of positions where the mode's argmax is fp32's, teacher-forced (char LM: "
        "the held-out text; GPT-2: fp32's greedy continuation). _kvbf16: the same weights with "
        "a bf16 KV cache (perplexity through a bf16 cache of each window).",
        "",
    ]
    rows = [
        [
            lm["model"],
            mode,
            fmt_num(r.get("perplexity"), ".4f"),
            fmt_num(r.get("perplexity_change"), "+.3%"),
            fmt_num(r["greedy_prefix"], ".0%"),
            fmt_num(r["top1_agreement"], ".1%"),
        ]
        for mode, r in lm["modes"].items()
    ]
    g = s["gpt2"]
    rows += [
        [
            g["model"],
            mode,
            "",
            "",
            fmt_num(r["greedy_prefix"], ".0%"),
            fmt_num(r["top1_agreement"], ".1%"),
        ]
        for mode, r in g["modes"].items()
    ]
    header = ["model", "weights", "perplexity", "change vs fp32", "greedy prefix", "top-1 agree"]
    return out + md_table(header, rows)
