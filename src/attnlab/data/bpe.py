"""Byte-pair encoding (Sennrich et al. 2016), trained and run by Hugging Face ``tokenizers``.

Two flavours, both round-tripping ordinary text through ``decode(encode(s))``:

    byte_level=True   GPT-2 style: text -> UTF-8 bytes -> merges; nothing is ever unknown.
    byte_level=False  SentencePiece style: spaces become '▁' (Metaspace), merges over characters;
                      characters unseen in training map to <unk> (added to the specials).

The specials come first in the vocabulary (ids 0, 1, 2 = <pad>, <bos>, <eos>), as for every
attnlab tokenizer. ``to_dict`` embeds the library's own JSON under ``"hf"`` so the file reloads
with :func:`attnlab.data.load_tokenizer`.

Special-token strings that occur literally in the text (e.g. "<eos>") are spelled out as
ordinary text, as the char/byte tokenizers do, so a user's text never injects a control token.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from attnlab.data.textfiles import iter_texts
from attnlab.data.tokenizers import DEFAULT_SPECIALS, UNK, Tokenizer

_METASPACE = "\u2581"


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable stand-in character -> byte value."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class BPETokenizer(Tokenizer):
    """A trained ``tokenizers.Tokenizer`` behind the attnlab interface."""

    type = "bpe"

    def __init__(self, hf: HFTokenizer, specials: Sequence[str] = DEFAULT_SPECIALS):
        super().__init__(specials)
        for i, tok in enumerate(self.specials):
            if hf.token_to_id(tok) != i:
                raise ValueError(
                    f"special token {tok!r} must have id {i} in the BPE vocabulary but has "
                    f"{hf.token_to_id(tok)}; train with BPETokenizer.train so specials come first"
                )
        self.hf = hf
        # A literal "<eos>" in user text is text, not the special token: encode
        # special-token strings as ordinary bytes so decode(encode(s)) == s.
        self.hf.encode_special_tokens = True
        self.byte_level = isinstance(hf.pre_tokenizer, pre_tokenizers.ByteLevel)
        self._bytes = _byte_decoder() if self.byte_level else {}

    @classmethod
    def train(
        cls,
        files_or_texts: str | os.PathLike | Iterable[str | os.PathLike],
        vocab_size: int,
        *,
        byte_level: bool = True,
        specials: Sequence[str] = DEFAULT_SPECIALS,
        min_frequency: int = 2,
    ) -> BPETokenizer:
        """Learn merges until the vocabulary (specials included) has ``vocab_size`` entries.

        ``files_or_texts``: texts, or ``pathlib.Path`` files/directories (read as UTF-8).
        The result may be smaller than ``vocab_size`` when the text has too few distinct pairs.
        """
        specials = list(specials)
        if not byte_level and UNK not in specials:
            specials.append(UNK)
        floor = len(specials) + (256 if byte_level else 1)
        if vocab_size < floor:
            raise ValueError(
                f"vocab_size={vocab_size} is too small: the specials and base alphabet alone "
                f"need {floor}; use vocab_size >= {floor}"
            )
        if byte_level:
            hf = HFTokenizer(models.BPE())
            hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            hf.decoder = decoders.ByteLevel()
            alphabet = pre_tokenizers.ByteLevel.alphabet()
        else:
            hf = HFTokenizer(models.BPE(unk_token=UNK))
            hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_METASPACE)
            hf.decoder = decoders.Metaspace(replacement=_METASPACE)
            alphabet = []
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=specials,
            initial_alphabet=alphabet,
            show_progress=False,
        )
        texts = list(iter_texts(files_or_texts))
        if not any(texts):
            raise ValueError("BPETokenizer.train got no text; pass non-empty texts or files")
        hf.train_from_iterator(texts, trainer=trainer)
        return cls(hf, specials)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def _encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def _decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=False)

    def _token_text(self, id: int) -> str:
        piece = self.hf.id_to_token(id)
        if piece is None:
            raise ValueError(f"token id {id} has no entry in this BPE tokenizer's vocabulary")
        if self.byte_level:
            raw = bytes(self._bytes.get(ch, ord("?")) for ch in piece)
            return raw.decode("utf-8", errors="backslashreplace")
        return piece.replace(_METASPACE, " ")

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "hf": json.loads(self.hf.to_str())}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BPETokenizer:
        if "hf" not in data:
            raise ValueError("a 'bpe' tokenizer dict needs the library JSON under the 'hf' key")
        return cls(HFTokenizer.from_str(json.dumps(data["hf"])), data["specials"])
