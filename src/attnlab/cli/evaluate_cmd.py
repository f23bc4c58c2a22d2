"""``attnlab evaluate``: metrics of a saved run on its validation set, a test set or a file."""

from __future__ import annotations

import argparse
import json

from attnlab.cli.options import add_checkpoint, add_device, count
from attnlab.errors import ConfigError
from attnlab.interop.pretrained import is_hf_model_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="evaluate a checkpoint: loss, perplexity, exact match, BLEU/chrF or accuracy",
        description="Evaluate a checkpoint. Example: attnlab evaluate --checkpoint runs/dates "
        "--split test",
    )
    add_checkpoint(p, metavar="RUN")
    p.add_argument(
        "--split",
        choices=("val", "test"),
        default="val",
        help="val: the run's validation set; test: a fresh generated set (built-in "
        "tasks) or the file given below",
    )
    d = p.add_argument_group("evaluation data (default: the run's own)")
    d.add_argument("--text", metavar="FILE_OR_DIR", help="text for a language model")
    d.add_argument("--pairs", metavar="FILE", help="(source, target) pairs for a seq2seq model")
    d.add_argument("--labels", metavar="FILE", help="(text, label) examples for a classifier")
    p.add_argument("--batch-size", type=int, help="examples per batch (default: the run's)")
    p.add_argument("--max-batches", type=int, help="evaluate at most this many batches")
    add_device(p)
    p.add_argument("--examples", type=count, default=5, help="predictions to print")
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.cli import local_model_path
    from attnlab.train.eval_checkpoint import evaluate_checkpoint
    from attnlab.train.report import format_metrics

    given = [
        (t, f)
        for t, f in zip(("lm", "seq2seq", "classify"), (args.text, args.pairs, args.labels))
        if f
    ]
    files = [f for _, f in given]
    if len(files) > 1:
        raise ConfigError("give at most one of --text, --pairs and --labels")
    for name in ("batch_size", "max_batches"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    found = evaluate_checkpoint(
        local_model_path(args.checkpoint, revision=args.revision),
        split=args.split,
        data=files[0] if files else None,
        batch_size=args.batch_size,
        max_batches=args.max_batches,
        device=args.device,
        data_task=given[0][0] if given else None,
    )
    metrics = found.result.metrics
    if args.json:
        print(json.dumps({"checkpoint": str(found.checkpoint), "step": found.step, **metrics}))
        return 0
    # a Hugging Face directory has no training step of its own (its Checkpoint says 0)
    where = "a Hugging Face model" if is_hf_model_dir(found.checkpoint) else f"step {found.step}"
    print(f"checkpoint {found.checkpoint} ({where})")
    print(found.summary)
    for p in found.result.predictions[: args.examples]:
        mark = "ok " if p.correct else "BAD"
        print(f"  [{mark}] {p.source!r} -> {p.prediction!r}   (reference {p.target!r})")
    print(format_metrics(metrics))
    return 0
