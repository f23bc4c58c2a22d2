"""Tokenizers behind one small interface: characters, UTF-8 bytes, and BPE (in ``bpe.py``).

Every tokenizer maps text to a list of ids and back, and shares the same special tokens at the
start of the vocabulary, so ``pad_id == 0`` everywhere (the default of ``ModelConfig.pad_id``):

    id 0 <pad>, 1 <bos>, 2 <eos>, then <unk> (optional) and any extra specials you name.

``encode`` never adds BOS/EOS unless asked (``add_bos``/``add_eos``); ``decode`` drops pad, BOS
and EOS unless ``skip_special=False``. ``to_dict`` gives a JSON-ready dict with a ``"type"`` field
and :func:`load_tokenizer` turns any such dict, JSON file or checkpoint directory back into the
right class.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from attnlab.data.textfiles import iter_texts

if TYPE_CHECKING:
    from attnlab.data.pretrained_tokenizer import PretrainedTokenizer  # imports this module too

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
DEFAULT_SPECIALS = (PAD, BOS, EOS)
TOKENIZER_FILE = "tokenizer.json"


def check_specials(specials: Sequence[str]) -> tuple[str, ...]:
    """Specials must start with <pad>, <bos>, <eos> (ids 0, 1, 2) and be unique."""
    specials = tuple(specials)
    if specials[:3] != DEFAULT_SPECIALS:
        raise ValueError(
            f"specials must start with {list(DEFAULT_SPECIALS)} so that pad/bos/eos are ids 0/1/2, "
            f"got {list(specials)}; append extra tokens (e.g. '<unk>', '<cls>') after them"
        )
    if len(set(specials)) != len(specials):
        raise ValueError(f"specials contain duplicates: {list(specials)}")
    return specials


def visible(s: str) -> str:
    """A label-friendly form of a token: spaces as '␣', newlines and control bytes escaped."""
    out = []
    for ch in s:
        if ch == " ":
            out.append("\u2423")
        elif ch in "\n\r\t":
            out.append(repr(ch)[1:-1])
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def write_tokenizer_json(data: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write a tokenizer's ``to_dict()`` as JSON; a directory gets ``tokenizer.json`` inside it."""
    p = Path(path)
    if p.is_dir():
        p = p / TOKENIZER_FILE
    p.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return p


class Tokenizer:
    """The common interface. Subclasses set ``type`` and implement the ``_`` hooks."""

    type: ClassVar[str] = ""

    def __init__(self, specials: Sequence[str] = DEFAULT_SPECIALS):
        self.specials = check_specials(specials)
        self.special_ids = {tok: i for i, tok in enumerate(self.specials)}

    # Special ids ---------------------------------------------------------------------------
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    @property
    def unk_id(self) -> int | None:
        return self.special_ids.get(UNK)

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    # Text <-> ids --------------------------------------------------------------------------
    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Text -> token ids, optionally framed by <bos> ... <eos>."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids = self._encode(text)
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Token ids (a list, tensor or array) -> text. Pad/BOS/EOS are dropped by default."""
        ids = token_ids(ids)
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        if skip_special:
            drop = {self.pad_id, self.bos_id, self.eos_id}
            ids = [i for i in ids if i not in drop]
        return self._decode(ids)

    def token_to_str(self, id: int) -> str:
        """A short printable label for one token id, for plots and debugging."""
        id = int(id)
        if not 0 <= id < self.vocab_size:
            raise ValueError(f"token id {id} is outside the vocabulary [0, {self.vocab_size})")
        if id < len(self.specials):
            return self.specials[id]
        return visible(self._token_text(id))

    def _encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def _decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    def _token_text(self, id: int) -> str:
        raise NotImplementedError

    # Serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "specials": list(self.specials)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tokenizer:
        raise NotImplementedError

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``to_dict()`` as JSON; a directory gets ``tokenizer.json`` inside it."""
        return write_tokenizer_json(self.to_dict(), path)

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(vocab_size={self.vocab_size}, specials={list(self.specials)})"


