"""A/B of the engine (attnlab.fast) on real workloads: does each fast path earn its place?

    python benchmarks/fast_ab.py            # ~10 min on 2 busy cores; --quick: a few minutes
    python benchmarks/fast_ab.py --out benchmarks/fast_ab.md

Four workloads, each timed in interleaved rounds in one process (``attnlab.bench.harness``:
median rate over rounds, every contender in every round, so load drifts hit all alike):

  dates        one training step of ``attnlab train --preset dates`` (the README's main job:
               the 2+2-layer encoder-decoder, batch 128 of generated dates, real_only loss)
  translation  one training step of the ``attnlab bench`` seq2seq suite (3+3 layers, width 256,
               vocabulary 8000, batch 64 of Multi30k-like lengths)
  char LM      one training step of the ``baseline-char`` recipe (4 layers, width 128, context
               64, batch 12; unpadded windows)
  generation   ``generate(compile=True)``, greedy, 200 new tokens after a 64-token prompt, on the
               ``attnlab bench`` generate suite's small LM (random GPT-2 weights)

Contenders: ``plain`` (the default model), ``fast`` (``build_model(cfg, fast=True)``: every path
on), and ``fast - <path>`` for each path that can act on the workload (the others are no-ops
there). The gain of a path is rate(fast) / rate(fast - path) - 1; a path giving < 10% on every
workload is deleted (issue 23).

The plain compiled decode step has one setting of its own, dynamo's recursive dict-tag guards
(``attnlab.generate.steppers``); ``plain - dict_tags`` is the plain model with it off, and its
gain is rate(plain) / rate(plain - dict_tags) - 1.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnlab.bench.harness import interleave, setup_torch
from attnlab.fast import accelerate
from attnlab.fast.switches import PATHS

Work = Callable[[int], float]


def with_paths(work: Work, off: tuple[str, ...]) -> Work:
    """``work`` run with the fast paths ``off`` switched off (and the others on)."""

    def run(r: int) -> float:
        for name in PATHS:
            PATHS[name] = name not in off
        try:
            return work(r)
        finally:
            for name in PATHS:
                PATHS[name] = True

    return run


def train_step(model, loss_fn, batches) -> Work:
    """work(r) -> units of one AdamW step on batch r (each contender sees the same batches)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def work(r: int) -> float:
        batch = batches[max(r, 0) % len(batches)]
        loss, units = loss_fn(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return units

    return work


def dates_workload(n_batches: int):
    from attnlab.config import ModelConfig
    from attnlab.train.build_data import build_task_data
    from attnlab.train.objectives import batch_loss
    from attnlab.train.presets import preset_tables
    from attnlab.train.run_config import RunConfig
    from attnlab.train.setup import fit_model_config

    tables = preset_tables("dates")
    run = RunConfig.from_dict(tables, source="dates")
    data = build_task_data(run.train)
    cfg = fit_model_config(ModelConfig.from_dict(tables["model"]), data)
    batches = [data.train_batch(i, run.train.batch_size) for i in range(n_batches)]

    def loss(model, batch):
        out = batch_loss(model, batch, "seq2seq")
        return out.total / out.count, float(out.count)

    return cfg, batches, loss, ("packing",)


def translation_workload(n_batches: int):
    from attnlab.bench.seq2seq_train import SHAPE, attnlab_config, make_batches, real_only_loss

    cfg = attnlab_config(SHAPE)

    def loss(model, batch):  # the suite's step: logits at the real targets only
        return real_only_loss(model)(batch), float(batch.tokens)

    return cfg, make_batches(SHAPE, n_batches), loss, ("packing",)


def char_lm_workload(n_batches: int):
    from attnlab.config import ModelConfig
    from attnlab.train.presets import preset_tables

    model = preset_tables("baseline-char")["model"]
    cfg = ModelConfig.from_dict(dict(model, vocab_size=65))
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 65, (12, 65), generator=gen) for _ in range(n_batches)]

    def loss(model, window):
        logits = model(window[:, :-1]).logits  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten()), 12.0 * 64

    return cfg, batches, loss, ()


def training_contenders(workload, n_batches: int) -> dict[str, Work]:
    from attnlab.models import build_model

    cfg, batches, loss, paths = workload(n_batches)
    torch.manual_seed(0)
    plain = build_model(cfg)
    works = {"plain": train_step(plain, loss, batches)}
    fast = accelerate(copy.deepcopy(plain))
    works["fast"] = with_paths(train_step(fast, loss, batches), ())
    for path in paths:
        twin = accelerate(copy.deepcopy(plain))
        works[f"fast - {path}"] = with_paths(train_step(twin, loss, batches), (path,))
    return works


