"""One attention kernel: every model reaches the softmax of 004 eq. 9 through the one kernel,
``attnlab.nn.attention.scaled_dot_product_attention``, and through few attnlab frames.

The frames are counted at the call of ``Tensor.softmax`` itself (the row activation object's own
frame included): from the decoder LM's ``forward`` at most 5 (nanoGPT 3, Hugging Face Llama 5).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.config import ModelConfig
from attnlab.models import build_model

ROOT = str(Path(attnlab.__file__).parent)
KINDS = ("decoder_lm", "encoder_decoder", "classifier", "encoder", "masked_lm")


def _attnlab_frames() -> list[str]:
    """file:function of the attnlab frames on the stack, outermost first."""
    frames, f = [], sys._getframe(2)  # skip this helper and the spy
    while f is not None:
        if f.f_code.co_filename.startswith(ROOT):
            frames.append(f"{Path(f.f_code.co_filename).name}:{f.f_code.co_name}")
        f = f.f_back
    return frames[::-1]


def _stacks_at_softmax(model, *args, monkeypatch) -> list[list[str]]:
    stacks, real = [], torch.Tensor.softmax

    def spy(self, *a, **k):
        stacks.append(_attnlab_frames())
        return real(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "softmax", spy)
    with torch.no_grad():
        model(*args, need_weights=True)  # the weights: the explicit form, whose softmax we see
    monkeypatch.undo()
    return stacks


def _model(kind: str, **changes):
    torch.manual_seed(0)
    extra = {"n_classes": 3} if kind == "classifier" else {}
    cfg = ModelConfig(
        kind=kind, vocab_size=20, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=16,
        **extra, **changes,
    )  # fmt: skip
    return build_model(cfg).eval()


@pytest.mark.parametrize("positional", ["learned", "rotary", "alibi"])
def test_decoder_lm_reaches_the_softmax_in_five_attnlab_frames(positional, monkeypatch):
    model = _model("decoder_lm", positional=positional)
    stacks = _stacks_at_softmax(model, torch.randint(0, 20, (2, 5)), monkeypatch=monkeypatch)
    assert len(stacks) == 2  # one call per layer
    for frames in stacks:
        assert frames == [
            "lm.py:forward",  # DecoderLM.forward
            "blocks.py:forward",  # CausalBlock.forward: the residual lines
            "multihead.py:forward",  # SelfAttention.forward: Q, K, V, positions
            "attention.py:scaled_dot_product_attention",  # eq. 9, written out once
            "attention.py:__call__",  # the row activation a = Softmax
        ]


@pytest.mark.parametrize("kind", KINDS)
def test_every_transformer_attends_through_the_one_kernel(kind, monkeypatch):
    model = _model(kind)
    ids = torch.randint(0, 20, (2, 5))
    args = (ids, ids) if kind == "encoder_decoder" else (ids,)
    stacks = _stacks_at_softmax(model, *args, monkeypatch=monkeypatch)
    assert stacks
    for frames in stacks:
        # block -> attention module -> the kernel -> the activation: nothing in between
        assert frames[-4:] == [
            "blocks.py:forward",
            "multihead.py:forward",
            "attention.py:scaled_dot_product_attention",
            "attention.py:__call__",
        ]
        assert len(frames) <= 7  # model wrappers (encoder, stack, heads) add at most 3
