"""nanoGPT's shakespeare-char run and attnlab's, side by side on one GPU: wall time to a loss.

The benchmark most people know is nanoGPT's ``config/train_shakespeare_char.py`` (6 layers, 6
heads, width 384, context 256, batch 64, dropout 0.2, AdamW 1e-3 -> 1e-4 cosine, bf16 autocast,
torch.compile). This script runs, as separate processes a user would start, in interleaved rounds
after one untimed warm-up run each (so every contender finds its compile cache warm):

    nanogpt         nanoGPT's own train.py with that config, 2,000 iterations
                    (``--max_iters=2000 --lr_decay_iters=2000``), in its own checkout
    attnlab_same    ``attnlab train`` with the same model and recipe from a TOML (learned
                    positions, AdamW, 2,000 steps, evaluation every 250 steps on 100 batches)
    attnlab_gpu_char[_N]  ``attnlab train --preset gpu-char`` (rotary, QK-norm, Muon), with
                    ``--steps N`` for each N of ``--gpu-char-steps``

Each process's stdout is read line by line and every evaluation line is time-stamped on arrival
(seconds since the process was launched), so "time to reach a validation loss" is measured the
same way for every contender: launch -> the first evaluation line at or below ``--target``
(default 1.45, nanoGPT's loss at 2,000 iterations). The headline ratio is

    time to target (attnlab gpu-char) / wall time of nanoGPT's whole run     (issue 37: <= 0.5)

both losses being mean per-character cross-entropy on the last 10% of the same text.

    python benchmarks/nanogpt_race.py --nanogpt /path/to/nanoGPT --text tinyshakespeare.txt

nanoGPT's data are prepared from ``--text`` (its ``prepare.py`` reads ``input.txt`` when present,
so nothing is downloaded). Writes ``nanogpt.json`` and ``NANOGPT.md`` to ``--out``.

For every attnlab run the report also breaks the time outside the training steps down by phase
(the run's ``timing.json``: imports, data, model, device, optimizers, first step, evaluations,
checkpoints, loss plot, ...) and adds the process's exit (wall time - the summary's "since the
command started"), the one phase a process cannot time itself. Issue 37's item 3 asks for at
most 5 s outside the steps at the same-recipe configuration with a warm compile cache::

    python benchmarks/nanogpt_race.py --text tinyshakespeare.txt --only attnlab_same --rounds 3

``--attnlab-module M`` runs attnlab's contenders as ``python -m M`` instead of ``python -m
attnlab``: a patched CLI measuring a candidate change before it lands (on 28 Nov 2026 the rotary
table, then ``benchmarks/cuda/attnlab_rotary_table.py``, with ``PYTHONPATH=src:benchmarks/cuda``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NANOGPT_EVAL = re.compile(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)")
ATTNLAB_EVAL = re.compile(r"step (\d+):.*\bval_loss ([\d.]+)")
ATTNLAB_TIME = re.compile(r"time: ([\d.]+) s of training.*?, ([\d.]+) s of setup and evaluation")
ATTNLAB_SINCE = re.compile(r"([\d.]+) s since the command started")

# nanoGPT's shakespeare-char model and recipe, written for attnlab (same evaluation cadence).
SAME_RECIPE = """\
[model]
kind = "decoder_lm"
d_model = 384
n_heads = 6
n_layers = 6
max_len = 256
dropout = 0.2
activation = "gelu"
bias = false
positional = "learned"
tie_embeddings = true

