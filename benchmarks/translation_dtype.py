"""Probe for the translation experiment: bf16 autocast vs fp32 per arm, and one validation-BLEU
evaluation's cost (issue 20, item 2).

Each named arm of ``attnlab.lab.experiments.translation`` trains its full-size recipe on Multi30k
(the full run's schedule: 2500 steps, warm-up 200) for the first ``--steps`` steps in the named
precision (bf16 autocast or fp32), every run from the same seed (same initial weights, same
batches), on one torch thread. It prints, side by side, the label-smoothed training loss over the
last 20 steps, the seconds per step (CPU seconds of the process, which a busy shared machine
inflates far less than wall seconds, and wall seconds) between the first and the last logged step,
and the cost of one greedy validation-BLEU evaluation (the experiment's fixed 256 validation
sentences) after those steps. Results go to ``benchmarks/translation_dtype.json`` and ``.md`` with
the command.

    nice -n 10 env OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/translation_dtype.py \
        --data ../shared/data/multi30k --steps 100
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from attnlab.lab.experiments import translation
from attnlab.lab.kit.report import Table, machine_info
from attnlab.train.build_data import build_task_data
from attnlab.train.evaluate import evaluate

HERE = Path(__file__).resolve().parent
LOG_EVERY = 10  # steps between the records a step's time is read between


def probe(arm: str, dtype: str, steps: int, work: Path) -> dict:
    recipe = translation.recipes(False)[arm]
    cfg = translation.train_config(False, 0, work / "data", **recipe.train)
    cfg = replace(cfg, dtype=dtype, threads=1, eval_every=0, save_every=0, log_every=LOG_EVERY)
    marks: dict[int, tuple[float, float]] = {}  # step -> (CPU seconds, wall seconds)

    def on_event(name: str, record: dict) -> None:
        if name == "record":
            marks[record["step"]] = (time.process_time(), time.perf_counter())

    result = translation.train(
        translation.RunConfig(translation.ModelConfig(**recipe.model), cfg),
        run_dir=work / f"{arm}-{dtype}",
        progress=False,
        stop_at=steps,
        on_event=on_event,
    )
    first, last = min(marks), max(marks)  # the first logged step ends setup and warm-up
    cpu = (marks[last][0] - marks[first][0]) / (last - first)
    wall = (marks[last][1] - marks[first][1]) / (last - first)
    tail = [loss for _, loss in result.losses[-20:]]
    data = build_task_data(cfg, tokenizer=result.tokenizer)  # the run's own validation set
    cpu0, wall0 = time.process_time(), time.perf_counter()
    res = evaluate(
        result.model,
        data,
        batch_size=cfg.batch_size,
        max_batches=cfg.eval_batches,
        autocast_dtype=None if dtype == "fp32" else torch.bfloat16,
    )
    return {
        "arm": arm,
        "dtype": dtype,
        "steps": result.step,
        "train loss (last 20 steps)": sum(tail) / len(tail),
        f"CPU s/step (steps {first}-{last})": cpu,
        "wall s/step": wall,
        "eval CPU s (256 sentences)": time.process_time() - cpu0,
        "eval wall s": time.perf_counter() - wall0,
        "val BLEU": res.metrics.get("val_bleu", float("nan")),
        "val loss": res.metrics["val_loss"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", required=True, help="a folder holding multi30k/ (or the multi30k folder itself)"
    )
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument(
        "--runs",
        default="bahdanau:fp32,bahdanau:bf16,lstm:fp32,lstm:bf16,transformer:bf16",
        help="arm:dtype pairs, in order",
    )
    ap.add_argument("--out", default=str(HERE / "translation_dtype"))
    args = ap.parse_args()
    if args.steps < 2 * LOG_EVERY:
        ap.error(
            f"--steps must be at least {2 * LOG_EVERY}: a step's time is read between logged "
            f"steps (every {LOG_EVERY})"
        )
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="translation-dtype-") as tmp:
        work = Path(tmp)
        translation.prepare_data(False, 0, args.data, work)
        for arm, dtype in (a.split(":") for a in args.runs.split(",")):
            rows.append(probe(arm, dtype, args.steps, work))
            print(json.dumps(rows[-1]), flush=True)
    command = "python " + shlex.join(["benchmarks/translation_dtype.py", *sys.argv[1:]])
    out = {"command": command, "machine": machine_info(), "rows": rows}
    Path(args.out + ".json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    text = [
        "# Translation: bf16 autocast vs fp32 per arm (probe)",
        "",
        "```",
        command,
        "```",
        "",
        Table("probe", rows).to_markdown(),
        "",
        f"Machine: {out['machine']}",
        "",
    ]
    Path(args.out + ".md").write_text("\n".join(text), encoding="utf-8")
    print("\n".join(text))


if __name__ == "__main__":
    main()
