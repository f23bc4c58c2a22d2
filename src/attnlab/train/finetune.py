"""Fine-tuning: a run that starts from a pretrained model instead of random weights
(``attnlab train --init-from PATH_OR_ID``, ``TrainConfig.init_from``).

What a fine-tuning run keeps and changes:

* the pretrained **tokenizer** encodes the data (so ids mean what the embeddings learnt), and the
  pretrained **model config** is the run's, unchanged, except where the task needs another
  output: ``--labels`` turns an encoder (BERT: ``encoder``, ``masked_lm`` or ``classifier``) into a
  ``classifier`` with one output per label on BERT's pooled CLS vector, and a decoder (GPT-2,
  Llama family, Gemma 3: ``decoder_lm`` or ``decoder_classifier``) into a ``decoder_classifier``
  reading its last real token (Hugging Face's ``...ForSequenceClassification``); the new head
  (and a pooler the checkpoint lacks) starts from the run's seeded initialisation, the LM head is
  dropped;
* every other weight is copied from the pretrained model; names that do not carry over are
  named in the error, never dropped silently;
* ``freeze`` keeps parameters out of the optimizer: ``"embeddings"`` (token and position
  tables; a head tied to the token table with them), ``"N"`` the first N layers, or both
  (``"embeddings,2"``).

Everything else is an ordinary run: checkpoints hold the fine-tuned weights and the pretrained
tokenizer, ``--resume`` continues bit-identically (the pretrained model is not read again), and
``attnlab export --format hf`` writes the family's format back (GPT-2, Llama family, Gemma 3,
BERT; a classifier as the family's ``...ForSequenceClassification`` with its labels).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnlab.config import CLASSIFIER_KINDS, DECODER_ONLY_KINDS, ModelConfig
from attnlab.errors import CheckpointError, ConfigError

ENCODER_KINDS = ("encoder", "masked_lm", "classifier")
_NEW_IN_CLASSIFIER = ("head.", "encoder.pooler.")  # may start from the run's initialisation


def parse_freeze(spec: str) -> tuple[bool, int]:
    """``"embeddings"``, ``"N"`` or ``"embeddings,N"`` -> (freeze the embeddings, first N
    layers)."""
    embeddings, layers = False, 0
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "embeddings":
            embeddings = True
        elif part.isdigit():
            layers = int(part)
        else:
            from attnlab.train.run_config import ConfigValueError  # run_config imports us

            raise ConfigValueError(
                f"train.freeze={spec!r}: {part!r} is neither 'embeddings' nor a number of layers; "
                "e.g. freeze='embeddings', '2' (the first 2 layers) or 'embeddings,2'",
                fields=("freeze",),
            )
    return embeddings, layers


def load_init(cfg: Any) -> Any:
    """The pretrained model of ``cfg.init_from`` (at ``cfg.init_revision``) as a Checkpoint."""
    from attnlab.interop.loading import load_checkpoint  # every family: only when fine-tuning

    try:
        found = load_checkpoint(cfg.init_from, revision=cfg.init_revision)
    except CheckpointError as err:
        raise CheckpointError(f"init_from: {err}", fields=("init_from",)) from None
    if found.tokenizer is None:
        raise CheckpointError(
            f"init_from={cfg.init_from!r} has no tokenizer files, so the data cannot be encoded "
            "with the ids the model learnt; give a model directory with its tokenizer.json",
            fields=("init_from",),
        )
    return found


def init_model_config(pretrained: Any, task: str, data: Any) -> ModelConfig:
    """The run's model config: the pretrained one, with a classifier output for ``--labels``."""
    cfg, name = pretrained.config, str(pretrained.path)
    if task == "lm":
        if cfg.kind != "decoder_lm":
            raise ConfigError(
                f"init_from={name!r} holds a {cfg.kind!r} model, which does not predict the next "
                "token; fine-tune a decoder (GPT-2, Llama family) on text, or give this one "
                "labelled examples to train a classifier",
                fields=("init_from", "labels"),
            )
        return cfg
    if task == "classify":
        changes: dict[str, Any] = {"n_classes": len(data.labels), "pad_id": data.tokenizer.pad_id}
        if cfg.kind in DECODER_ONLY_KINDS:
            # Hugging Face's recipe for decoders: softmax(W_score h_last), a new bias-free head
            # on the last real token (attnlab.models.decoder_classifier).
            return cfg.replace(kind="decoder_classifier", **changes)
        if cfg.kind not in ENCODER_KINDS:
            raise ConfigError(
                f"init_from={name!r} holds a {cfg.kind!r} model, which has no classifier form; "
                "classify with a BERT or decoder-only model (e.g. init_from='gpt2')",
                fields=("init_from",),
            )
        # BERT's recipe: softmax(W tanh(W_p h_CLS + b_p) + b); a pooler the checkpoint lacks
        # (BertForMaskedLM has none) starts from the run's initialisation, like the head.
        return cfg.replace(kind="classifier", pooler=True, pooling="cls", **changes)
    raise ConfigError(
        f"init_from fine-tunes language models (task='lm') and classifiers (task='classify'), "
        f"not task {task!r}; train a sequence-to-sequence model from scratch instead",
        fields=("init_from",),
    )


