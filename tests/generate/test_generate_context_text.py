"""A continuation's text reads as it does after its prompt.

A SentencePiece-style (Metaspace) tokenizer, as in Llama 2, Gemma and Mistral, drops the leading
space of the first token it decodes; decoding the new tokens alone printed "the" + "the" as
"thethe". The prompt's last tokens are the decoding context (``attnlab.generate.text``), in
``generate``, ``stream``, beam search and ``attnlab generate``; a character tokenizer, where
nothing depends on context, reads as before. Unknown characters are named for a tokenizer that
frames its input with special tokens.
"""

from __future__ import annotations

import torch

from attnlab.config import ModelConfig
from attnlab.data import ByteTokenizer
from attnlab.data.pretrained_tokenizer import PretrainedTokenizer
from attnlab.data.unknown import unknown_characters
from attnlab.generate import GenerationConfig, generate, stream
from attnlab.generate.text import IncrementalDecoder, context_of, decode_after
from attnlab.models import build_model
from hf_dirs import llama_bpe, spread

GREEDY = GenerationConfig(temperature=0, max_new_tokens=8)


def metaspace() -> PretrainedTokenizer:
    return PretrainedTokenizer(llama_bpe(), {"bos": "<s>", "eos": "</s>", "unk": "<unk>"})


def lm(vocab: int, favourite: int) -> torch.nn.Module:
    """A random LM whose final state points at token ``favourite``'s (tied) embedding: greedy
    decoding says it again and again."""
    torch.manual_seed(0)
    cfg = ModelConfig(kind="decoder_lm", vocab_size=vocab, d_model=32, n_heads=2, n_layers=2)
    model = spread(build_model(cfg), 0.3)
    with torch.no_grad():
        model.final_norm.weight.zero_()
        model.final_norm.bias.copy_(10 * model.embed.tok_emb.weight[favourite])
    return model


def test_the_first_new_word_keeps_its_space_after_the_prompt():
    tok = metaspace()
    prompt = tok.encode("the cat", add_special=False)
    word = tok.encode("the cat sat", add_special=False)[len(prompt) :]  # '▁sat' (maybe split)
    assert tok.decode(word) == "sat"  # decoded alone, the space is gone
    assert decode_after(tok, context_of(tok, prompt), word) == " sat"
    pieces = IncrementalDecoder(tok, prompt)
    assert "".join(pieces.push(t) for t in word) + pieces.flush() == " sat"


def test_generate_stream_and_beams_decode_after_the_prompt():
    tok = metaspace()
    the = tok.hf.token_to_id("▁the")
    model = lm(tok.vocab_size, the)
    prompt = "the cat"
    res = generate(model, prompt, GREEDY, tokenizer=tok)
    assert res.tokens[0] == [the] * 8
    assert res.texts[0] == " the" * 8  # it used to read "the the ...": "the catthe the ..."
    ids = tok.encode(prompt)
    whole = tok.decode(ids + res.tokens[0])
    assert tok.decode(ids) + res.texts[0] == whole  # the prompt and its continuation, as one text
    assert "".join(stream(model, prompt, GREEDY, tokenizer=tok, text=True)) == res.texts[0]
    beams = generate(model, prompt, GREEDY.replace(num_beams=3), tokenizer=tok)
    assert tok.decode(ids) + beams.texts[0] == tok.decode(ids + beams.tokens[0])
    batch = generate(model, [prompt, "a"], GREEDY, tokenizer=tok)  # left-padded rows
    assert batch.texts[0] == res.texts[0]
    assert tok.decode(tok.encode("a")) + batch.texts[1] == tok.decode(
        tok.encode("a") + batch.tokens[1]
    )


def test_a_prompt_ending_mid_character_gives_its_bytes_to_the_continuation():
    tok = ByteTokenizer()
    ids = tok.encode("é")  # two bytes
    assert len(ids) == 2 and tok.decode(ids[:1]).endswith("\ufffd")
    assert context_of(tok, ids[:1]) == []  # no context that ends inside a character
    assert decode_after(tok, context_of(tok, ids[:1]), ids[1:]) == tok.decode(ids[1:])
    assert decode_after(tok, context_of(tok, tok.encode("ab")), ids) == "é"


def test_unknown_characters_are_named_for_a_framing_tokenizer():
    tok = metaspace()  # its vocabulary has no byte tokens for an emoji: <unk>
    text = "the 😀 cat"
    assert tok.encode("😀")[:1] == [tok.bos_id]  # framed: <s> comes first
    assert tok.unk_id in tok.encode(text)
    assert unknown_characters(tok, text) == ["😀"]
