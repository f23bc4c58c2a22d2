"""A pretrained model's own tokenizer (a Hugging Face ``tokenizers.Tokenizer``) behind attnlab's
tokenizer interface, so generation, evaluation, plots and the explorer take it unchanged.

Directories are read by ``attnlab.interop.hf_tokenizer.load_pretrained_tokenizer``; this module
holds the object (and its ``to_dict``/``from_dict``, type ``"hf"``, so a corpus or checkpoint that
saved it reloads with :func:`attnlab.data.load_tokenizer`).

Special tokens have roles (bos, eos, pad, unk, mask, cls, sep) instead of attnlab's fixed ids
0/1/2: ids are whatever the pretrained vocabulary says.

Deviation from attnlab's own tokenizers: ``encode`` adds the model's special tokens by default
(``add_special=True``), because a pretrained model expects the framing it was trained with
(Llama: <s> first; BERT: [CLS] ... [SEP]; GPT-2: nothing); pass ``add_special=False`` for the
bare pieces. Without a pad token, ``pad_id`` is the EOS id (padding is always masked, so any id
works; this one decodes to nothing).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders

from attnlab.data.bpe import _byte_decoder
from attnlab.data.tokenizers import TOKENIZER_FILE, token_ids, visible, write_tokenizer_json

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
                raise ValueError(
                    f"the tokenizer's {role} token {tok!r} is not in its vocabulary; the "
                    "tokenizer files disagree with each other (re-save them with save_pretrained)"
                )
            self.special_tokens[role] = tok
        self._bytes = _byte_decoder() if isinstance(hf.decoder, decoders.ByteLevel) else None

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
            if (found := self._id(role)) is not None:
                return found
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
        ids = token_ids(ids)
        if any(i < 0 for i in ids):
            raise ValueError(f"token ids must be >= 0, got {min(ids)}")
        # Ids past the tokenizer's vocabulary (a model's padded embedding rows) decode to nothing.
        return self.hf.decode(ids, skip_special_tokens=skip_special)

    def token_to_str(self, id: int) -> str:
        """A printable label for one token: byte-level pieces as text, '▁' as a space."""
        piece = self.hf.id_to_token(int(id))
        if piece is None:  # a padded embedding row the tokenizer never emits
            return f"<unused {int(id)}>"
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
        if "hf" not in data:
            raise ValueError("an 'hf' tokenizer dict needs the library JSON under the 'hf' key")
        return cls(HFTokenizer.from_str(json.dumps(data["hf"])), data.get("special_tokens"))

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``to_dict()`` as JSON (reloads with attnlab.data.load_tokenizer)."""
        return write_tokenizer_json(self.to_dict(), path)

    def save_pretrained(self, path: str | os.PathLike, model_max_length: int | None = None) -> Path:
        """Write tokenizer.json + tokenizer_config.json (what ``AutoTokenizer`` reads)."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self.hf.save(str(root / TOKENIZER_FILE))
        config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
        config.update({f"{role}_token": tok for role, tok in self.special_tokens.items()})
        if model_max_length is not None:
            config["model_max_length"] = model_max_length
        text = json.dumps(config, indent=2) + "\n"
        (root / "tokenizer_config.json").write_text(text, encoding="utf-8")
        return root

    def __repr__(self) -> str:
        return f"PretrainedTokenizer(vocab_size={self.vocab_size}, specials={self.special_tokens})"
