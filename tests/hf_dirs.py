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


# The small Llama-layout config.json the Llama, Mistral, Qwen and Gemma tests build on.
SMALL_LLAMA = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, max_position_embeddings=64, bos_token_id=1,
                   eos_token_id=2, pad_token_id=0)  # fmt: skip


def token_ids(t: int, seed: int, b: int = 2) -> torch.Tensor:
    """(b, t) ids in [3, 97): SMALL_LLAMA's vocabulary without its pad, bos and eos ids."""
    return torch.randint(3, 97, (b, t), generator=torch.Generator().manual_seed(seed))


def padded_batch(vocab: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask): three rows of lengths 9, 4, 6, right-padded with ``pad``; no real pad ids."""
    ids = torch.randint(pad + 1, vocab, (3, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.arange(9)[None, :] < torch.tensor([9, 4, 6])[:, None]  # (B, T)
    return ids.masked_fill(~mask, pad), mask


def greedy_pair(hf, ours, prompts: torch.Tensor, n: int) -> tuple[list, list]:
    """(transformers' greedy continuations, attnlab's): ``n`` new tokens after each row of
    ``prompts`` (B, T), no stop token, from ``hf.generate`` and from attnlab's ``generate``."""
    from attnlab.generate import GenerationConfig, generate

    greedy = dict(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None)
    want = hf.generate(prompts, pad_token_id=0, **greedy)[:, prompts.size(1) :].tolist()
    gen = GenerationConfig(temperature=0, max_new_tokens=n, stop_token_ids=())
    return want, generate(ours, prompts.tolist(), gen).tokens


def assert_logits_and_greedy_equal(hf, ours, ids: torch.Tensor, **tol) -> torch.Tensor:
    """attnlab's copy ``ours`` of ``hf`` gives ``hf``'s logits on ``ids`` (B, T) within ``tol``
    and the same 12 greedy tokens after each ``ids[:, :10]``; returns ours' logits (B, T, V)."""
    with torch.no_grad():
        logits = ours(ids).logits
        torch.testing.assert_close(logits, hf(ids).logits, **tol)
    want, got = greedy_pair(hf, ours, ids[:, :10], 12)
    assert got == want
    return logits


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


def hf_causal_lm(family: str, config: dict, seed: int = 0, config_family: str = ""):
    """transformers' ``{family}ForCausalLM`` of ``{config_family or family}Config(**config)``,
    seeded, in eval mode, its matrices drawn larger than the init (``bigger_weights``: away from
    near-ties in argmax). Each family's test then draws the norm gains and biases its own way."""
    import transformers

    torch.manual_seed(seed)
    cfg = getattr(transformers, f"{config_family or family}Config")(**config)
    hf = getattr(transformers, f"{family}ForCausalLM")(cfg).eval()
    bigger_weights(hf, 0.2)
    return hf


def redraw(model: torch.nn.Module, *, norm_std: float = 0.0, bias_std: float = 0.0) -> None:
    """Draw ``model``'s norm gains from N(0, norm_std) (Gemma's w of a (1 + w) gain initialises
    to 0: this makes every gain matter) and its biases from N(0, bias_std); 0 leaves them be."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if norm_std and "norm" in name:
                p.normal_(0.0, norm_std)
            elif bias_std and name.endswith("bias"):
                p.normal_(0.0, bias_std)


def gemma_lm(version: int, config: dict, seed: int = 0):
    """transformers' Gemma 1, 2 or 3 (``version``) causal LM of ``config`` (hf_causal_lm) with
    its biases drawn from N(0, 0.2) and its norm gains' w from N(0, 0.3): Gemma's (1 + w) gains
    initialise to w = 0, this makes every gain matter."""
    names = {1: ("Gemma", ""), 2: ("Gemma2", ""), 3: ("Gemma3", "Gemma3Text")}
    family, config_family = names[version]
    hf = hf_causal_lm(family, config, seed, config_family)
    redraw(hf, norm_std=0.3, bias_std=0.2)
    return hf


def assert_export_round_trip(hf, root: Path, ids: torch.Tensor, **tol) -> object:
    """Export attnlab's copy of ``hf`` to ``root``: transformers must load it as ``hf``'s class
    with ``hf``'s logits on ``ids`` (within ``tol``), and attnlab load it back to the same config,
    model type and bit-identical logits. Returns transformers' reload for further checks."""
    import transformers

    from attnlab.interop.pretrained import from_hf_model, load_pretrained, save_pretrained

    ours = from_hf_model(hf)
    save_pretrained(ours, root)
    again = transformers.AutoModelForCausalLM.from_pretrained(root).eval()
    assert type(again) is type(hf)
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, hf(ids).logits, **tol)
    back = load_pretrained(root)
    assert back.config == ours.cfg and back.model_type == hf.config.model_type
    with torch.no_grad():
        torch.testing.assert_close(back.model(ids).logits, ours(ids).logits, rtol=0, atol=0)
    return again
