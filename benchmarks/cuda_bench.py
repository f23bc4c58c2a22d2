"""attnlab on a CUDA GPU, side by side with what a user would otherwise pick, in one run.

The ``attnlab bench`` suites are built for the CPU (thread counts, the CPU engine, a matmul peak
per core). This script times the two workloads that matter on a GPU with the same contenders and
the same interleaved rounds (``attnlab.bench.harness.interleave``), with a clock that waits for
the GPU (``torch.cuda.synchronize``) at each round's start and end:

* **training** (suite ``lm``'s step: forward + cross-entropy + backward + AdamW, same batch r for
  every contender in round r) at two shapes: nanoGPT's shakespeare-char model (6 layers, width
  384, context 256, batch 64, vocab 65) and GPT-2 small (12 layers, width 768, context 1024,
  batch 8, vocab 50304), each in fp32 and under ``torch.autocast("cuda", torch.bfloat16)``;
  contenders attnlab ``DecoderLM``, ``transformers.GPT2LMHeadModel`` (sdpa) and
  ``nn.TransformerEncoder``, all the same architecture (``attnlab.bench.lm_train``), plus
  attnlab and GPT-2 under ``torch.compile`` in bf16 at the GPT-2 shape (the nanoGPT recipe);
* **generation** (suite ``generate``'s call: greedy, batch 1, a 64-token prompt then ``--new``
  tokens) from a random GPT-2 small and its attnlab copy (same weights): attnlab ``generate``
  eager and with ``compile=True``, and transformers' ``generate`` with its KV cache.

    python benchmarks/cuda_bench.py --out benchmarks/cuda     # on a machine with a CUDA GPU
    python benchmarks/cuda_bench.py --device cpu --tiny       # seconds: checks the script only

Each training row also reports MFU: tokens/s x (6 N + 12 L D T) FLOPs per token over the
device's dense bf16 peak (a table of datasheet peaks by GPU name, or ``--peak-tflops``), for the
fp32 rows too, so every row is measured against the same ceiling.

``--suite nanogpt --nanogpt DIR --text FILE`` runs nanoGPT's own shakespeare-char training and
attnlab's side by side instead (``benchmarks/nanogpt_race.py``).

Writes ``results.json`` and ``RESULTS.md`` to ``--out``. fp32 matmuls here use PyTorch's default
(no TF32) for every contender; ``attnlab train`` turns TF32 on for CUDA (``matmul_precision``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from attnlab.bench.generation import agreement, make_attnlab_work
from attnlab.bench.harness import interleave, ratio
from attnlab.bench.lm_train import (
    LMShape,
    build_lm,
    flops_per_token,
    hf_gpt2_config,
    make_batches,
    make_train_step,
    non_embedding_params,
)

SHAPES = {
    "nanogpt_char": LMShape("nanogpt_char", 6, 6, 384, 256, 64),
    "gpt2_small": LMShape("gpt2_small", 12, 12, 768, 1024, 8, vocab=50304),
}
TINY = {
    "nanogpt_char": LMShape("nanogpt_char", 2, 2, 32, 16, 2),
    "gpt2_small": LMShape("gpt2_small", 2, 2, 48, 24, 2, vocab=101),
}
TRAIN = ("attnlab", "hf_gpt2_sdpa", "torch_nn")
COMPILED = ("attnlab", "hf_gpt2_sdpa")  # under torch.compile, bf16, GPT-2 shape only
SUITES = ("train", "generate", "nanogpt")
# Dense bf16 tensor-core peaks (vendor datasheets, no sparsity), FLOP/s, by a name fragment;
# the first fragment found in the device's name wins. --peak-tflops overrides.
BF16_PEAKS = (
    ("H100 PCIe", 756e12),
    ("GH200", 989.4e12),
    ("H200", 989.4e12),
    ("H100", 989.4e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)


def bf16_peak(device, override_tflops: float | None) -> float | None:
    """The device's dense bf16 peak in FLOP/s (None when unknown: MFU is then not reported)."""
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for frag, peak in BF16_PEAKS if frag in name), None)