[train]
task = "lm"
tokenizer = "char"
context_len = 256
batch_size = 64
steps = {steps}
lr = 1e-3
min_lr = 1e-4
warmup_steps = {warmup}
betas = [0.9, 0.99]
weight_decay = 0.1
grad_clip = 1.0
val_fraction = 0.1
eval_every = {eval_every}
eval_batches = {eval_batches}
save_every = 0
log_every = 50
dtype = "bf16"
compile = true
"""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_timed(cmd: list[str], cwd: Path, pattern: re.Pattern, env: dict[str, str]) -> dict:
    """Run ``cmd``; return its wall time, return code, evaluation curve and the last lines."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        bufsize=1,
    )  # fmt: skip
    curve, lines = [], []
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.perf_counter() - t0
        lines.append(line.rstrip())
        m = pattern.search(line)
        if m:
            curve.append({"step": int(m.group(1)), "val_loss": float(m.group(m.lastindex)),
                          "seconds": now})  # fmt: skip
    rc = proc.wait()
    return {"wall_s": time.perf_counter() - t0, "rc": rc, "curve": curve, "tail": lines[-16:]}


def first_at_or_below(curve: list[dict], target: float) -> dict | None:
    return next((c for c in curve if c["val_loss"] <= target), None)


def prepare_nanogpt(nanogpt: Path, text: Path, python: str) -> None:
    data = nanogpt / "data" / "shakespeare_char"
    if (data / "train.bin").is_file() and (data / "input.txt").is_file():
        return
    shutil.copyfile(text, data / "input.txt")
    subprocess.run([python, "prepare.py"], cwd=data, check=True, capture_output=True)


def contenders(args, work: Path) -> dict[str, dict[str, Any]]:
    """{name: {"cmd", "cwd", "pattern", "warm"}}: each full run and its short warm-up run."""
    py = args.python
    steps, warm = (40, 6) if args.tiny else (2000, 20)
    nano_cfg = ["config/train_shakespeare_char.py", f"--max_iters={steps}",
                f"--lr_decay_iters={steps}"]  # fmt: skip
    if args.tiny:
        nano_cfg += ["--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32",
                     "--block_size=32", "--batch_size=4", "--eval_iters=2", "--eval_interval=20",
                     "--warmup_iters=2", "--dtype=float32"]  # fmt: skip
    out = {
        "nanogpt": {
            "cmd": [py, "train.py", *nano_cfg, f"--out_dir={work / 'nanogpt-out'}"],
            "warm": [
                py,
                "train.py",
                *nano_cfg,
                f"--max_iters={warm}",
                "--eval_iters=2",
                f"--eval_interval={warm}",
                f"--out_dir={work / 'nanogpt-warm'}",
            ],  # fmt: skip
            "cwd": args.nanogpt,
            "pattern": NANOGPT_EVAL,
        }
    }
    toml = work / "same.toml"
    toml.write_text(SAME_RECIPE.format(steps=steps, warmup=2 if args.tiny else 100,
                                       eval_every=20 if args.tiny else 250,
                                       eval_batches=2 if args.tiny else 100))  # fmt: skip
    attnlab = [
        py,
        "-m",
        args.attnlab_module,
        "train",
        "--text",
        str(args.text),
        "--no-progress",
    ]
    tiny = (
        ["--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--context-len", "32",
         "--max-len", "32", "--batch-size", "4", "--set", "compile=false", "--set", "dtype=fp32",
         "--device", "cpu", "--eval-batches", "2", "--warmup-steps", "2"]
        if args.tiny else []
    )  # fmt: skip
    short = ["--steps", str(warm), "--eval-every", str(warm), "--eval-batches", "2",
             "--warmup-steps", "2"]  # fmt: skip
    runs = {"attnlab_same": ["--config", str(toml)]}
    for n in args.gpu_char_steps:
        runs[f"attnlab_gpu_char_{n}"] = ["--preset", "gpu-char", "--steps", str(n)]
    if args.tiny:
        runs = {k: [*v, "--steps", "40", "--eval-every", "20"] for k, v in runs.items()}
    for name, extra in runs.items():
        out[name] = {
            "cmd": [*attnlab, *extra, *tiny, "--out", str(work / name)],
            "warm": [*attnlab, *extra, *tiny, *short, "--out", str(work / f"{name}-warm")],
            "cwd": Path.cwd(),
            "pattern": ATTNLAB_EVAL,
            # gpu-char runs differ only in --steps: one warm-up compiles for all of them
            "graph": "gpu_char" if name.startswith("attnlab_gpu_char") else name,
        }
    return out


