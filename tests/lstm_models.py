"""A tiny LSTM encoder-decoder with Bahdanau attention and its batches, shared by the tests of
attnlab.models (test_recurrent_seq2seq) and attnlab.inspect (test_inspect_*)."""

from __future__ import annotations

import torch

from attnlab.config import ModelConfig
from attnlab.models.build import build_model
from attnlab.models.lstm_seq2seq import LSTMSeq2Seq

V_SRC, V_TGT, D = 9, 7, 4


def _model(**changes) -> LSTMSeq2Seq:
    settings = dict(
        kind="lstm_seq2seq",
        vocab_size=V_SRC,
        tgt_vocab_size=V_TGT,
        d_model=D,
        n_layers=2,
        rnn_attention="additive",
        d_attn=3,
    )
    return build_model(ModelConfig(**{**settings, **changes})).eval()


def _batch(b: int = 3, s: int = 6, t: int = 5):
    src = torch.randint(1, V_SRC, (b, s))
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[1, 4:] = False  # right padding
    mask[2, :2] = False  # left padding
    src[~mask] = 0
    return src, mask, torch.randint(1, V_TGT, (b, t))