def synced_clock(device: torch.device):
    """time.perf_counter after every queued GPU kernel has finished."""
    if device.type != "cuda":
        return time.perf_counter

    def clock() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return clock


def timed(works, first, first_key: str, args, clock, warmup: int) -> dict[str, dict]:
    """Interleaved rounds of ``works``: {name: timing fields}, with each compiled contender's
    first (compiling) call's seconds under ``first_key``."""
    timings = interleave(
        works, rounds=args.rounds, warmup=warmup, min_round_s=args.min_round_s, clock=clock
    )
    contenders = {k: t.to_dict("tokens") for k, t in timings.items()}
    for k, c in contenders.items():
        if k in first:
            c[first_key] = first[k]
        say(f"  {k:26s} {c['tokens_per_s']:12.1f} tok/s")
    return contenders


def train_contender(name: str, shape: LMShape, device, bf16: bool, compiled: bool, batches):
    """work(r) -> tokens: one training step of ``name`` on batch r, on ``device``."""
    model, forward = build_lm(name, shape)
    model.to(device)
    run = torch.compile(forward) if compiled else forward
    autocast = (lambda: torch.autocast(device.type, torch.bfloat16)) if bf16 else nullcontext

    def step_forward(ids):
        with autocast():
            return run(ids).float()  # (B, T, V) fp32 logits for the loss

    return make_train_step(model, step_forward, batches)


def time_training(args, device, clock) -> list[dict[str, Any]]:
    """Interleaved training steps per shape; MFU = tokens/s x (6 N + 12 L D T) / bf16 peak."""
    rows = []
    peak = bf16_peak(device, args.peak_tflops)
    for shape in (TINY if args.tiny else SHAPES).values():
        batches = [(x.to(device), y.to(device)) for x, y in make_batches(shape, args.rounds)]
        works, first, failed = {}, {}, {}
        for name in TRAIN:
            for bf16 in (False, True):
                works[f"{name}{'_bf16' if bf16 else ''}"] = train_contender(
                    name, shape, device, bf16, False, batches
                )
        if shape.name == "gpt2_small" and args.compile:
            for name in COMPILED:
                key = f"{name}_compiled_bf16"
                try:
                    work = train_contender(name, shape, device, True, True, batches)
                    t0 = clock()
                    work(-1)  # compiles
                except Exception as err:  # noqa: BLE001 - a contender that cannot compile
                    failed[key] = f"{type(err).__name__}: {err}"[:300]
                    say(f"train {shape.name}: {key} failed: {failed[key]}")
                    continue
                works[key], first[key] = work, clock() - t0
                say(f"train {shape.name}: compiled {key} in {first[key]:.1f} s")
        say(f"train {shape.name}: timing {', '.join(works)}")
        contenders = timed(works, first, "first_step_seconds", args, clock, warmup=2)
        per_token = flops_per_token(non_embedding_params(build_lm("attnlab", shape)[0]), shape)
        for c in contenders.values():
            c["mfu"] = c["tokens_per_s"] * per_token / peak if peak else None
        base = contenders["hf_gpt2_sdpa"]["tokens_per_s"]
        base16 = contenders["hf_gpt2_sdpa_bf16"]["tokens_per_s"]
        ratios = {
            "attnlab_vs_hf_gpt2_sdpa": ratio(contenders["attnlab"]["tokens_per_s"], base),
            "attnlab_vs_torch_nn": ratio(
                contenders["attnlab"]["tokens_per_s"], contenders["torch_nn"]["tokens_per_s"]
            ),
            "attnlab_bf16_vs_hf_gpt2_sdpa_bf16": ratio(
                contenders["attnlab_bf16"]["tokens_per_s"], base16
            ),
            "attnlab_bf16_vs_torch_nn_bf16": ratio(
                contenders["attnlab_bf16"]["tokens_per_s"],
                contenders["torch_nn_bf16"]["tokens_per_s"],
            ),
        }
        if "attnlab_compiled_bf16" in contenders:
            ratios["attnlab_compiled_bf16_vs_hf_gpt2_sdpa_compiled_bf16"] = ratio(
                contenders["attnlab_compiled_bf16"]["tokens_per_s"],
                contenders["hf_gpt2_sdpa_compiled_bf16"]["tokens_per_s"],
            )
        rows.append(
            {"shape": vars(shape), "contenders": contenders, "ratios": ratios, "failed": failed,
             "flops_per_token": per_token, "bf16_peak_flops": peak}
        )  # fmt: skip
    return rows


