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

:class:`PretrainedTokenizer` has the interface of ``attnlab.data.Tokenizer`` (``encode``,
``decode``, ``token_to_str``, ``vocab_size``, ``pad_id``/``bos_id``/``eos_id``), so generation,
evaluation, plots and the explorer take it unchanged.

Deviation from attnlab's own tokenizers: ``encode`` adds the model's special tokens by default
(``add_special=True``), because a pretrained model expects the framing it was trained with; pass
``add_special=False`` for the bare pieces. Without a pad token, ``pad_id`` is the EOS id (padding
is always masked, so any id works; this one decodes to nothing).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnlab.errors import CheckpointError

TOKENIZER_JSON = "tokenizer.json"
GPT2_FILES = ("vocab.json", "merges.txt")
WORDPIECE_FILE = "vocab.txt"
SENTENCEPIECE_FILE = "tokenizer.model"
ROLES = ("bos", "eos", "pad", "unk", "mask", "cls", "sep")
_METASPACE = "\u2581"


class PretrainedTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` behind attnlab's tokenizer interface."""

    type = "hf"

    def __init__(self, hf: Any, special_tokens: dict[str, str] | None = None):
        self.hf = hf
        tokens = {role: tok for role, tok in (special_tokens or {}).items() if tok is not None}
        self.special_tokens: dict[str, str] = {}
        for role, tok in tokens.items():
            if role not in ROLES:
                raise ValueError(f"unknown special-token role {role!r}; expected one of {ROLES}")
            if hf.token_to_id(tok) is None:
                raise CheckpointError(
                    f"the tokenizer's {role} token {tok!r} is not in its vocabulary; the "
                    "tokenizer files disagree with each other (re-save them with save_pretrained)"
                )
            self.special_tokens[role] = tok
        self._bytes = _byte_decoder() if _is_byte_level(hf) else None

    # Special ids ---------------------------------------------------------------------------
    def _id(self, role: str) -> int | None:
        tok = self.special_tokens.get(role)
        return None if tok is None else self.hf.token_to_id(tok)

    @property
    def bos_id(self) -> int | None:
        return self._id("bos")

    @property
    def eos_id(self) -> int | None:
        return self._id("eos")

    @property
    def pad_id(self) -> int:
        for role in ("pad", "eos"):
            if self._id(role) is not None:
                return self._id(role)
        return 0

    @property
    def unk_id(self) -> int | None:
        return self._id("unk")

    @property
    def mask_id(self) -> int | None:
        return self._id("mask")

    @property
    def specials(self) -> tuple[str, ...]:
        """The special tokens, in the order of their ids."""
        tokens = set(self.special_tokens.values())
        return tuple(sorted(tokens, key=self.hf.token_to_id))

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    # Text <-> ids --------------------------------------------------------------------------
    def encode(
        self, text: str, *, add_special: bool = True, add_bos: bool = False, add_eos: bool = False
    ) -> list[int]:
        """Text -> ids, framed by the model's special tokens unless ``add_special=False``.

        ``add_bos``/``add_eos`` add a BOS/EOS that the framing does not already put there.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids = list(self.hf.encode(text, add_special_tokens=add_special).ids)
        if add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        if add_eos and self.eos_id is not None and ids[-1:] != [self.eos_id]:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Ids -> text; special tokens (BOS, EOS, pad, [CLS], ...) dropped by default."""
        ids = [int(i) for i in ids]
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        return self.hf.decode(ids, skip_special_tokens=skip_special)

    def token_to_str(self, id: int) -> str:
        """A printable label for one token: byte-level pieces as text, '▁' as a space."""
        from attnlab.data.tokenizers import visible

        piece = self.hf.id_to_token(int(id))
        if piece is None:
            raise ValueError(f"token id {id} is outside the vocabulary [0, {self.vocab_size})")
        if piece in self.special_tokens.values():
            return piece
        if self._bytes is not None:
            raw = bytes(self._bytes.get(ch, ord("?")) for ch in piece)
            piece = raw.decode("utf-8", errors="backslashreplace")
        return visible(piece.replace(_METASPACE, " "))

    # Serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "special_tokens": dict(self.special_tokens),
            "hf": json.loads(self.hf.to_str()),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PretrainedTokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(json.dumps(data["hf"])), data.get("special_tokens"))

    def save_pretrained(self, path: str | os.PathLike, model_max_length: int | None = None) -> Path:
        """Write tokenizer.json + tokenizer_config.json (what ``AutoTokenizer`` reads)."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self.hf.save(str(root / TOKENIZER_JSON))
        config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
        config.update({f"{role}_token": tok for role, tok in self.special_tokens.items()})
        if model_max_length is not None:
            config["model_max_length"] = model_max_length
        text = json.dumps(config, indent=2) + "\n"
        (root / "tokenizer_config.json").write_text(text, encoding="utf-8")
        return root

    def __repr__(self) -> str:
        return f"PretrainedTokenizer(vocab_size={self.vocab_size}, specials={self.special_tokens})"


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
    tok = PretrainedTokenizer(hf, special)
    if vocab_size is not None and tok.vocab_size > vocab_size:
        raise CheckpointError(
            f"the tokenizer in {str(root)!r} has {tok.vocab_size} tokens but the model's "
            f"vocabulary has {vocab_size}: ids >= {vocab_size} have no embedding. The tokenizer "
            "belongs to another model; put the model's own tokenizer files next to it"
        )
    return tok


def _read_tokenizer(root: Path, settings: dict[str, Any]) -> Any:
    from tokenizers import Tokenizer

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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    bpe = models.BPE.from_file(str(root / "vocab.json"), str(root / "merges.txt"))
    hf = Tokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.post_processor = processors.ByteLevel(trim_offsets=False)
    return hf


def _wordpiece_tokenizer(root: Path, lowercase: bool) -> Any:
    """BERT's WordPiece from vocab.txt (as BertTokenizerFast builds it)."""
    from tokenizers.implementations import BertWordPieceTokenizer

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
    if hf.get_vocab_size() and not (root / TOKENIZER_JSON).is_file():
        if (root / WORDPIECE_FILE).is_file() and not (root / GPT2_FILES[0]).is_file():
            for role, tok in (("unk", "[UNK]"), ("pad", "[PAD]"), ("cls", "[CLS]"),
                              ("sep", "[SEP]"), ("mask", "[MASK]")):  # fmt: skip
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


def _is_byte_level(hf: Any) -> bool:
    from tokenizers import decoders

    return isinstance(hf.decoder, decoders.ByteLevel)


def _byte_decoder() -> dict[str, int]:
    from attnlab.data.bpe import _byte_decoder as table

    return table()
