"""Tiny Hugging Face model directories the tests build themselves (random weights, a BPE trained
here): nothing is downloaded. Imported by the interop, CLI and generation tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

TEXTS = [
    "the quick brown fox jumps over the lazy dog. ",
    "attention is all you need, said the transformer. ",
    "a cat sat on the mat and looked at the hat. ",
] * 30


def byte_level_bpe(vocab_size: int = 300) -> Tokenizer:
    """GPT-2 style: byte-level BPE with <|endoftext|> as its one special token (id 0)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXTS, trainer)
    return tok


def llama_bpe(vocab_size: int = 300) -> Tokenizer:
    """Llama style: <unk>, <s>, </s> first, Metaspace BPE with byte fallback, <s> prepended."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(TEXTS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def wordpiece_vocab(path: Path) -> None:
    """BERT style vocab.txt: [PAD] [UNK] [CLS] [SEP] [MASK], characters, then whole words."""
    words = sorted({w.strip(".,") for t in TEXTS for w in t.split()} - {""})
    chars = sorted({c for t in TEXTS for c in t.lower() if c.strip()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *words]
    (path / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")


# The small Llama-layout config.json the Llama, Mistral, Qwen2, Qwen3 and Gemma 3 tests build on.
SMALL_LLAMA = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, max_position_embeddings=64, bos_token_id=1,
                   eos_token_id=2, pad_token_id=0)  # fmt: skip


def greedy_pair(hf, ours, prompts: torch.Tensor, n: int) -> tuple[list, list]:
    """(transformers' greedy continuations, attnlab's): ``n`` new tokens after each row of
    ``prompts`` (B, T), no stop token, from ``hf.generate`` and from attnlab's ``generate``."""
    from attnlab.generate import GenerationConfig, generate

    greedy = dict(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None)
    want = hf.generate(prompts, pad_token_id=0, **greedy)[:, prompts.size(1) :].tolist()
    gen = GenerationConfig(temperature=0, max_new_tokens=n, stop_token_ids=())
    return want, generate(ours, prompts.tolist(), gen).tokens


def bigger_weights(model: torch.nn.Module, std: float = 0.3) -> None:
    """Larger than the usual 0.02 init so greedy choices are never near-ties."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
            elif "norm" in name.lower() and name.endswith("weight"):
                p.uniform_(0.5, 1.5)


def spread(model: torch.nn.Module, std: float) -> torch.nn.Module:
    """Larger random matrices than the init (norms untouched), so greedy outputs vary instead of
    repeating a token; returns the model in eval mode. Used by the generation tests."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
    return model.eval()


def gpt2_dir(root: Path, transformers) -> tuple[Path, object]:
    tok = byte_level_bpe()
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_head=4,
        n_embd=32,
        vocab_size=tok.get_vocab_size(),
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    bigger_weights(hf)
    hf.save_pretrained(root)
    tok.model.save(str(root))  # vocab.json + merges.txt, GPT-2's original layout
    return root, hf


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")
