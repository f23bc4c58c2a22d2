"""The one field-to-flag table: which command-line flag sets each config field or argument.

Library errors name fields (``warmup_steps=100 must not exceed steps=60``) and carry them in
``err.fields`` (:mod:`attnlab.errors`); :func:`flag_hint` turns those names into the flags a
command-line user types, and the CLI's error printer appends it to the message. ``attnlab
train``'s settings flags are defined here too (:data:`TRAIN_FLAGS`), so its parser and the hint
read the same rows.
"""

from __future__ import annotations

from collections.abc import Iterable

TRAIN_FLAGS = {  # flag -> (config field, type, help)
    "--model-kind": ("model.kind", str, "model family: decoder_lm, encoder_decoder, classifier, "
                     "rnn_lm, lstm_seq2seq (default: the one that fits the task)"),
    "--d-model": ("d_model", int, "model width D"),
    "--n-heads": ("n_heads", int, "attention heads H"),
    "--n-layers": ("n_layers", int, "layers (encoder layers of a seq2seq model)"),
    "--n-decoder-layers": ("n_decoder_layers", int, "decoder layers of a seq2seq model"),
    "--d-ff": ("d_ff", int, "feed-forward hidden width"),
    "--max-len": ("max_len", int, "longest sequence the model accepts"),
    "--dropout": ("dropout", float, "dropout probability"),
    "--positional": ("positional", str, "learned, sinusoidal, concat, rotary or none"),
    "--norm-placement": ("norm_placement", str, "pre or post"),
    "--tokenizer": ("tokenizer", str, "char, byte or bpe (trained on the training data)"),
    "--bpe-vocab-size": ("bpe_vocab_size", int, "BPE vocabulary size"),
    "--context-len": ("context_len", int, "LM: tokens per training window"),
    "--max-src-len": ("max_src_len", int, "drop training sources longer than this"),
    "--max-tgt-len": ("max_tgt_len", int, "drop training targets longer than this"),
    "--length-buckets": ("length_buckets", int, "seq2seq/classify: sort the examples of each run "
                         "of this many batches by length, for less padding (0 = random batches)"),
    "--n-train": ("n_train", int, "generated tasks: training examples"),
    "--n-val": ("n_val", int, "generated tasks: validation examples"),
    "--val-fraction": ("val_fraction", float, "share of file data held out for validation"),
    "--val-data": ("val_data", str, "a separate validation file"),
    "--steps": ("steps", int, "optimizer steps"),
    "--batch-size": ("batch_size", int, "sequences per micro-batch per process (global batch "
                     "= batch size x grad accum x processes)"),
    "--grad-accum": ("grad_accum", int, "micro-batches per optimizer step"),
    "--optimizer": ("optimizer", str, "adamw, or muon (Muon for 2-D hidden weights)"),
    "--lr": ("lr", float, "peak learning rate"),
    "--min-lr": ("min_lr", float, "learning rate at the end of the decay"),
    "--lr-schedule": ("lr_schedule", str, "cosine, linear or constant after warm-up"),
    "--warmup-steps": ("warmup_steps", int, "linear warm-up steps"),
    "--weight-decay": ("weight_decay", float, "decoupled weight decay (not on norms, biases, "
                       "embeddings)"),
    "--grad-clip": ("grad_clip", float, "max global gradient norm (0 = off)"),
    "--label-smoothing": ("label_smoothing", float, "seq2seq/classify label smoothing"),
    "--eval-every": ("eval_every", int, "steps between evaluations (0 = at the end)"),
    "--eval-batches": ("eval_batches", int, "validation batches per evaluation"),
    "--save-every": ("save_every", int, "steps between checkpoints (0 = at the end)"),
    "--keep-last": ("keep_last", int, "checkpoints kept besides the best (0 = all)"),
    "--best-metric": ("best_metric", str, "metric choosing the best checkpoint, e.g. val_loss"),
    "--log-every": ("log_every", int, "steps between metrics.jsonl lines"),
    "--seed": ("seed", int, "random seed (data order, init, dropout)"),
    "--device": ("device", str, "auto, cpu, cuda, cuda:N or mps"),
    "--dtype": ("dtype", str, "fp32, or bf16 autocast"),
    "--threads": ("threads", int, "torch intra-op threads (0 = default)"),
    "--init-from": ("init_from", str, "fine-tune: start from this model (a directory or a Hugging "
                    "Face hub id such as gpt2) with its tokenizer and config; LM on --text, "
                    "classifier on --labels (BERT)"),
    "--revision": ("init_revision", str, "with --init-from a hub id: its branch, tag or commit"),
    "--freeze": ("freeze", str, "with --init-from: 'embeddings', N (the first N layers) or "
                 "'embeddings,N': kept as pretrained"),
}  # fmt: skip