def summarise(runs: dict[str, list[dict]], target: float) -> dict[str, Any]:
    """Per contender: medians over rounds; the headline ratios against nanoGPT's wall time."""
    table = {}
    for name, rounds in runs.items():
        reached = [first_at_or_below(r["curve"], target) for r in rounds]
        row = {
            "wall_s": [r["wall_s"] for r in rounds],
            "final_val_loss": [r["curve"][-1]["val_loss"] if r["curve"] else None for r in rounds],
            "time_to_target_s": [h["seconds"] if h else None for h in reached],
            "step_at_target": [h["step"] if h else None for h in reached],
        }
        split = [ATTNLAB_TIME.search("\n".join(r["tail"])) for r in rounds]
        if any(split):
            row["training_s"] = [float(m.group(1)) if m else None for m in split]
            row["setup_and_evaluation_s"] = [float(m.group(2)) if m else None for m in split]
            row["exit_s"] = [exit_seconds(r) for r in rounds]
        if any(r.get("timing") for r in rounds):
            row["phases_s"] = phase_table(rounds)
        table[name] = row
    nano = statistics.median(table["nanogpt"]["wall_s"]) if "nanogpt" in table else None
    ratios = {}
    for name, row in table.items():
        times = [t for t in row["time_to_target_s"] if t is not None]
        if name != "nanogpt" and nano and len(times) == len(row["time_to_target_s"]):
            ratios[f"{name}_time_to_target_vs_nanogpt_wall"] = statistics.median(times) / nano
    return {"contenders": table, "ratios": ratios, "nanogpt_median_wall_s": nano}


def exit_seconds(run: dict) -> float | None:
    """The process's exit: its wall time after the summary's "s since the command started"."""
    m = ATTNLAB_SINCE.search("\n".join(run["tail"]))
    return run["wall_s"] - float(m.group(1)) if m else None


def phase_table(rounds: list[dict]) -> dict[str, list[float | None]]:
    """{phase: [seconds per round]} from each round's timing.json, "other" and "exit" last."""
    names: dict[str, None] = {}
    for r in rounds:
        names.update(dict.fromkeys(p["name"] for p in (r.get("timing") or {}).get("phases", [])))
    table: dict[str, list[float | None]] = {}
    for name in names:
        table[name] = [
            next((p["seconds"] for p in (r.get("timing") or {}).get("phases", [])
                  if p["name"] == name), None)
            for r in rounds
        ]  # fmt: skip
    table["other"] = [(r.get("timing") or {}).get("other_s") for r in rounds]
    table["exit"] = [exit_seconds(r) for r in rounds]
    return table


