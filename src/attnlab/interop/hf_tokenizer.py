"""The tokenizer of a local Hugging Face model directory, through the ``tokenizers`` library.

Layouts read (first match wins; nothing is downloaded, ``transformers`` is not needed):

    tokenizer.json             any fast tokenizer (GPT-2, Llama-family, BERT, ...), as saved by
                               ``save_pretrained``; its post-processor frames text as the model
                               was trained (Llama: <s> first, BERT: [CLS] ... [SEP]).
    vocab.json + merges.txt    GPT-2's original byte-level BPE files.
    vocab.txt                  BERT's original WordPiece vocabulary (``do_lower_case`` from
                               tokenizer_config.json, default true).

Special tokens come from tokenizer_config.json / special_tokens_map.json (``bos_token``,
``eos_token``, ``pad_token``, ``unk_token``, ``mask_token``, ``cls_token``, ``sep_token``, as a
string or ``{"content": ...}``), then from the ids in config.json.

The result is an ``attnlab.data.PretrainedTokenizer`` (the interface of attnlab's own
tokenizers; its ``encode`` adds the model's special tokens by default).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers.implementations import BertWordPieceTokenizer

from attnlab.data.pretrained_tokenizer import ROLES, PretrainedTokenizer
from attnlab.errors import CheckpointError

TOKENIZER_JSON = "tokenizer.json"
GPT2_FILES = ("vocab.json", "merges.txt")
WORDPIECE_FILE = "vocab.txt"
SENTENCEPIECE_FILE = "tokenizer.model"


def has_tokenizer_files(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a tokenizer this module reads (or a SentencePiece model it names)."""
    root = Path(path)
    return any(
        (root / name).is_file()
        for name in (TOKENIZER_JSON, GPT2_FILES[0], WORDPIECE_FILE, SENTENCEPIECE_FILE)
    )


def load_pretrained_tokenizer(
    path: str | os.PathLike, *, vocab_size: int | None = None
) -> PretrainedTokenizer:
    """The tokenizer of a LOCAL Hugging Face directory (see the module docstring for layouts).

    ``vocab_size``: the model's; a tokenizer that can emit ids at or above it is an error (the
    model has no embedding for them). Never downloads.
    """
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{str(root)!r} is not a directory holding tokenizer files")
    settings = _read_optional_json(root / "tokenizer_config.json")
    hf = _read_tokenizer(root, settings)
    special = _special_tokens(root, settings, hf)
    try:
        tok = PretrainedTokenizer(hf, special)
    except ValueError as err:
        raise CheckpointError(f"the tokenizer in {str(root)!r} is inconsistent: {err}") from None
    if vocab_size is not None and tok.vocab_size > vocab_size:
        raise CheckpointError(
            f"the tokenizer in {str(root)!r} has {tok.vocab_size} tokens but the model's "
            f"vocabulary has {vocab_size}: ids >= {vocab_size} have no embedding. The tokenizer "
            "belongs to another model; put the model's own tokenizer files next to it"
        )
    return tok


def _read_tokenizer(root: Path, settings: dict[str, Any]) -> Any:
    try:
        if (root / TOKENIZER_JSON).is_file():
            return Tokenizer.from_file(str(root / TOKENIZER_JSON))
        if all((root / name).is_file() for name in GPT2_FILES):
            return _gpt2_tokenizer(root)
        if (root / WORDPIECE_FILE).is_file():
            return _wordpiece_tokenizer(root, bool(settings.get("do_lower_case", True)))
    except Exception as err:  # the Rust library raises plain Exceptions with its own message
        raise CheckpointError(
            f"cannot read the tokenizer files in {str(root)!r}: {err}; they are truncated or not "
            "Hugging Face tokenizer files"
        ) from None
    if (root / SENTENCEPIECE_FILE).is_file():
        raise CheckpointError(
            f"{str(root)!r} holds only a SentencePiece {SENTENCEPIECE_FILE}; attnlab reads "
            f"{TOKENIZER_JSON}. Convert it once with transformers: "
            "AutoTokenizer.from_pretrained(dir).save_pretrained(dir)"
        )
    found = sorted(p.name for p in root.iterdir())[:12]
    raise CheckpointError(
        f"no tokenizer in {str(root)!r}: expected {TOKENIZER_JSON}, or {' + '.join(GPT2_FILES)} "
        f"(GPT-2), or {WORDPIECE_FILE} (BERT); the directory holds {found}"
    )


def _gpt2_tokenizer(root: Path) -> Any:
    """GPT-2's byte-level BPE from vocab.json + merges.txt (as GPT2TokenizerFast builds it)."""
    bpe = models.BPE.from_file(str(root / "vocab.json"), str(root / "merges.txt"))
    hf = Tokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.post_processor = processors.ByteLevel(trim_offsets=False)
    return hf


def _wordpiece_tokenizer(root: Path, lowercase: bool) -> Any:
    """BERT's WordPiece from vocab.txt (as BertTokenizerFast builds it)."""
    return BertWordPieceTokenizer(str(root / WORDPIECE_FILE), lowercase=lowercase)._tokenizer


def _special_tokens(root: Path, settings: dict[str, Any], hf: Any) -> dict[str, str]:
    """Role -> token string from tokenizer_config.json, special_tokens_map.json, config.json."""
    sources = [settings, _read_optional_json(root / "special_tokens_map.json")]
    out: dict[str, str] = {}
    for role in ROLES:
        for source in sources:
            tok = _token_content(source.get(f"{role}_token"))
            if tok is not None and hf.token_to_id(tok) is not None:
                out[role] = tok
                break
    model_config = _read_optional_json(root / "config.json")
    for role in ("bos", "eos", "pad"):
        tid = model_config.get(f"{role}_token_id")
        if isinstance(tid, list):
            tid = tid[0] if tid else None
        if role not in out and isinstance(tid, int) and hf.id_to_token(tid) is not None:
            out[role] = hf.id_to_token(tid)
    if hf.token_to_id("[CLS]") is not None and hf.token_to_id("[SEP]") is not None:  # BERT's
        for role, tok in (
            ("unk", "[UNK]"),
            ("pad", "[PAD]"),
            ("cls", "[CLS]"),
            ("sep", "[SEP]"),
            ("mask", "[MASK]"),
        ):
            if hf.token_to_id(tok) is not None:
                out.setdefault(role, tok)
    elif hf.token_to_id("<|endoftext|>") is not None:  # GPT-2's one special token
        for role in ("bos", "eos", "unk"):
            out.setdefault(role, "<|endoftext|>")
    return out


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_optional_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{str(path)!r} is not valid JSON: {err}") from None
    return data if isinstance(data, dict) else {}