# Fields and arguments set by other flags (or by the same flag in other commands).
OTHER_FLAGS = {
    # attnlab train: run, data and the arguments of attnlab.train.train()
    "kind": "--model-kind",
    "out": "--out",
    "run_dir": "--out",
    "data": "--text/--pairs/--labels/--task",
    "text": "--text",
    "pairs": "--pairs",
    "labels": "--labels",
    "task": "--task",
    "resume": "--resume",
    "allow_changes": "--allow-changes",
    "overwrite": "--overwrite",
    "compile": "--compile",
    "fast": "--fast",
    "progress": "--no-progress",
    "config": "--config",
    # attnlab generate / evaluate (GenerationConfig and loading)
    "checkpoint": "--checkpoint",
    "revision": "--revision",
    "max_new_tokens": "--max-new-tokens",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "repetition_penalty": "--repetition-penalty",
    "num_beams": "--beams",
    "length_penalty": "--length-penalty",
    "early_stopping": "--early-stopping",
    "stop_strings": "--stop",
    "use_cache": "--no-cache",
    "cache_dtype": "--kv-cache",
    "kv_cache": "--kv-cache",
    "weights": "--weights",
    "split": "--split",
    # attnlab export (attnlab.interop.export_model's fmt)
    "format": "--format",
    "fmt": "--format",
    "force": "--force",
    # attnlab explore
    "host": "--host",
    "port": "--port",
    # attnlab bench (attnlab.bench.BenchSettings)
    "suite": "--suite",
    "suites": "--suite",
    "rounds": "--rounds",
    "memory_cap_gib": "--memory-cap-gib",
    # attnlab experiment
    "quick": "--quick",
}

# field -> flag, one row per field: the train settings' rows, then the others.
FIELD_FLAGS: dict[str, str] = {
    **{field: flag for flag, (field, _, _) in TRAIN_FLAGS.items()},
    **OTHER_FLAGS,
}

# Where one command sets a field with another flag than FIELD_FLAGS says.
COMMAND_FLAGS: dict[str, dict[str, str]] = {
    "plot": {"text": "--input"},  # the text whose attention is drawn
    "evaluate": {"data": "--text/--pairs/--labels"},
    "experiment": {"data": "--data"},  # the folder of real datasets
}


def flag_for(field: str, command: str | None = None) -> str | None:
    """The flag that sets ``field`` in ``command`` (None: no flag does). A dotted name
    (``train.steps``) is looked up by its last part; ``attnlab train`` sets any other field of
    the run config with ``--set NAME=VALUE``."""
    name = field.rpartition(".")[2]
    own = COMMAND_FLAGS.get(command or "", {})
    flag = own.get(field) or own.get(name) or FIELD_FLAGS.get(field) or FIELD_FLAGS.get(name)
    if flag is None and command == "train" and name in _run_config_fields():
        flag = f"--set {name}=VALUE"
    return flag


def flag_hint(fields: Iterable[str], command: str | None = None) -> str:
    """``"(on the command line: --warmup-steps, --steps)"`` for the fields an error names, or
    ``""`` when none of them has a flag in ``command``."""
    flags: list[str] = []
    for field in fields:
        flag = flag_for(field, command)
        if flag and flag not in flags:
            flags.append(flag)
    return f"(on the command line: {', '.join(flags)})" if flags else ""


def _run_config_fields() -> set[str]:
    """The fields of ``attnlab train``'s run config (ModelConfig and TrainConfig)."""
    import dataclasses

    from attnlab.config import ModelConfig
    from attnlab.train.run_config import TrainConfig

    return {f.name for cls in (ModelConfig, TrainConfig) for f in dataclasses.fields(cls)}
