"""``attnlab train``: build a RunConfig from a preset, a TOML file and flags, then call train().

Precedence (later wins): TrainConfig/ModelConfig defaults < ``--preset`` < ``--config FILE`` <
flags (including ``--set key=value``). With ``--resume`` and neither ``--preset`` nor
``--config``, the run's own ``config.toml`` is the base, so ``attnlab train --out runs/x
--resume`` continues a run exactly and ``--steps N`` extends it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from attnlab.checkpoint.atomic import atomic_write_text
from attnlab.cli.flags import TRAIN_FLAGS as FLAG_FIELDS
from attnlab.cli.options import add_fast, count
from attnlab.config import CLASSIFIER_KINDS, ModelConfig
from attnlab.data import CLASSIFICATION_TASKS, TASKS, read_parallel
from attnlab.errors import ConfigError

if TYPE_CHECKING:
    from attnlab.train.timing import PhaseTimes

KIND_KEYS = {"kind", "model.kind"}  # --set keys that choose the model kind


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a model (LM, seq2seq or classifier) with checkpoints and resume",
        description="Train a model. Example: attnlab train --preset dates   |   attnlab train "
        "--preset char-lm --text input.txt --out runs/mylm   |   attnlab train --init-from gpt2 "
        "--text input.txt --out runs/gpt2-ft (fine-tune)   |   torchrun --nproc_per_node 2 "
        "-m attnlab train --preset dates",
    )
    g = p.add_argument_group("run")
    from attnlab.train.presets import RUN_PRESETS

    g.add_argument("--preset", help=f"a tuned run: {', '.join(RUN_PRESETS)}")
    g.add_argument("--config", metavar="FILE.toml", help="run config with [model] and [train]")
    g.add_argument("--out", metavar="RUN_DIR", help="run directory (checkpoints, metrics, plots)")
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue from the run's latest "
        "checkpoint (bit-identical); a fresh start if there is none yet",
    )
    g.add_argument(
        "--allow-changes",
        action="store_true",
        help="with --resume: continue even though settings that change the remaining steps "
        "(--lr, --seed, data, ...) differ from the saved run's (it is then no longer "
        "bit-identical to an uninterrupted run)",
    )
    from attnlab.train.setup import RUN_FILES

    g.add_argument(
        "--overwrite",
        action="store_true",
        help="a fresh run into a --out that holds other files: replace the run's own files "
        f"there ({', '.join(RUN_FILES)}; checkpoints are never replaced)",
    )
    g.add_argument(
        "--dump-config",
        metavar="FILE.toml",
        help="write the resolved config to FILE and exit without training (an existing FILE "
        "is replaced only with --overwrite)",
    )
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other config field, e.g. --set qk_norm=true (repeatable)",
    )
    g.add_argument("--examples", type=count, default=8, help="validation examples to print")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--no-plots", action="store_true", help="skip the attention heatmap")
    g.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    add_fast(g, default=None)
    g.add_argument(
        "--tensorboard",
        action="store_true",
        default=None,
        help="also write TensorBoard logs (needs the tensorboard package)",
    )
    g.add_argument(
        "--wandb",
        action="store_true",
        default=None,
        help="also log metrics to Weights & Biases (pip install 'attnlab[wandb]'; project "
        "$WANDB_PROJECT or attnlab; WANDB_MODE=offline keeps the run on disk)",
    )
    d = p.add_argument_group("data (pick one)")
    d.add_argument("--text", metavar="FILE_OR_DIR", help="language modelling on local text")
    d.add_argument(
        "--task",
        metavar="NAME",
        help="a built-in generated task: "
        + ", ".join(sorted(TASKS) + sorted(CLASSIFICATION_TASKS)),
    )
    d.add_argument("--pairs", metavar="FILE", help="seq2seq pairs (.tsv or .jsonl)")
    d.add_argument("--src-file", metavar="FILE", help="seq2seq source lines (with --tgt-file)")
    d.add_argument("--tgt-file", metavar="FILE", help="seq2seq target lines (with --src-file)")
    d.add_argument("--labels", metavar="FILE", help="classification examples (.csv or .jsonl)")
    h = p.add_argument_group("model and training settings (override preset and config)")
    for flag, (_, kind, text) in FLAG_FIELDS.items():
        h.add_argument(flag, type=kind, help=text)
    p.set_defaults(func=run)


def _data_flags(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """task/data settings from the data flags (at most one kind of data)."""
    given = [f for f in ("text", "task", "pairs", "src_file", "labels") if getattr(args, f)]
    if len(given) > 1:
        names = " and ".join("--" + g.replace("_", "-") for g in given)
        raise ConfigError(f"give one kind of data, got {names}")
    if bool(args.src_file) != bool(args.tgt_file):
        raise ConfigError(
            "--src-file and --tgt-file go together: line i of one translates line i of the other"
        )
    if args.text:
        return {"task": "lm", "data": args.text}
    if args.pairs:
        return {"task": "seq2seq", "data": args.pairs}
    if args.labels:
        return {"task": "classify", "data": args.labels}
    if args.task:
        if args.task in TASKS:
            return {"task": "seq2seq", "data": args.task}
        if args.task in CLASSIFICATION_TASKS:
            return {"task": "classify", "data": args.task}
        raise ConfigError(
            f"unknown --task {args.task!r}; built-in tasks are "
            f"{sorted(TASKS) + sorted(CLASSIFICATION_TASKS)}"
        )
    if args.src_file:
        return {"task": "seq2seq", "data": str(_join_parallel(args.src_file, args.tgt_file, out))}
    return {}


def _check_no_model_flags(args: argparse.Namespace) -> None:
    """With --init-from the pretrained model's config and tokenizer are the run's: model and
    tokenizer flags would not fit."""

    model_fields = {f.name for f in dataclasses.fields(ModelConfig)} | {"model.kind"}
    model_fields |= {"tokenizer", "bpe_vocab_size"}  # the pretrained tokenizer is kept
    given = [
        flag
        for flag, (field, _, _) in FLAG_FIELDS.items()
        if field in model_fields and getattr(args, flag[2:].replace("-", "_")) is not None
    ]
    if given:
        raise ConfigError(
            f"--init-from takes the model settings and tokenizer of the pretrained model, so "
            f"{', '.join(given)} cannot change them; drop those flags (or train from scratch "
            "without --init-from)"
        )


def _join_parallel(src: str, tgt: str, out: Path) -> Path:
    """Parallel files -> one JSONL pair file in the run directory (TrainConfig has one path)."""

    pairs = read_parallel(src, tgt)
    lines = "".join(json.dumps({"src": s, "tgt": t}, ensure_ascii=False) + "\n" for s, t in pairs)
    return atomic_write_text(out / "data" / "pairs.jsonl", lines)


def _saved_tables(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The [model] and [train] settings of a run whose config.toml is missing, from its latest
    checkpoint (config.json and train_state/state.json); empty tables if it has none."""

    from attnlab.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if ckpt is None:
        return {"model": {}, "train": {}}
    try:
        model = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))["model"]
        state = json.loads((ckpt / "train_state" / "state.json").read_text(encoding="utf-8"))
        train = dict(state["train_config"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(
            f"--resume: {str(run_dir / 'config.toml')!r} is missing and the settings saved in "
            f"{str(ckpt)!r} cannot be read; restore config.toml, or give the run's settings "
            f"with --config FILE (or --preset and the same flags)"
        ) from None

    warnings.warn(
        f"{str(run_dir / 'config.toml')!r} is missing; resuming with the settings saved in "
        f"{ckpt.name} (config.toml is written again)",
        stacklevel=2,
    )
    train["betas"] = tuple(train.get("betas", ()))  # JSON lists: back to the field's tuple
    return {"model": model, "train": train}


def build_run_config(args: argparse.Namespace) -> tuple[Any, Path]:
    """The RunConfig and run directory the flags describe (see module docstring)."""
    from attnlab.train.presets import preset_tables
    from attnlab.train.run_config import RunConfig, load_toml, merge_overrides
    from attnlab.train.setup import DEFAULT_KIND, KINDS_FOR_TASK

    tables: dict[str, dict[str, Any]] = {"model": {}, "train": {}}
    if args.preset:
        tables = preset_tables(args.preset)
    own = Path(args.out or tables["train"].get("out", "runs/default")) / "config.toml"
    resume_own = args.resume and not args.preset and not args.config
    config_file = args.config or (own if resume_own and own.is_file() else None)
    if resume_own and not own.is_file():
        tables = _saved_tables(own.parent)
    if config_file:
        load_toml(config_file)  # validates, with errors naming the file and the key
        raw = tomllib.loads(Path(config_file).read_text(encoding="utf-8"))
        for t in ("model", "train"):
            tables[t].update(raw.get(t, {}))
    set_keys = {item.partition("=")[0].strip().replace("-", "_") for item in args.set}
    explicit_kind = (
        "kind" in tables["model"] or args.model_kind is not None or bool(set_keys & KIND_KEYS)
    )
    run = RunConfig.from_dict(tables, source=str(config_file or args.preset or "defaults"))
    flags: dict[str, Any] = {"out": args.out}
    for flag, (field, _, _) in FLAG_FIELDS.items():
        flags[field] = getattr(args, flag[2:].replace("-", "_"))
    flags["compile"], flags["tensorboard"] = args.compile, args.tensorboard
    flags["wandb"] = args.wandb
    flags["fast"] = args.fast
    if args.no_progress:
        flags["progress"] = False
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r} must look like KEY=VALUE, e.g. --set dropout=0.1")
        flags[key.strip()] = value.strip()
    kinds = (flags.get("model.kind"), flags.get("kind"), flags.get("model_kind"))
    if set(kinds) & set(CLASSIFIER_KINDS) and "n_classes" not in tables["model"]:
        flags["n_classes"] = 2  # a placeholder: training takes n_classes from the labels
    if flags.get("init_from") or run.train.init_from:
        _check_no_model_flags(args)
    data_flags = _data_flags(args, Path(args.out or run.train.out))
    if args.best_metric is None and "task" in data_flags:  # a preset's metric may not fit
        from attnlab.train.run_config import metric_names

        if run.train.best_metric not in metric_names(data_flags["task"], data_flags["data"]):
            data_flags["best_metric"] = "val_loss"
    run = merge_overrides(run, {**flags, **data_flags})  # one check: the task and its metric
    task = run.train.task
    if not explicit_kind and run.model.kind not in KINDS_FOR_TASK[task]:
        kind = DEFAULT_KIND[task]  # n_classes: a placeholder, training takes it from the labels
        model = run.model.replace(kind=kind, n_classes=run.model.n_classes or 2)
        run = RunConfig(model, run.train)
    return run, Path(run.train.out)


def check_flag_use(args: argparse.Namespace, run_config: Any) -> None:
    """Flags and settings that would do nothing here are errors naming what they need."""
    if args.allow_changes and not args.resume:
        raise ConfigError(
            "--allow-changes lets a resumed run change its settings and does nothing without "
            "--resume; add --resume, or drop --allow-changes"
        )
    train_cfg = run_config.train
    if train_cfg.freeze and not train_cfg.init_from:
        raise ConfigError(
            f"freeze={train_cfg.freeze!r} keeps pretrained weights fixed and needs a pretrained "
            "start: add --init-from MODEL (a run directory, a Hugging Face directory or hub id), "
            "or drop --freeze",
            fields=("freeze", "init_from"),
        )


def run(args: argparse.Namespace) -> int:
    from attnlab.train.timing import PhaseTimes

    clock = PhaseTimes()  # this command's phases; train() times its own (result.phases)
    since_start = _command_clock(getattr(args, "program", False), clock)
    with clock.phase("config"):
        from attnlab.train import dump_toml, train

        if args.dump_config and Path(args.dump_config).is_dir():
            raise ConfigError(
                f"--dump-config {args.dump_config!r} is a directory; give a file name to write, "
                f"e.g. --dump-config {str(Path(args.dump_config) / 'run.toml')!r}"
            )
        if args.dump_config and Path(args.dump_config).exists() and not args.overwrite:
            raise ConfigError(
                f"--dump-config {args.dump_config!r} already exists; choose another file name, "
                "or add --overwrite to replace it"
            )
        run_config, out = build_run_config(args)
        check_flag_use(args, run_config)
    if args.dump_config:
        atomic_write_text(args.dump_config, dump_toml(run_config))
        print(f"wrote {args.dump_config}")
        return 0
    main = os.environ.get("RANK", "0") == "0"
    if main:
        start = run_config.train.init_from
        print(
            f"attnlab train: {'fine-tuning ' + repr(start) if start else run_config.model.kind} "
            f"on task {run_config.train.task!r} (data {run_config.train.data!r}) -> {out}",
            flush=True,
        )
    result = train(
        run_config,
        run_dir=out,
        resume=args.resume,
        progress=not args.no_progress,
        allow_changes=args.allow_changes,
        overwrite=args.overwrite,
        on_event=_print_event,
    )
    if main:
        clock.update(result.phases)
        _report(result, args, clock, since_start)
    return result.exit_code


def _print_event(name: str, data: dict[str, Any]) -> None:
    """Progress lines as they happen, flushed (a log file of a killed run keeps them): the resume
    point and every evaluation. Written through tqdm so a progress bar stays intact."""
    from tqdm.auto import tqdm

    from attnlab.train.report import format_metrics

    if name == "resumed":
        line = f"resumed from {data['path']} (step {data['step']})"
    elif name == "runtime":
        line = f"runtime: {data['line']}"
    elif name == "record" and any(k.startswith("val_") for k in data):
        shown = {k: v for k, v in data.items() if k == "train_loss" or k.startswith("val_")}
        line = f"step {data['step']}: {format_metrics(shown)}"
    else:
        return
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def _command_clock(program: bool, clock: PhaseTimes) -> Callable[[], float | None]:
    """Seconds since the command started, as a function: as the program itself, since the
    process started (its imports, until now, are phase ``imports`` of ``clock``); called in
    process (``main([...])``, a notebook), since now."""
    if program:
        age = process_age_s()
        if age is not None:
            clock.add("imports", age)  # Python, torch, attnlab, the parser
        return process_age_s
    began = time.perf_counter()
    return lambda: time.perf_counter() - began


def _report(
    result: Any,
    args: argparse.Namespace,
    clock: PhaseTimes,
    since_start: Callable[[], float | None],
) -> None:
    """The run's summary: data, examples, final metrics, files, heatmaps and where the time went
    (also written to ``run_dir/timing.json``)."""
    from attnlab.train.report import format_metrics
    from attnlab.train.timing import time_summary, write_timing

    print(result.summary)
    if result.stopped_by:
        print(
            f"stopped by {result.stopped_by} after step {result.step}; saved "
            f"{result.checkpoint}. Continue with: attnlab train --out {result.run_dir} "
            f"--resume",
            file=sys.stderr,
        )
        return
    shown = result.predictions[: args.examples]
    if shown:
        print("examples (source -> prediction, reference):")
        for p in shown:
            mark = "ok " if p.correct else "BAD"
            print(f"  [{mark}] {p.source!r} -> {p.prediction!r}   (reference {p.target!r})")
    print(f"step {result.step}: {format_metrics(result.metrics)}")
    for key in ("val_exact_match", "val_accuracy"):
        if key in result.metrics:
            name = key[4:].replace("_", " ")
            n = len(result.predictions)
            print(f"final {name}: {100 * result.metrics[key]:.2f}% of {n} held-out examples")
    print(f"checkpoint: {result.checkpoint}")
    if result.best_checkpoint:
        print(f"best checkpoint: {result.best_checkpoint}")
    print(f"metrics: {result.run_dir / 'metrics.jsonl'}   loss plot: {result.run_dir / 'loss.png'}")
    if not args.no_plots and result.predictions:
        with clock.phase("heatmaps"):
            _attention_plot(result)
    wall = since_start()
    write_timing(result.run_dir, clock, wall)
    print(time_summary(clock, result.step - result.start_step, wall), flush=True)


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), or None where that is unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start, clock ticks
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - started


def _attention_plot(result: Any) -> None:
    """The attention heatmaps of one validation example (via attnlab.viz, the CLI's layer)."""
    try:
        from attnlab.viz import model_attention_figures, save_figures
    except ImportError:
        print("attention plot skipped: attnlab.viz is not available")
        return
    # the longest of the first examples: a date with words shows the alignment best
    text = max((p.source for p in result.predictions[:20]), key=len)
    try:
        figures = model_attention_figures(result.model, result.tokenizer, text)
    except (ValueError, TypeError) as err:
        print(f"attention plot skipped: {err}")
        return
    paths = save_figures(figures, result.run_dir / "plots")
    print(f"attention heatmaps of {text!r}: {', '.join(str(p) for p in paths)}")