def markdown(result: dict[str, Any]) -> str:
    s, target = result["summary"], result["target"]
    fmt = lambda xs, f="{:.1f}": " / ".join("-" if x is None else f.format(x) for x in xs)  # noqa: E731
    lines = [
        "# nanoGPT's shakespeare-char run vs attnlab, one GPU",
        "",
        f"    {result['command']}",
        "",
        f"{result['machine']}; {result['date']}. {result['rounds']} interleaved rounds after one "
        "warm-up run each (warm compile caches); every number is one value per round. Time to "
        f"target = process launch -> the first evaluation line with validation loss <= {target}.",
        "",
        "| run | wall s | training s | setup + evaluation s | final val loss | time to "
        f"{target} s (step) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in s["contenders"].items():
        at = [f"{t:.1f} ({st})" if t is not None else "never" for t, st in
              zip(r["time_to_target_s"], r["step_at_target"])]  # fmt: skip
        lines.append(
            f"| {name} | {fmt(r['wall_s'])} | {fmt(r.get('training_s', []))} | "
            f"{fmt(r.get('setup_and_evaluation_s', []))} | {fmt(r['final_val_loss'], '{:.4f}')} "
            f"| {' / '.join(at)} |"
        )
    lines += ["", *[f"- {k}: **{v:.2f}x**" for k, v in s["ratios"].items()], ""]
    for name, r in s["contenders"].items():
        if "phases_s" not in r:
            continue
        lines += [
            f"Where {name}'s time outside the training steps goes (s, one value per round; "
            "`training` is the steps after the first):",
            "",
            "| phase | seconds |",
            "|---|---|",
            *[f"| {phase} | {fmt(v, '{:.2f}')} |" for phase, v in r["phases_s"].items()],
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout (unless --only leaves it out)")
    p.add_argument("--text", type=Path, required=True, help="tinyshakespeare's input.txt")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target", type=float, default=1.45)
    p.add_argument(
        "--gpu-char-steps",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1250],
        help="comma-separated --steps for the gpu-char preset",
    )
    p.add_argument("--only", default="", help="comma-separated contenders to run (default all)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--attnlab-module", default="attnlab", help="`python -m` this for attnlab")
    p.add_argument("--tiny", action="store_true", help="CPU toy sizes: checks the script only")
    p.add_argument("--out", type=Path, default=Path("benchmarks/cuda"))
    args = p.parse_args(argv)
    wanted = args.only.split(",") if args.only else []
    if args.nanogpt is None and (not wanted or "nanogpt" in wanted):
        p.error("--nanogpt is needed to run nanoGPT (or leave it out with --only)")
    args.text = args.text.resolve()
    if args.nanogpt is not None:
        args.nanogpt = args.nanogpt.resolve()
        prepare_nanogpt(args.nanogpt, args.text, args.python)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    command = "python benchmarks/nanogpt_race.py " + " ".join(argv or sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="nanogpt-race-") as tmp:
        plan = contenders(args, Path(tmp))
        if wanted:
            plan = {k: v for k, v in plan.items() if k in wanted}
        warmed: set[str] = set()
        for name, c in plan.items():
            if c.get("graph") in warmed:  # the same compiled graphs as a contender warmed before
                continue
            warmed.add(c.get("graph", name))
            say(f"warm-up: {name}")
            warm = run_timed(c["warm"], c["cwd"], c["pattern"], env)
            if warm["rc"] != 0:
                raise SystemExit(f"{name} warm-up failed:\n" + "\n".join(warm["tail"]))
            say(f"  {warm['wall_s']:.1f} s")
        runs: dict[str, list[dict]] = {name: [] for name in plan}
        for r in range(args.rounds):
            for name, c in plan.items():
                shutil.rmtree(Path(tmp) / name, ignore_errors=True)
                shutil.rmtree(Path(tmp) / "nanogpt-out", ignore_errors=True)
                res = run_timed(c["cmd"], c["cwd"], c["pattern"], env)
                if res["rc"] != 0:
                    raise SystemExit(f"{name} failed:\n" + "\n".join(res["tail"]))
                timing = Path(tmp) / name / "timing.json"  # attnlab's phases of this run
                if timing.is_file():
                    res["timing"] = json.loads(timing.read_text())
                runs[name].append(res)
                last = res["curve"][-1]["val_loss"] if res["curve"] else None
                say(f"round {r}: {name} {res['wall_s']:.1f} s, final val loss {last}")
            report = write_report(args, command, runs, r + 1)  # after every round: kept if cut
    print(report)
    return 0


def write_report(args, command: str, runs: dict[str, list[dict]], rounds: int) -> str:
    result = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
        "rounds": rounds,
        "target": args.target,
        "summary": summarise({k: v for k, v in runs.items() if v}, args.target),
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nanogpt.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "NANOGPT.md").write_text(markdown(result))
    return markdown(result)


def _machine() -> str:
    import platform

    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU (CPU)"
    return f"{gpu}, torch {torch.__version__}, Python {platform.python_version()}"


if __name__ == "__main__":
    raise SystemExit(main())
