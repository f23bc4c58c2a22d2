"""attnlab's char and byte tokenizers exported as a real tokenizer.json (attnlab.interop.
tokenizer_json): ``AutoTokenizer`` reads the ids attnlab's ``encode`` gives and decodes them back,
and transformers' ``generate`` on an exported char-level (and byte-level) model continues a text
prompt exactly as attnlab's ``generate`` does."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.data import ByteTokenizer, CharTokenizer
from attnlab.generate import GenerationConfig, generate
from attnlab.interop import export_as
from attnlab.interop.pretrained import load_pretrained
from attnlab.models import build_model

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

CORPUS = "the cat sat on the mat.\nÄrger über Öl, 中文 and <tags> too!  "
TEXTS = ["the cat", "Öl über 中文\n\n", "  on  the mat  ", "<tags> too!", ""]


def tokenizers():
    return {
        "char": CharTokenizer.train([CORPUS]),
        "char_unk": CharTokenizer.train([CORPUS], unk=True),
        "byte": ByteTokenizer(),
    }


@pytest.mark.parametrize("name", ["char", "char_unk", "byte"])
def test_auto_tokenizer_encodes_and_decodes_like_attnlab(name, tmp_path):
    tok = tokenizers()[name]
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1))
    out = export_as(model, "hf", tmp_path / "hf", tokenizer=tok)
    assert (out / "tokenizer.json").is_file() and (out / "attnlab_tokenizer.json").is_file()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert len(hf_tok) == tok.vocab_size
    assert (hf_tok.pad_token_id, hf_tok.bos_token_id, hf_tok.eos_token_id) == (0, 1, 2)
    for text in TEXTS:
        ids = tok.encode(text)
        assert hf_tok(text)["input_ids"] == ids, text
        assert hf_tok.decode(ids) == text
        framed = [tok.bos_id, *ids, tok.eos_id, tok.pad_id]
        assert hf_tok.decode(framed, skip_special_tokens=True) == tok.decode(framed)
    if name == "char_unk":  # an unseen character is <unk>, kept by decode as in attnlab
        ids = tok.encode("cat#")
        assert hf_tok("cat#")["input_ids"] == ids and hf_tok.decode(ids) == tok.decode(ids)
    # The one difference: a special token's text in the input ("<bos>") is that token in
    # transformers (an added token), five characters or bytes in attnlab.
    assert hf_tok("a<bos>")["input_ids"][-1] == tok.bos_id
    assert load_pretrained(out).tokenizer.encode("the cat", add_special=False) == tok.encode(
        "the cat"
    )


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("char", dict(positional="learned", activation="gelu_tanh")),  # GPT-2
        ("byte", dict(positional="rotary", norm="rmsnorm", ffn="swiglu", activation="silu",
                      bias=False, n_kv_heads=1)),  # Llama
    ],
)  # fmt: skip
def test_transformers_generate_continues_an_exported_model_like_attnlab(name, shape, tmp_path):
    tok = tokenizers()[name]
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, **shape)
    model = build_model(cfg).eval()
    with torch.no_grad():  # spread the logits so greedy decoding has clear winners
        model.lm_head.weight.mul_(20.0)
    out = export_as(model, "hf", tmp_path / "hf", tokenizer=tok)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    prompt = "the cat sat"
    inputs = hf_tok(prompt, return_tensors="pt")
    with torch.no_grad():
        sequences = hf.generate(
            **inputs, do_sample=False, max_new_tokens=12, min_new_tokens=12, eos_token_id=None
        )
    new = sequences[0, inputs["input_ids"].size(1) :].tolist()
    gen = GenerationConfig(temperature=0, max_new_tokens=12, stop_token_ids=())
    ours = generate(model, prompt, gen, tokenizer=tok)
    assert ours.tokens[0] == new
    assert hf_tok.decode(sequences[0], skip_special_tokens=True) == prompt + tok.decode(new)