def time_generation(args, device, clock) -> dict[str, Any]:
    from transformers import GPT2LMHeadModel

    from attnlab.bench.generation import hf_greedy
    from attnlab.interop import from_transformers

    shape = (TINY if args.tiny else SHAPES)["gpt2_small"]
    shape = LMShape(shape.name, shape.n_layers, shape.n_heads, shape.d_model, 0, 1, 50257)
    context, n = (8, 8) if args.tiny else (64, args.new)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(hf_gpt2_config(shape, context + n, "sdpa")).eval()
    ours = from_transformers(hf).eval().to(device)
    hf.to(device)
    prompt = torch.randint(0, shape.vocab, (context,), generator=torch.Generator().manual_seed(9))
    ids = prompt[None].to(device)  # (1, C)
    outputs: dict[str, list] = {"attnlab": [], "attnlab_compiled": [], "hf_gpt2": []}

    def hf_work(r: int) -> float:
        tokens = hf_greedy(hf, ids, torch.ones_like(ids), n)[0, context:].tolist()
        outputs["hf_gpt2"].append(tokens)
        return float(len(tokens))

    works = {"attnlab": make_attnlab_work(ours, prompt.tolist(), n, outputs["attnlab"])}
    first = {}
    if args.compile:
        works["attnlab_compiled"] = make_attnlab_work(
            ours, prompt.tolist(), n, outputs["attnlab_compiled"], compile=True
        )
        t0 = clock()
        works["attnlab_compiled"](-1)
        first["attnlab_compiled"] = clock() - t0
        say(f"generate: compiled the decode step in {first['attnlab_compiled']:.1f} s")
    works["hf_gpt2"] = hf_work
    say(f"generate: timing {', '.join(works)} ({n} new tokens after {context})")
    contenders = timed(works, first, "first_call_seconds", args, clock, warmup=1)
    hf_rate = contenders["hf_gpt2"]["tokens_per_s"]
    return {
        "model": vars(shape),
        "prompt_tokens": context,
        "new_tokens": n,
        "contenders": contenders,
        "ratios": {
            f"{k}_vs_hf_gpt2": ratio(c["tokens_per_s"], hf_rate)
            for k, c in contenders.items()
            if k != "hf_gpt2"
        },
        "tokens_agree": {
            k: agreement(outputs[k][0], outputs["hf_gpt2"][0])
            for k in ("attnlab", "attnlab_compiled")
            if outputs[k]
        },
    }