def generation_contenders(new_tokens: int) -> dict[str, Work]:
    from attnlab.bench.generation import build_pair
    from attnlab.bench.lm_train import SHAPES
    from attnlab.generate import GenerationConfig, generate

    _, plain = build_pair(SHAPES["small"], 64 + new_tokens + 1)
    fast = accelerate(copy.deepcopy(plain))
    prompt = torch.randint(0, SHAPES["small"].vocab, (64,), generator=torch.Generator()).tolist()
    cfg = GenerationConfig(
        max_new_tokens=new_tokens, temperature=0.0, stop_token_ids=(), compile=True
    )
    outputs: dict[str, list] = {}

    def work_for(name: str, model) -> Work:
        if name == "plain - dict_tags":  # its own class, so its own compiled step (see below)
            model = copy.deepcopy(model)
            model.__class__ = type(f"{type(model).__name__}NoTags", (type(model),), {})

        def work(r: int) -> float:
            tokens = generate(model, [prompt], cfg).tokens[0]
            outputs.setdefault(name, tokens)
            if tokens != outputs[name]:
                raise AssertionError(f"{name}: tokens changed between rounds")
            return float(len(tokens))

        return work

    works = {"plain": work_for("plain", plain), "fast": with_paths(work_for("fast", fast), ())}
    for path in ("replay", "one_query"):
        works[f"fast - {path}"] = with_paths(work_for(f"fast - {path}", fast), (path,))
    works["plain - dict_tags"] = without_dict_tags(work_for("plain - dict_tags", plain))
    return works


def without_dict_tags(work: Work) -> Work:
    """``work`` with the plain compiled step's recursive dict-tag guards off.

    The setting is read when dynamo builds a graph's guards, and compiled steps are cached per model
    class, so the contender runs a copy of the model whose class is a fresh subclass: its step is
    compiled (and guarded) with the setting off, while the other contenders keep theirs.
    """
    from attnlab.generate import steppers

    def run(r: int) -> float:
        steppers.DICT_TAG_GUARDS = False
        try:
            return work(r)
        finally:
            steppers.DICT_TAG_GUARDS = True

    return run


def table(results: dict[str, dict[str, list[float]]], units: dict[str, str]) -> str:
    """Markdown: per workload and contender the median rate, vs plain, and each path's gain."""
    lines = [
        "| workload | contender | median rate | rounds (min-max) | vs plain | path's gain |",
        "|---|---|---|---|---|---|",
    ]
    for workload, rates in results.items():
        median = {name: statistics.median(r) for name, r in rates.items()}
        for name, r in rates.items():
            vs_plain = median[name] / median["plain"]
            gain = ""
            for base in ("fast", "plain"):
                if name.startswith(f"{base} - "):
                    gain = f"{median[base] / median[name] - 1:+.1%}"
            lines.append(
                f"| {workload} | {name} | {median[name]:.1f} {units[workload]} | "
                f"{min(r):.1f}-{max(r):.1f} | {vs_plain:.3f} | {gain} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter rounds")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 7; quick 3)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--only", nargs="*", help="workloads to run (default: all four)")
    parser.add_argument("--out", help="also write the table (markdown) to this file")
    args = parser.parse_args(argv)
    setup_torch(args.threads)
    rounds = args.rounds or (3 if args.quick else 7)
    min_round_s = 0.4 if args.quick else 1.0
    n_batches = 8
    suites = {
        "dates": lambda: training_contenders(dates_workload, n_batches),
        "translation": lambda: training_contenders(translation_workload, n_batches),
        "char LM": lambda: training_contenders(char_lm_workload, n_batches),
        "generation": lambda: generation_contenders(100 if args.quick else 200),
    }
    units = {
        "dates": "tgt tok/s",
        "translation": "tgt tok/s",
        "char LM": "tok/s",
        "generation": "tok/s",
    }
    results = {}
    for name, make in suites.items():
        if args.only and name not in args.only:
            continue
        print(f"{name}: building and warming up", file=sys.stderr, flush=True)
        timings = interleave(make(), rounds=rounds, warmup=2, min_round_s=min_round_s)
        results[name] = {c: t.rates for c, t in timings.items()}
        print(table({name: results[name]}, units), file=sys.stderr, flush=True)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python benchmarks/fast_ab.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (
        f"Measured {now}, torch {torch.__version__}, {args.threads} thread(s), {rounds} "
        f"interleaved rounds; command: `{command.strip()}`\n\n{table(results, units)}\n"
    )
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