def initial_weights(
    pretrained: Any, model_cfg: ModelConfig, labels: Any = None
) -> dict[str, torch.Tensor]:
    """The pretrained tensors under the names of a ``model_cfg`` model (an ``encoder``'s move
    under ``encoder.`` in a classifier; an LM head and a masked-LM head drop). A classifier head
    of the same kind carries over when it has the run's classes: its rows reordered to the run's
    ``labels`` (a LabelSet) when the pretrained model names the same labels in another order,
    kept as they are when it has as many unnamed classes; otherwise it drops (a new head)."""
    tensors = dict(pretrained.model.state_dict())
    if model_cfg.kind == "classifier" and pretrained.config.kind == "encoder":
        tensors = {f"encoder.{k}": v for k, v in tensors.items()}
    if model_cfg.kind in CLASSIFIER_KINDS:
        rows = _head_rows(pretrained, model_cfg, labels)
        drop = ("mlm.", "lm_head.") if rows is not None else ("mlm.", "lm_head.", "head.")
        tensors = {k: v for k, v in tensors.items() if not k.startswith(drop)}
        if rows is not None:
            tensors.update({k: v[rows] for k, v in tensors.items() if k.startswith("head.")})
    return {k: v.detach().clone() for k, v in tensors.items()}


def _head_rows(pretrained: Any, model_cfg: ModelConfig, labels: Any) -> torch.Tensor | None:
    """Row i of the run's head = row ``rows[i]`` of the pretrained head (None: no carry-over)."""
    n = model_cfg.n_classes or 0
    if pretrained.config.kind != model_cfg.kind or pretrained.config.n_classes != n:
        return None
    theirs = list(getattr(pretrained.labels, "names", None) or [])
    ours = list(getattr(labels, "names", None) or [])
    if theirs and ours and sorted(theirs) == sorted(ours):
        return torch.tensor([theirs.index(name) for name in ours])  # the same classes, by name
    placeholders = all(name == f"LABEL_{i}" for i, name in enumerate(theirs))
    return torch.arange(n) if placeholders or not ours else None


def copy_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Load ``weights`` into ``model``; only a classifier's new head (and pooler) may be left."""
    missing, unexpected = model.load_state_dict(weights, strict=False)
    left = [k for k in missing if not k.startswith(_NEW_IN_CLASSIFIER)]
    if left or unexpected:
        raise CheckpointError(
            f"the pretrained weights do not fit the run's model (missing {left[:4]}, unexpected "
            f"{list(unexpected)[:4]}); fine-tune with the model settings of init_from (leave "
            "model settings such as d_model unset)",
            fields=("init_from",),
        )


def freeze(model: nn.Module, spec: str) -> list[str]:
    """Set ``requires_grad=False`` on what ``spec`` names (:func:`parse_freeze`); returns the
    frozen parameter names. The first N layers are the first N blocks of the model's stack."""
    if not spec:
        return []
    embeddings, layers = parse_freeze(spec)
    frozen: list[str] = []
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if embeddings and last == "embed":
            frozen += _freeze(module, name)
        if layers and last == "blocks" and isinstance(module, nn.ModuleList):
            if layers > len(module):
                raise ConfigError(
                    f"freeze={spec!r} asks for {layers} layers, more than the model's "
                    f"{len(module)}; freeze at most {len(module)}",
                    fields=("freeze",),
                )
            for i in range(layers):
                frozen += _freeze(module[i], f"{name}.{i}")
    if not frozen:
        raise ConfigError(
            f"freeze={spec!r} matches no parameters of a {type(model).__name__}; it applies to "
            "Transformer models (their 'embed' tables and 'blocks' layers)",
            fields=("freeze",),
        )
    return frozen


def _freeze(module: nn.Module, prefix: str) -> list[str]:
    names = []
    for name, p in module.named_parameters():
        p.requires_grad_(False)
        names.append(f"{prefix}.{name}")
    return names