def machine(device) -> dict[str, Any]:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "platform": platform.platform(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
        )
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# attnlab on a CUDA GPU",
        "",
        f"    {result['command']}",
        "",
        f"{m.get('gpu', m['device'])}, torch {m['torch']} (CUDA {m.get('cuda')}), "
        f"transformers {m.get('transformers')}, Python {m['python']}; {result['date']}, "
        f"{result['wall_s']:.0f} s. Median of {result['rounds']} interleaved rounds; the spread "
        "is (max - min) / median of the per-round rates.",
        "",
        "## Training step (tokens/s)",
        "",
    ]
    for row in result.get("training", []):
        s = row["shape"]
        lines += [
            f"**{s['name']}**: {s['n_layers']} layers, {s['n_heads']} heads, width "
            f"{s['d_model']}, context {s['context']}, batch {s['batch']}, vocab {s['vocab']}",
            "",
            f"MFU = tokens/s x {row['flops_per_token']:.3g} FLOPs per token (6 N + 12 L D T) / "
            + (f"{row['bf16_peak_flops'] / 1e12:.0f} TFLOP/s (the device's dense bf16 peak)"
               if row["bf16_peak_flops"] else "an unknown peak (not reported)"),
            "",
            "| contender | tokens/s | spread | MFU |",
            "|---|---|---|---|",
        ]  # fmt: skip
        for name, c in row["contenders"].items():
            mfu = f"{c['mfu']:.1%}" if c.get("mfu") is not None else "-"
            lines.append(f"| {name} | {c['tokens_per_s']:,.0f} | {c['rel_spread']:.1%} | {mfu} |")
        lines += ["", *[f"- {k}: **{v:.2f}x**" for k, v in row["ratios"].items()]]
        lines += [*[f"- {k} did not run: {v}" for k, v in row["failed"].items()], ""]
    g = result.get("generation")
    if g is None:
        return "\n".join(lines)
    lines += [
        "## Greedy generation (tokens/s, batch 1)",
        "",
        f"Random GPT-2 small (vocab {g['model']['vocab']}), the same weights in both; "
        f"{g['prompt_tokens']}-token prompt, {g['new_tokens']} new tokens, prefill included.",
        "",
        "| contender | tokens/s | spread |",
        "|---|---|---|",
        *[
            f"| {k} | {c['tokens_per_s']:,.1f} | {c['rel_spread']:.1%} |"
            for k, c in g["contenders"].items()
        ],
        "",
        *[f"- {k}: **{v:.2f}x**" for k, v in g["ratios"].items()],
        f"- tokens equal to transformers' (common prefix / N): {g['tokens_agree']}",
        "",
    ]
    return "\n".join(lines)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N; cpu only with --tiny")
    p.add_argument("--tiny", action="store_true", help="toy sizes: checks the script, no numbers")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-round-s", type=float, default=0.5)
    p.add_argument("--new", type=int, default=256, help="new tokens per generation call")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--out", default="benchmarks/cuda", help="folder for results.json, RESULTS.md")
    p.add_argument(
        "--suite",
        default="train,generate",
        help="comma-separated: train, generate, nanogpt (nanoGPT's shakespeare-char run side by "
        "side: benchmarks/nanogpt_race.py, needs --nanogpt and --text)",
    )
    p.add_argument("--nanogpt", help="suite nanogpt: a nanoGPT checkout")
    p.add_argument("--text", help="suite nanogpt: tinyshakespeare's input.txt")
    p.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, for MFU")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device here: run it on a machine with a GPU (or --device cpu --tiny)")
    if device.type != "cuda" and not args.tiny:
        p.error("this benchmark is for a GPU; on the CPU use `attnlab bench` (or add --tiny)")
    suites = [x.strip() for x in args.suite.split(",") if x.strip()]
    if not suites or set(suites) - set(SUITES):
        p.error(f"--suite takes some of {', '.join(SUITES)}")
    if "nanogpt" in suites:
        if not (args.nanogpt and args.text):
            p.error("--suite nanogpt needs --nanogpt DIR (a nanoGPT checkout) and --text FILE")
        from nanogpt_race import main as race  # this folder: run as a script, it is on sys.path

        race_args = ["--nanogpt", args.nanogpt, "--text", args.text, "--out", args.out]
        race([*race_args, *(["--tiny"] if args.tiny else [])])
        suites.remove("nanogpt")
        if not suites:
            return 0
    t0 = time.perf_counter()
    clock = synced_clock(device)
    result = {
        "command": "python benchmarks/cuda_bench.py " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(device),
        "rounds": args.rounds,
    }
    if "train" in suites:
        result["training"] = time_training(args, device, clock)
    if "generate" in suites:
        result["generation"] = time_generation(args, device, clock)
    result["wall_s"] = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "RESULTS.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
