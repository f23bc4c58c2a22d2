"""DecoderClassifier (kind "decoder_classifier"): a bias-free head on the last real token of a
decoder-only trunk, Hugging Face's ...ForSequenceClassification for decoders.

Parity with the NumPy oracle in float64 (causal blocks on each row's real prefix, then W_score on
its last position), the trunk equal to DecoderLM's, padding invariance, the last-position rule,
and the config's checks. Parity with transformers' classifiers is in
tests/interop/test_interop_families.py. Shapes: B batch, T length, D d_model, C classes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import inspect
from attnlab import reference as ref
from attnlab.config import ModelConfig
from attnlab.models import Classifier, DecoderClassifier, DecoderLM, LanguageModel, build_model
from attnlab.models.decoder_classifier import last_real_position
from oracle_params import block_params, to_np

V, D, H, C = 13, 8, 2, 3


def _cfg(**kw) -> ModelConfig:
    base = dict(kind="decoder_classifier", n_classes=C, vocab_size=V, d_model=D, n_heads=H)
    return ModelConfig(**{**base, "n_layers": 2, "d_ff": 16, "max_len": 16, **kw})


def _real(lengths: list[int], n: int) -> torch.Tensor:
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (B, n) True = real


def test_build_model_makes_a_classifier_not_a_language_model():
    model = build_model(_cfg()).eval()
    assert isinstance(model, DecoderClassifier) and isinstance(model, Classifier)
    assert not isinstance(model, LanguageModel) and model.pooling == "last"
    out = model(torch.randint(0, V, (2, 5)), need_weights=True)
    assert out.logits.shape == (2, C) and len(out.attentions) == 2
    assert torch.all(out.attentions[0].self_attn.triu(1) == 0)  # the causal mask is kept
    assert model.head.bias is None and "lm_head.weight" not in model.state_dict()


def test_matches_the_reference_on_each_rows_real_prefix():
    """logits = W_score LN_f(causal blocks(E w + P))[last real position], in float64."""
    model = DecoderClassifier(_cfg()).double().eval()
    ids, real = torch.randint(0, V, (2, 5)), _real([5, 3], 5)
    got = model(ids, key_padding_mask=real).logits  # (2, C)
    for row, n in enumerate((5, 3)):
        w = ids[row, :n]
        x = (
            to_np(model.embed.tok_emb.weight)[w.numpy()]
            + to_np(model.embed.pos_enc.table.weight)[:n]
        )
        for block in model.blocks:
            params = block_params(block, model.cfg)
            x = ref.encoder_block(x, params, mask=ref.causal_mask(n), norm_first=True)
        norm = model.final_norm
        h = ref.layer_norm(x, to_np(norm.weight), to_np(norm.bias), eps=1e-5)  # (n, D)
        want = h[-1] @ to_np(model.head.weight.T)  # (C,)
        np.testing.assert_allclose(to_np(got[row]), want, rtol=1e-10, atol=1e-10)


def test_the_trunk_is_the_language_models():
    torch.manual_seed(0)
    lm = DecoderLM(_cfg(kind="decoder_lm", n_classes=None)).eval()
    clf = DecoderClassifier(_cfg()).eval()
    missing, unexpected = clf.load_state_dict(lm.state_dict(), strict=False)
    assert missing == ["head.weight"] and unexpected == ["lm_head.weight"]
    ids, real = torch.randint(0, V, (2, 6)), _real([6, 4], 6)
    out, cache = inspect.run_with_cache(lm, ids, names="final", key_padding_mask=real)
    hidden = cache["final"]  # (B, T, D): the trunk's output, after the final norm
    torch.testing.assert_close(lm.lm_head(hidden), out.logits)
    last = hidden[[0, 1], [5, 3]]  # (B, D)
    torch.testing.assert_close(clf(ids, key_padding_mask=real).logits, clf.head(last))


@pytest.mark.parametrize("positional", ["learned", "rotary", "alibi"])
def test_right_padding_changes_nothing(positional):
    model = DecoderClassifier(_cfg(positional=positional)).eval()
    ids, real = torch.randint(0, V, (3, 7)), _real([7, 2, 5], 7)
    batch = model(ids, key_padding_mask=real).logits
    for row, n in enumerate((7, 2, 5)):
        alone = model(ids[row : row + 1, :n]).logits[0]
        torch.testing.assert_close(batch[row], alone, rtol=1e-5, atol=1e-5)
    other = ids.masked_fill(~real, 1)  # other token ids at the padding: the same logits
    torch.testing.assert_close(model(other, key_padding_mask=real).logits, batch)


def test_the_last_real_position_is_hugging_faces_rule():
    right = _real([5, 2, 1], 5)
    left = right.flip(-1)  # left padding: the last real token is the last position
    assert last_real_position(right, 3, 5).tolist() == [4, 1, 0]
    assert last_real_position(left, 3, 5).tolist() == [4, 4, 4]
    assert last_real_position(None, 3, 5).tolist() == [4, 4, 4]


def test_bad_input_and_configs_are_refused():
    with pytest.raises(ValueError, match="n_classes >= 2"):
        ModelConfig(kind="decoder_classifier", vocab_size=V)
    with pytest.raises(ValueError, match="needs ModelConfig.n_classes"):
        DecoderClassifier(_cfg(kind="decoder_lm", n_classes=None))
    model = DecoderClassifier(_cfg()).eval()
    with pytest.raises(ValueError, match="entirely padding"):
        model(torch.ones(2, 3, dtype=torch.long), key_padding_mask=_real([3, 0], 3))
    # Decoder-only mechanisms hold for the classifier too (Mistral's window, Gemma's sandwich).
    windowed = DecoderClassifier(_cfg(attn_window=2, norm_placement="sandwich")).eval()
    assert windowed(torch.randint(0, V, (1, 6))).logits.shape == (1, C)
