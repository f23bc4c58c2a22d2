"""Models by name: a Hugging Face hub id (``gpt2``, ``HuggingFaceTB/SmolLM2-135M``) -> a local
directory in the standard Hugging Face cache, through ``huggingface_hub.snapshot_download``.

:func:`resolve_model_path` is the one place every loader turns what the user typed into a
directory:

    1. ``~`` and ``$VARS`` expand (``~/models/gpt2``, ``$SCRATCH/runs/x``);
    2. a path that exists is used as it is (a local path always wins over a hub id);
    3. otherwise a string shaped like a hub id (``name`` or ``owner/name``) is fetched from the
       hub, or read from the cache, at ``revision`` (a branch, tag or commit; default ``main``).
       A ``pathlib.Path`` always names a local file or directory, never a hub model: once a
       name has been resolved to a path, resolving it again cannot turn a missing ``./run``
       into the hub id ``run``.

Only what attnlab reads is fetched (:data:`ALLOW_PATTERNS`): config.json, the safetensors
weights (one file or shards with their index) and the tokenizer files. Pickle files
(``pytorch_model.bin``) are never downloaded nor read. The cache is the one ``transformers`` and
the ``hf`` command use (``HF_HOME`` / ``HF_HUB_CACHE``); ``HF_HUB_OFFLINE=1`` reads only the
cache. Every failure (offline and not cached, no such repository, a private or gated one, a
repository without safetensors) is one :class:`~attnlab.errors.CheckpointError` sentence naming
the fix.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from attnlab.errors import CheckpointError

# What attnlab reads from a model repository (fnmatch patterns on the repository's paths).
ALLOW_PATTERNS = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*.safetensors",  # shards: model-00001-of-00002.safetensors
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
)
# owner/name or name: letters, digits, '-', '_', '.'; no leading '.', no '..' (the hub's rule).
HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")


def expand_path(path: str | os.PathLike) -> Path:
    """``path`` with ``~`` and environment variables (``$HOME``, ``${SCRATCH}``) expanded."""
    return Path(os.path.expandvars(os.path.expanduser(os.fspath(path))))


def is_hub_id(name: str) -> bool:
    """Whether ``name`` has the shape of a Hugging Face hub model id (``gpt2``, ``org/name``)."""
    return bool(HUB_ID.match(name)) and ".." not in name and not name.endswith((".", "-"))


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set to a true value, read now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in ("1", "true", "yes", "on")


def hub_cache_dir() -> str | None:
    """The hub cache the environment names now (``HF_HUB_CACHE``, else ``$HF_HOME/hub``), or None
    for huggingface_hub's default (``~/.cache/huggingface/hub``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return str(expand_path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        return str(expand_path(os.environ["HF_HOME"]) / "hub")
    return None


def resolve_model_path(name: str | os.PathLike, *, revision: str | None = None) -> Path:
    """The local directory (or file) ``name`` stands for; see the module docstring.

    A name that is neither an existing path nor a string shaped like a hub id comes back
    expanded, for the caller to report as missing.
    """
    local = expand_path(name)
    if local.exists():
        if revision is not None:
            raise CheckpointError(
                f"revision={revision!r} picks a version of a Hugging Face hub model, but "
                f"{str(local)!r} is a local path; leave revision unset (or give a hub id)",
                fields=("revision",),
            )
        return local
    if not isinstance(name, str) or not is_hub_id(name):
        return local
    return download(name, revision=revision)


def download(repo_id: str, *, revision: str | None = None) -> Path:
    """The cached snapshot of hub model ``repo_id`` (fetched when missing and online)."""
    try:
        import huggingface_hub  # slow import: hub ids only
        from huggingface_hub import errors  # slow import: hub ids only
    except ImportError:  # pragma: no cover - a dependency of attnlab
        raise CheckpointError(
            f"{repo_id!r} is not a local path, and loading models by hub id needs the "
            "huggingface_hub package: pip install huggingface_hub"
        ) from None
    at = f" at revision {revision!r}" if revision else ""
    offline = is_offline()
    fetch = f"`hf download {repo_id}{f' --revision {revision}' if revision else ''}`"
    try:
        folder = huggingface_hub.snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=list(ALLOW_PATTERNS),
            cache_dir=hub_cache_dir(),
            local_files_only=offline,
        )
    except errors.GatedRepoError:
        raise CheckpointError(
            f"the Hugging Face model {repo_id!r} is gated: accept its licence on "
            f"https://huggingface.co/{repo_id} and log in with `hf auth login`, then run again"
        ) from None
    except errors.RepositoryNotFoundError:
        raise CheckpointError(
            f"{repo_id!r} is neither a local path nor a model on the Hugging Face hub (no such "
            "repository, or a private one); check the spelling, or log in with `hf auth login` "
            "if it is private"
        ) from None
    except errors.RevisionNotFoundError:
        raise CheckpointError(
            f"the Hugging Face model {repo_id!r} has no revision {revision!r}; give a branch, "
            "tag or commit it has (see its 'Files and versions' page)"
        ) from None
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled, OSError) as err:
        if offline:
            reason = "HF_HUB_OFFLINE is set and the Hugging Face cache does not hold it"
        else:
            reason = f"the Hugging Face hub cannot be reached ({type(err).__name__})"
        raise CheckpointError(
            f"{repo_id!r}{at} is not a local path, and {reason}; fetch it once on a machine "
            f"with network ({fetch}, into the same HF_HOME cache), or give the local directory "
            "of the model"
        ) from None
    return _check_snapshot(Path(folder), repo_id, at)


def _check_snapshot(root: Path, repo_id: str, at: str) -> Path:
    """A snapshot attnlab can read: config.json and safetensors weights."""
    if not (root / "config.json").is_file():
        raise CheckpointError(
            f"the Hugging Face repository {repo_id!r}{at} has no config.json, so it is not a "
            "transformers model attnlab can load; give a model repository (GPT-2, Llama "
            "family or BERT)"
        )
    if not any(root.glob("model*.safetensors")):
        raise CheckpointError(
            f"the Hugging Face model {repo_id!r}{at} has no safetensors weights, and attnlab "
            "never reads pickle files (pytorch_model.bin); pick a revision with "
            "model.safetensors (e.g. the hub's 'refs/pr/N' safetensors conversion), or convert "
            "it once with transformers: AutoModel.from_pretrained(id).save_pretrained(dir)"
        )
    return root