class CharTokenizer(Tokenizer):
    """One id per character, vocabulary sorted by code point after the specials."""

    type = "char"

    def __init__(self, chars: Iterable[str], specials: Sequence[str] = DEFAULT_SPECIALS):
        super().__init__(specials)
        self.chars = sorted(set(chars))
        bad = [c for c in self.chars if len(c) != 1]
        if bad:
            raise ValueError(f"CharTokenizer vocabulary entries must be single characters: {bad}")
        offset = len(self.specials)
        self.stoi = {c: offset + i for i, c in enumerate(self.chars)}

    @classmethod
    def train(
        cls,
        files_or_texts: str | os.PathLike | Iterable[str | os.PathLike],
        *,
        specials: Sequence[str] = DEFAULT_SPECIALS,
        unk: bool = False,
    ) -> CharTokenizer:
        """Collect every character of the texts (``pathlib.Path`` items are read as files).

        ``unk=True`` (or '<unk>' in specials) maps unseen characters to <unk> instead of raising.
        """
        specials = tuple(specials) + ((UNK,) if unk and UNK not in specials else ())
        chars: set[str] = set()
        for text in iter_texts(files_or_texts):
            chars.update(text)
        if not chars:
            raise ValueError("CharTokenizer.train got no characters; pass non-empty texts")
        return cls(chars, specials)

    @property
    def vocab_size(self) -> int:
        return len(self.specials) + len(self.chars)

    def _encode(self, text: str) -> list[int]:
        stoi, unk = self.stoi, self.unk_id
        try:
            return [stoi[c] for c in text]
        except KeyError:
            if unk is not None:
                return [stoi.get(c, unk) for c in text]
        missing = [(i, c) for i, c in enumerate(text) if c not in stoi]
        shown = ", ".join(f"{c!r} at {i}" for i, c in missing[:10])
        more = f" (and {len(missing) - 10} more)" if len(missing) > 10 else ""
        raise ValueError(
            f"{len(missing)} character(s) not in the CharTokenizer vocabulary: {shown}{more}; "
            f"remove them from the input or train on text that includes them "
            f"(from Python, CharTokenizer.train(..., unk=True) maps unseen characters to <unk>)"
        )

    def _decode(self, ids: list[int]) -> str:
        offset = len(self.specials)
        return "".join(self.chars[i - offset] if i >= offset else self.specials[i] for i in ids)

    def _token_text(self, id: int) -> str:
        return self.chars[id - len(self.specials)]

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "chars": "".join(self.chars)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CharTokenizer:
        return cls(data["chars"], data["specials"])


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes: byte b has id ``len(specials) + b``; any text encodes, nothing is unknown."""

    type = "byte"

    @property
    def vocab_size(self) -> int:
        return len(self.specials) + 256

    def _encode(self, text: str) -> list[int]:
        offset = len(self.specials)
        return [offset + b for b in text.encode("utf-8")]

    def _decode(self, ids: list[int]) -> str:
        offset = len(self.specials)
        parts, run = [], bytearray()
        for i in ids:
            if i >= offset:
                run.append(i - offset)
                continue
            parts.append(run.decode("utf-8", errors="replace"))
            parts.append(self.specials[i])
            run = bytearray()
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)

    def _token_text(self, id: int) -> str:
        b = id - len(self.specials)
        return chr(b) if b < 128 else f"\\x{b:02x}"  # visible() escapes ASCII controls

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ByteTokenizer:
        return cls(data.get("specials", DEFAULT_SPECIALS))


def token_ids(ids: Iterable[int]) -> list[int]:
    """One sequence of token ids (a list, 1-D tensor or array of integers) as Python ints;
    anything else (text, floats, a batch) is refused rather than truncated or misread."""
    if isinstance(ids, (str, bytes)):
        raise TypeError(
            f"decode expects token ids, got {type(ids).__name__}; encode turns text into ids"
        )
    if getattr(ids, "ndim", 1) != 1:
        raise ValueError(
            f"decode expects one sequence of ids (1-D), got shape {tuple(ids.shape)}; "  # type: ignore[attr-defined]
            "decode each row of a batch (tokenizer.decode(row) for row in ids)"
        )
    items: list[Any] = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    values = [i.item() if getattr(i, "ndim", None) == 0 else i for i in items]  # 0-d tensors
    bad = next((i for i in values if isinstance(i, bool) or not isinstance(i, Integral)), None)
    if bad is not None:
        raise TypeError(f"token ids must be integers, got {bad!r} ({type(bad).__name__})")
    return [int(i) for i in values]


def load_tokenizer(
    source: str | os.PathLike | dict[str, Any] | Tokenizer,
) -> Tokenizer | PretrainedTokenizer:
    """A tokenizer from a ``to_dict()`` dict, a JSON file, or a directory with tokenizer.json."""
    if isinstance(source, Tokenizer):
        return source
    if isinstance(source, dict):
        data = source
    else:
        p = Path(source)
        if p.is_dir():
            p = p / TOKENIZER_FILE
        if not p.is_file():
            raise FileNotFoundError(
                f"no tokenizer at {str(p)!r}; save one with tokenizer.save(path) first"
            )
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"tokenizer file {str(p)!r} is not valid JSON: {err}") from None
    from attnlab.data.bpe import BPETokenizer  # bpe imports this module
    from attnlab.data.pretrained_tokenizer import PretrainedTokenizer  # it imports this module

    kinds: dict[str, Any] = {
        "char": CharTokenizer,
        "byte": ByteTokenizer,
        "bpe": BPETokenizer,
        "hf": PretrainedTokenizer,  # a pretrained model's own (attnlab.interop.hf_tokenizer)
    }
    kind = data.get("type") if isinstance(data, dict) else None
    if kind not in kinds:
        raise ValueError(
            f"unknown tokenizer type {kind!r}; expected one of {sorted(kinds)} "
            f"(a file written by Tokenizer.save)"
        )
    try:
        return kinds[kind].from_dict(data)
    except KeyError as err:
        raise ValueError(
            f"a {kind!r} tokenizer needs the field {err.args[0]!r}, which this one lacks (it has "
            f"{sorted(data)}); write tokenizer files with Tokenizer.save"
        ) from None


def train_tokenizer(
    kind: str,
    files_or_texts: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    vocab_size: int | None = None,
    specials: Sequence[str] = DEFAULT_SPECIALS,
) -> Tokenizer:
    """Build a tokenizer of ``kind`` ('char', 'byte' or 'bpe') from texts or files."""
    if kind == "char":
        return CharTokenizer.train(files_or_texts, specials=specials)
    if kind == "byte":
        return ByteTokenizer(specials)
    if kind == "bpe":
        from attnlab.data.bpe import BPETokenizer  # bpe imports this module

        if vocab_size is None:
            raise ValueError("a BPE tokenizer needs vocab_size, e.g. vocab_size=4096")
        return BPETokenizer.train(files_or_texts, vocab_size, specials=specials)
    raise ValueError(f"unknown tokenizer kind {kind!r}; choose 'char', 'byte' or 'bpe'")
