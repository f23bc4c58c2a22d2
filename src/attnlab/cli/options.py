"""Options that several subcommands share, defined once: the checkpoint to load, the device, the
engine switch and reduced-precision weights. Each ``add_*`` adds one flag to a parser (or an
argument group) with the common name, type and help; a command adds what is its own to the help.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from attnlab.generate.weights import WEIGHT_MODES
from attnlab.interop.family import REGISTRY
from attnlab.interop.pretrained import MODEL_TYPES
from attnlab.nn.cache import CACHE_DTYPES

# Where --help sends a reader for more: the documentation online (a pip install has no docs/).
DOCS_URL = "https://github.com/attnlab/attnlab/blob/main/docs/"


def positive_number(text: str) -> float:
    """An argparse ``type``: a finite number > 0 (``nan``, ``inf``, 0 and negatives refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def port_number(text: str) -> int:
    """An argparse ``type``: a TCP port, 0 (any free one) to 65535, checked before any load."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be between 0 and 65535 (0: any free port), got {text!r}"
        )
    return value


def count(text: str) -> int:
    """An argparse ``type``: a whole number >= 0 (how many examples to print, ...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


# What loads and what exports, in the words of the importers and the family registry.
HF_MODELS = f"model_type {', '.join(MODEL_TYPES)}"
HF_FAMILIES = ", ".join(f.name for f in REGISTRY.values())
CHECKPOINT_HELP = (
    "run directory (its latest checkpoint) or a step_* checkpoint written by `attnlab train`, "
    f"a Hugging Face model directory ({HF_MODELS}), or a Hugging Face hub id such as gpt2 or "
    "HuggingFaceTB/SmolLM2-135M (fetched into the Hugging Face cache; HF_HUB_OFFLINE=1 reads "
    "only the cache)"
)
REVISION_HELP = "with a hub id: the branch, tag or commit to load (default: main)"


def add_checkpoint(p: Any, *, metavar: str = "RUN_DIR", also: str = "") -> None:
    """``--checkpoint`` (required): a run directory (its latest checkpoint), one checkpoint, a
    Hugging Face directory or hub id, with ``--revision`` for the hub id; ``also`` names what else
    the command accepts (", or ...")."""
    p.add_argument("--checkpoint", required=True, metavar=metavar, help=CHECKPOINT_HELP + also)
    add_revision(p)


def add_revision(p: Any) -> None:
    """``--revision``: which version of a hub id to load."""
    p.add_argument("--revision", metavar="REV", help=REVISION_HELP)


def add_device(p: Any, *, default: str = "auto") -> None:
    """``--device``: where the model runs."""
    p.add_argument(
        "--device", default=default, help="auto, cpu, cuda, cuda:N or mps (default: %(default)s)"
    )


def add_fast(p: Any, *, also: str = "", default: bool | None = False) -> None:
    """``--fast``: run the model on attnlab.fast's engine (``default=None`` lets a run config
    decide when the flag is absent)."""
    p.add_argument(
        "--fast",
        action="store_true",
        default=default,
        help=f"run the model on attnlab.fast's engine (the same model, CPU fast paths{also}; "
        f"{DOCS_URL}fast.md)",
    )


def add_kv_cache(p: Any, *, purpose: str) -> None:
    """``--kv-cache``: the dtype of a Transformer's KV cache (default: the compute dtype)."""

    p.add_argument(
        "--kv-cache",
        choices=tuple(CACHE_DTYPES),
        default=None,
        help=f"Transformer models: store the KV cache in this dtype for {purpose}; bf16 halves "
        "the bytes each token reads from the cache (default: the model's compute dtype; "
        f"{DOCS_URL}generation.md)",
    )


def add_weights(p: Any, *, purpose: str) -> None:
    """``--weights``: the linear layers' weights of a language model in fewer bits."""

    p.add_argument(
        "--weights",
        choices=WEIGHT_MODES,
        default="fp32",
        help=f"language models: store the linear layers' weights in fewer bits for {purpose} "
        "(int8: per-channel scales; int4: per-group; bf16 where the CPU multiplies it "
        f"natively); see {DOCS_URL}generation.md (default: %(default)s)",
    )
