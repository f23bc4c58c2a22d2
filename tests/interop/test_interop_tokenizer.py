"""Hugging Face tokenizer directories read through ``tokenizers``: round trips and equality with
transformers' own tokenizer classes, on small tokenizers the tests train and save themselves in
each layout (tokenizer.json; GPT-2's vocab.json + merges.txt; BERT's vocab.txt)."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from attnlab.errors import CheckpointError
from attnlab.interop.hf_tokenizer import load_pretrained_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "attention is all you need, said the transformer",
    "héllo wörld: naïve café ünïcode 東京 🙂",
] * 20
SAMPLES = ["the lazy transformer", "  two  spaces and\nnew line", "café 東京 🙂 unseen zzz", ""]


def byte_level_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXTS, trainer)
    return tok


@pytest.fixture(scope="module")
def gpt2_dirs(tmp_path_factory):
    """The same GPT-2-style tokenizer saved as tokenizer.json and as vocab.json + merges.txt."""
    tok = byte_level_bpe()
    one = tmp_path_factory.mktemp("gpt2_json")
    tok.save(str(one / "tokenizer.json"))
    special = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
    (one / "tokenizer_config.json").write_text(json.dumps(special))
    two = tmp_path_factory.mktemp("gpt2_files")
    tok.model.save(str(two))  # vocab.json + merges.txt
    return one, two


def test_gpt2_layouts_agree_with_each_other_and_with_transformers(gpt2_dirs):
    one, two = gpt2_dirs
    a, b = load_pretrained_tokenizer(one), load_pretrained_tokenizer(two)
    ref = transformers.GPT2TokenizerFast.from_pretrained(str(two))
    for text in SAMPLES:
        ids = a.encode(text)
        assert ids == b.encode(text) == ref(text)["input_ids"]
        assert a.decode(ids) == b.decode(ids) == text  # byte-level BPE: exact round trip
    assert a.bos_id == a.eos_id == b.eos_id == ref.eos_token_id == 0
    assert a.vocab_size == b.vocab_size == len(ref)


def test_token_labels_are_readable_text(gpt2_dirs):
    tok = load_pretrained_tokenizer(gpt2_dirs[0])
    ids = tok.encode("the café")
    labels = [tok.token_to_str(i) for i in ids]
    assert "".join(labels).replace("\u2423", " ") == "the café"
    assert tok.token_to_str(tok.eos_id) == "<|endoftext|>"


def test_llama_style_tokenizer_adds_bos_like_transformers(tmp_path):
    """A SentencePiece-style BPE (Metaspace) whose post-processor puts <s> first, as Llama's."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        TEXTS, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"])
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    settings = {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "unk_token": "<unk>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    ours = load_pretrained_tokenizer(tmp_path)
    ref = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "tokenizer.json"), bos_token="<s>", eos_token="</s>"
    )
    for text in SAMPLES[:2]:
        ids = ours.encode(text)
        assert ids == ref(text)["input_ids"] and ids[0] == ours.bos_id == 1
        assert ours.encode(text, add_special=False) == ids[1:]
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    assert ours.encode("x", add_eos=True)[-1] == ours.eos_id == 2
    assert ours.pad_id == ours.eos_id  # no pad token: padding uses EOS (always masked)


def test_bert_wordpiece_vocab_txt_matches_bert_tokenizer_fast(tmp_path):
    words = sorted({w for t in TEXTS for w in t.lower().split()})
    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *list("abcdefghijklmnopqrstuvwxyz,:"),
        *words,
        "##s",
        "##ed",
    ]
    (tmp_path / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    ours = load_pretrained_tokenizer(tmp_path)
    ref = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
    for text in ["The quick fox jumps", "attention is all you need, said X"]:
        assert ours.encode(text) == ref(text)["input_ids"]
        assert ours.decode(ours.encode(text)) == ref.decode(ref(text)["input_ids"], True)
    assert (ours.mask_id, ours.pad_id) == (4, 0)
    assert ours.encode("dog")[0] == ref.cls_token_id


def test_bad_tokenizer_directories_say_what_is_wrong(tmp_path, gpt2_dirs):
    with pytest.raises(CheckpointError, match="no tokenizer in"):
        load_pretrained_tokenizer(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"\x00")
    with pytest.raises(CheckpointError, match="SentencePiece.*save_pretrained"):
        load_pretrained_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read the tokenizer files"):
        load_pretrained_tokenizer(tmp_path)
    with pytest.raises(CheckpointError, match="has 300 tokens but the model's vocabulary has 100"):
        load_pretrained_tokenizer(gpt2_dirs[0], vocab_size=100)


def test_save_pretrained_reloads_in_transformers(tmp_path, gpt2_dirs):
    tok = load_pretrained_tokenizer(gpt2_dirs[1])
    tok.save_pretrained(tmp_path)
    again = load_pretrained_tokenizer(tmp_path)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert again.encode(SAMPLES[2]) == tok.encode(SAMPLES[2]) == ref(SAMPLES[2])["input_ids"]
    assert ref.eos_token == "<|endoftext|>"
