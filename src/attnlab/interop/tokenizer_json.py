"""attnlab's character and byte tokenizers as Hugging Face ``tokenizers`` objects (tokenizer.json).

An export writes them next to the model so ``transformers.AutoTokenizer`` reads the same ids
attnlab does (and ``generate`` in transformers decodes them back to text):

    char   vocabulary = the specials (ids 0..k-1), then one token per character (id k + i, in
           attnlab's order); a ``Split`` pre-tokenizer isolates every character, a ``WordLevel``
           model looks it up (an unseen one becomes <unk> when the tokenizer has it, and is an
           error otherwise, as in attnlab), the ``Fuse`` decoder joins them with nothing between.
    byte   vocabulary = the specials, then byte b at id k + b, each byte written as GPT-2's
           printable stand-in character (``bytes_to_unicode``); the ``ByteLevel`` pre-tokenizer
           (no regex split, no prefix space) turns text into those characters, a ``BPE`` with no
           merges maps each to its id, the ``ByteLevel`` decoder turns ids back into UTF-8 text
           (invalid sequences become U+FFFD, like attnlab's ``errors="replace"``).

The specials are added tokens; <pad>, <bos> and <eos> are special ones, which
``decode(..., skip_special_tokens=True)`` drops as attnlab's ``decode`` does.
Nothing is added around the text: attnlab's ``encode`` adds no BOS/EOS unless asked, so neither
does this tokenizer. Tokenizers are duck-typed by their ``to_dict()`` (this layer does not import
``attnlab.data``).
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

TYPES = ("char", "byte")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character (printable Latin-1 bytes map to
    themselves, the other 68 to chr(256 + n)), the alphabet of the ByteLevel pre-tokenizer."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    others = [b for b in range(256) if b not in keep]
    table = {b: chr(b) for b in keep}
    table.update({b: chr(256 + n) for n, b in enumerate(others)})
    return table


def hf_tokenizer(tokenizer: Any) -> Any | None:
    """The ``tokenizers.Tokenizer`` twin of an attnlab char or byte tokenizer (None for other
    types: a BPE tokenizer already is one, ``tokenizer.hf``)."""
    data = tokenizer.to_dict()
    if data.get("type") not in TYPES:
        return None

    specials = list(data["specials"])
    vocab = {tok: i for i, tok in enumerate(specials)}
    if data["type"] == "char":
        vocab.update({c: len(specials) + i for i, c in enumerate(data["chars"])})
        unk = "<unk>" if "<unk>" in vocab else None
        hf = Tokenizer(models.WordLevel(vocab, unk_token=unk))
        every_char = Regex(r"[\s\S]")  # any one character, newlines included
        hf.pre_tokenizer = pre_tokenizers.Split(every_char, behavior="isolated")
        hf.decoder = decoders.Fuse()
    else:
        stand_in = bytes_to_unicode()
        vocab.update({stand_in[b]: len(specials) + b for b in range(256)})
        hf = Tokenizer(models.BPE(vocab, merges=[]))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        hf.decoder = decoders.ByteLevel()
    skipped = specials[:3]  # <pad>, <bos>, <eos>: what attnlab's decode drops (it keeps <unk>)
    hf.add_special_tokens(
        [AddedToken(tok, special=tok in skipped, normalized=False) for tok in specials]
    )
    return hf
