"""Tiny models for the explorer tests (test_explore_*.py): built in-process, nothing downloaded."""

from __future__ import annotations

import torch

from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer
from attnlab.explore import Session
from attnlab.models import build_model

TOK = CharTokenizer.train(["abcdefghij klmnop"])
TINY = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=24)


def tiny_model(kind: str = "decoder_lm", seed: int = 0, **changes) -> torch.nn.Module:
    """A random-weight model of ``kind`` over TOK's vocabulary (eval mode)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(kind=kind, vocab_size=TOK.vocab_size, **{**TINY, **changes})
    return build_model(cfg).eval()


def tiny_session(kind: str = "decoder_lm", **changes) -> Session:
    return Session(tiny_model(kind, **changes), TOK, name=f"tiny {kind}")


def _fit(model: torch.nn.Module, loss_of, steps: int, lr: float) -> torch.nn.Module:
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = loss_of(model)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def trained_lm() -> torch.nn.Module:
    """A tiny LM fitted to random five-letter words said three times ("kofan kofan kofan"): after
    the first time, only attention to the earlier occurrence predicts the next letter."""
    letters, space = torch.tensor(TOK.encode("abcdefghijklmnop")), TOK.encode(" ")[0]

    def loss_of(model):
        word = letters[torch.randint(0, len(letters), (32, 5))]  # (B, 5)
        x = torch.cat([word, torch.full((32, 1), space)], dim=1).repeat(1, 3)  # (B, 18)
        logits = model(x[:, :-1]).logits  # (B, T, V)
        return torch.nn.functional.cross_entropy(logits[:, 6:].flatten(0, 1), x[:, 7:].flatten())

    return _fit(tiny_model("decoder_lm"), loss_of, 300, 1e-2)


def trained_reverser() -> torch.nn.Module:
    """A tiny encoder-decoder fitted to reverse 5 letters (cross-attention turns anti-diagonal)."""
    letters = torch.tensor(TOK.encode("abcdefghijklmnop"))

    def loss_of(model):
        src = letters[torch.randint(0, len(letters), (32, 5))]  # (B, S)
        tgt = src.flip(1)
        tgt_in = torch.cat([torch.full((32, 1), TOK.bos_id), tgt[:, :-1]], dim=1)  # (B, T)
        logits = model(src, tgt_in).logits  # (B, T, V)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())

    return _fit(tiny_model("encoder_decoder", seed=1), loss_of, 300, 1e-2)


def bert_dir(root, kind: str, seed: int = 0):
    """A random-weight Hugging Face BERT directory (BertForMaskedLM or
    BertForSequenceClassification, 3 labels) with its WordPiece vocab.txt, saved to ``root``;
    returns (root, the transformers model)."""
    import transformers

    from hf_dirs import bigger_weights, wordpiece_vocab

    wordpiece_vocab(root)
    n_vocab = len((root / "vocab.txt").read_text().split())
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        vocab_size=n_vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=3,
    )  # fmt: skip
    cfg._attn_implementation = "eager"  # so that output_attentions gives the weights
    names = {"masked_lm": "BertForMaskedLM", "classifier": "BertForSequenceClassification"}
    hf = getattr(transformers, names[kind])(cfg).eval()
    bigger_weights(hf, 0.1)
    hf.save_pretrained(root)
    return root, hf
