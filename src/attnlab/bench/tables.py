"""Markdown tables of each suite's results (used by :mod:`attnlab.bench.report`).

One renderer per suite, each taking that suite's JSON block and returning Markdown lines; a
suite that did not run "ok" renders as its status and reason.
"""

from __future__ import annotations

import math
from typing import Any

from attnlab.bench.decode_tables import render_decode, render_quality

MIB = 2**20


def fmt_num(x: Any, fmt: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, fmt)


def threads(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def fmt_mib(x: Any) -> str:
    return "-" if not x else f"{x / MIB:,.1f}"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def suite_tables(result: dict[str, Any]) -> list[str]:
    """Markdown tables, one section per suite that ran."""
    out: list[str] = []
    for name, suite in result.get("suites", {}).items():
        out += ["", f"### {name}", ""]
        if suite.get("status") != "ok":
            out.append(f"**{suite.get('status')}**: {suite.get('reason') or suite.get('error')}")
            continue
        out += _RENDER.get(name, lambda s: [])(suite)
    return out


def _matmul(s: dict) -> list[str]:
    rows = [
        [
            str(r["n"]),
            fmt_num(r["gflops"], ".1f"),
            ", ".join(fmt_num(g, ".1f") for g in r["gflops_rounds"]),
        ]
        for r in s["sizes"]
    ]
    return [
        f"fp32 `torch.mm`, {threads(s['threads'])}; peak = best median = "
        f"**{s['peak_gflops']:.1f} GFLOP/s**",
        "",
    ] + md_table(["n", "median GFLOP/s", "rounds"], rows)


def _lm(s: dict) -> list[str]:
    out = [f"Optimizer: {s['optimizer']}. Peak: {fmt_num(s['matmul_peak_gflops'], '.1f')} GFLOP/s."]
    for shape in s["shapes"]:
        sh = shape["shape"]
        desc = (
            f"**{sh['name']}**: {sh['n_layers']} layers, {sh['n_heads']} heads, width "
            f"{sh['d_model']}, context {sh['context']}, batch {sh['batch']}, vocab {sh['vocab']}; "
            f"peak used {fmt_num(shape.get('peak_gflops_used'), '.1f')} GFLOP/s (matmul "
            f"n={shape.get('matmul_same_rounds_n')} in the same rounds: "
            f"{fmt_num(shape.get('matmul_same_rounds_gflops'), '.1f')})"
        )
        for c in shape["contenders"]:
            if c.get("first_step_seconds"):
                desc += f"; {c['name']} first step (compiling) {c['first_step_seconds']:.1f} s"
        base = {c["name"]: c.get("tokens_per_s") for c in shape["contenders"]}.get("attnlab")
        rows = []
        for c in shape["contenders"]:
            if c.get("status") != "ok":
                rows.append([c["name"], c.get("status", "?"), "-", "-", "-", "-", "-"])
                continue
            rows.append(
                [
                    c["name"],
                    f"{c['tokens_per_s']:,.0f}",
                    f"{c['rel_spread']:.0%}",
                    fmt_num(base / c["tokens_per_s"] if base else None, ".2f"),
                    fmt_num(c["achieved_gflops"], ".1f"),
                    fmt_num(c["fraction_of_peak"], ".0%"),
                    f"{c['non_embedding_params']:,}",
                ]
            )
        header = ["contender", "tokens/s", "spread", "attnlab / this", "GFLOP/s", "of peak"]
        out += ["", desc, ""] + md_table([*header, "non-emb params"], rows)
    return out


def _seq2seq(s: dict) -> list[str]:
    sh = s["shape"]
    out = [
        f"Width {sh['d_model']}, {sh['n_layers']}+{sh['n_layers']} layers, {sh['n_heads']} "
        f"heads, FFN {sh['d_ff']}, vocab {sh['vocab']}, {sh['batch']} sentences per batch; "
        f"{s['target_padding_fraction']:.0%} of target positions are padding; peak used "
        f"{fmt_num(s.get('peak_gflops_used'), '.1f')} GFLOP/s.",
        "",
    ]
    rows = [
        [
            c["name"],
            f"{c['tokens_per_s']:,.0f}",
            f"{c['rel_spread']:.0%}",
            fmt_num(c.get("achieved_gflops"), ".1f"),
            fmt_num(c.get("fraction_of_peak"), ".0%"),
        ]
        for c in s["contenders"]
    ]
    out += md_table(["contender", "target tokens/s", "spread", "GFLOP/s", "of peak"], rows)
    value = fmt_num(s["ratios"]["attnlab_vs_torch_nn"], ".2f")
    fast = fmt_num(s["ratios"].get("attnlab_fast_vs_torch_nn"), ".2f")
    return out + ["", f"attnlab fast / nn.Transformer = **{fast}**; plain: {value}"]


def _generate(s: dict) -> list[str]:
    out = [
        "Random GPT-2 weights shared by both (vocab 65); batch 1; prompt = context tokens, then "
        f"{s['new_tokens']} new tokens (window = context + new tokens).",
        "",
    ]
    rows = []
    for row in s["runs"]:
        m = row["model"]
        model = f"{m['name']} ({m['n_layers']}L, {m['d_model']}D)"
        for c in row["contenders"]:
            ours = c["name"] == "attnlab"
            speed = f"{c['tokens_per_s']:,.1f}" if c.get("status") == "ok" else c["status"]
            ratio = fmt_num(row["ratios"].get(f"{c['name']}_vs_hf_gpt2"), ".2f")
            agree = fmt_num(row.get("tokens_agree"), ".0%") if ours else ""
            first = fmt_num(c.get("first_call_seconds"), ".1f")
            rows.append(
                [
                    model,
                    str(row["context"]),
                    c["name"],
                    speed,
                    "" if c["name"] == "hf_gpt2" else ratio,
                    agree,
                    first,
                ]
            )
    header = [
        "model",
        "context",
        "contender",
        "tokens/s",
        "ratio",
        "same tokens",
        "first call s (compile)",
    ]
    return out + md_table(header, rows)


def _attention(s: dict) -> list[str]:
    sh = s["shape"]
    out = [
        f"(B, H, Dh) = ({sh['batch']}, {sh['heads']}, {sh['d_head']}), forward + backward, "
        f"{threads(s['threads'])}. Memory: {s['memory_method']}.",
        "",
    ]
    rows = []
    for r in s["lengths"]:
        e, f = r.get("explicit", {}), r.get("fused", {})
        rows.append(
            [
                str(r["n"]),
                fmt_num(e.get("seconds", math.nan) * 1e3, ".1f")
                if e.get("status") == "ok"
                else "skipped",
                fmt_num(f.get("seconds", math.nan) * 1e3, ".1f"),
                fmt_mib(e.get("extra_bytes")),
                fmt_mib(f.get("extra_bytes")),
                fmt_num(e.get("matmul_gflops"), ".1f"),
                fmt_num(f.get("matmul_gflops"), ".1f"),
            ]
        )
    out += md_table(
        [
            "N",
            "explicit ms",
            "fused ms",
            "explicit MiB",
            "fused MiB",
            "explicit GFLOP/s",
            "fused GFLOP/s",
        ],
        rows,
    )
    skipped = [
        f"N={r['n']}: {r['explicit']['reason']}"
        for r in s["lengths"]
        if r.get("explicit", {}).get("status") == "skipped"
    ]
    if skipped:
        out += ["", "Explicit path skipped: " + "; ".join(skipped) + "."]
    fit_ns = s["fits"]["fused"]["time_fit_lengths"]
    out += [
        "",
        f"Log-log fits over N in {fit_ns} (004: time O(N^2 d), memory O(N^2) for the "
        "explicit path):",
        "",
    ]
    fit_rows = [
        [
            p,
            fmt_num(s["fits"][p]["time_exponent"], ".2f"),
            fmt_num(s["expected"][p]["time_exponent"], ".0f"),
            fmt_num(s["fits"][p]["memory_exponent"], ".2f"),
            fmt_num(s["expected"][p]["memory_exponent"], ".0f"),
        ]
        for p in s["fits"]
    ]
    return out + md_table(
        ["path", "time exponent", "expected", "memory exponent", "expected"], fit_rows
    )


def _memory(s: dict) -> list[str]:
    rows = [
        [
            c["shape"],
            c["contender"],
            fmt_mib(c.get("peak_bytes")),
            fmt_mib(c.get("step_extra_bytes")),
            c.get("status", "?"),
        ]
        for c in s["cases"]
    ]
    return [f"Method: {s['method']}.", ""] + md_table(
        ["shape", "contender", "training peak MiB", "step extra MiB", "status"], rows
    )


def _recipe(s: dict) -> list[str]:
    rounds = s.get("rounds") or [dict(s, round=0, order=s["presets"])]  # JSON before rounds
    rows = []
    for r in rounds:
        b, f, ratio = r["baseline"], r["fast"], r["time_ratio_fast_vs_baseline"]
        rows.append(
            [
                str(r["round"] + 1),
                " then ".join(r["order"]),
                f"{r['target_val_loss']:.4f}",
                f"{fmt_num(b['seconds'], '.1f')} (step {b['step']})",
                f"{fmt_num(f['seconds'], '.1f')} (step {f['step']})" if f["reached"] else "never",
                fmt_num(ratio, ".3f"),
            ]
        )
    value = s["time_ratio_fast_vs_baseline"]
    spread = (
        f" ({fmt_num(s['ratio_min'], '.3f')}-{fmt_num(s['ratio_max'], '.3f')})"
        if s.get("ratio_min") is not None
        else ""
    )
    base, fast = s["presets"]
    return [
        f"Text `{s['text']}`; each round's target is {base}'s final validation loss in that round "
        f"(round r trains both presets with seed + r, in alternating order). Ratio, median "
        f"(min-max) over {len(rounds)} round(s): {fmt_num(value, '.3f')}{spread}.",
        "",
    ] + md_table(["round", "order", "target loss", f"{base} s", f"{fast} s", "ratio"], rows)


def _profile(s: dict) -> list[str]:
    out = []
    for item in s["profiles"]:
        out += [
            f"**{item['what']}**: {item['wall_ms']:.1f} ms wall without the profiler, "
            f"{item['total_ms']:.1f} ms self time in operators",
            "",
        ]
        out += md_table(
            ["op", "self CPU ms", "share", "calls"],
            [
                [f"`{o['name']}`", f"{o['self_cpu_ms']:.2f}", f"{o['share']:.0%}", str(o["calls"])]
                for o in item["top_ops"]
            ],
        )
        out.append("")
    return out


def _modern(s: dict) -> list[str]:
    out = [
        "Medium shape as a Llama-style decoder (6 layers, 6 query heads, width 384), "
        "greedy decode.",
        "",
    ]
    rows = []
    for r in s["kv_heads"]:
        rows.append(
            [
                r["attention"],
                str(r["n_kv_heads"]),
                f"{r['kv_bytes_per_token']:,.0f}",
                f"{r['tokens_per_s']:,.1f}",
                fmt_num(r["speed_vs_mha"], ".2f"),
                f"{r['batch']} x ({r['context']} + {r['new_tokens']})",
            ]
        )
    out += md_table(
        [
            "attention",
            "KV heads",
            "KV cache bytes/token",
            "tokens/s",
            "vs MHA",
            "batch x (prompt + new)",
        ],
        rows,
    )
    out += [
        "",
        "Random-weight real shapes, batch 1, 64-token prompt, attnlab vs transformers "
        "generate (same weights):",
        "",
    ]
    rows = []
    for r in s["vs_transformers"]:
        speeds = {c["name"]: c["tokens_per_s"] for c in r["contenders"]}
        rows.append(
            [
                r["model"],
                f"{r['params'] / 1e6:.0f}M",
                str(r["new_tokens"]),
                f"{speeds['attnlab']:,.1f}",
                f"{speeds['transformers']:,.1f}",
                fmt_num(r["attnlab_vs_transformers"], ".2f"),
                fmt_num(r["tokens_agree"], ".0%"),
            ]
        )
    return out + md_table(
        [
            "model",
            "params",
            "new tokens",
            "attnlab tok/s",
            "transformers tok/s",
            "ratio",
            "same tokens",
        ],
        rows,
    )


def _inspect(s: dict) -> list[str]:
    out = [
        f"Forward only (eval, no grad), {threads(s['threads'])}; tokens/s median; see "
        "attnlab.bench.inspect_cost for the contenders",
        "",
    ]
    rows = []
    for shape in s["shapes"]:
        rate = {c["name"]: c["tokens_per_s"] for c in shape["contenders"]}
        r = shape["ratios"]
        rows.append(
            [shape["shape"]]
            + [fmt_num(rate[n], ",.0f") for n in ("no_hook_points", "plain", "explicit_path")]
            + [fmt_num(rate["cache_all"], ",.0f")]
            + [fmt_num(r[k], ".3f") for k in ("plain_vs_no_hook_points", "cache_all_vs_plain")]
            + [
                f"{shape['points_per_forward']} x {shape['idle_point_call_us']:.2f} us = "
                f"{shape['idle_points_fraction']:.2e}"
            ]
        )
    header = ["shape", "no hook points", "plain", "explicit path", "full cache"]
    header += ["plain / no hooks", "full cache / plain", "idle points, share of plain"]
    return out + md_table(header, rows)


def _optim(s: dict) -> list[str]:
    shape = s["shape"]
    rows = [
        [name, fmt_num(ms, ".3g"), ", ".join(fmt_num(r, ".3g") for r in c["calls_per_s_rounds"])]
        for (name, ms), c in zip(s["ms_per_call"].items(), s["contenders"].values())
    ]
    return [
        f"{s['device']}, {shape['n_layers']} layers x width {shape['d_model']}, context "
        f"{shape['context']}, batch {shape['batch']}"
        + (", bf16 autocast" if s["autocast_bf16"] else ", fp32")
        + (", compiled" if s["compiled"] else "")
        + f": Muon step / AdamW step = **{fmt_num(s['muon_vs_adamw_step'], '.3g')}**, Muon "
        f"update batched / per matrix = **{fmt_num(s['muon_batched_vs_per_matrix'], '.3g')}**",
        "",
    ] + md_table(["contender", "ms per call (median)", "calls/s per round"], rows)


_RENDER = {
    "optim": _optim,
    "modern": _modern,
    "decode": render_decode,
    "quality": render_quality,
    "matmul": _matmul,
    "lm": _lm,
    "seq2seq": _seq2seq,
    "generate": _generate,
    "attention": _attention,
    "memory": _memory,
    "recipe": _recipe,
    "profile": _profile,
    "inspect": _inspect,
}
