"""Hugging Face ``...ForSequenceClassification`` decoders <-> attnlab's DecoderClassifier, through
the decoder families' tables (architectures <-> kind, id2label <-> n_classes, score <-> head).

Random-weight transformers models, nothing downloaded. The property test over every family's
config space (tests/interop/test_interop_families.py) draws classifiers too; these pin the
padded-batch parity, the labels and the refusals.
"""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.interop.pretrained import from_hf_model, load_pretrained, save_pretrained
from attnlab.models import DecoderClassifier, DecoderLM
from hf_dirs import SMALL_LLAMA, padded_batch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

LABELS = {"0": "neg", "1": "neu", "2": "pos"}


def gpt2(cls=None, **kw):
    config = transformers.GPT2Config(
        n_layer=2, n_head=4, n_embd=32, vocab_size=50, n_positions=32, pad_token_id=0, **kw
    )
    torch.manual_seed(0)
    return (cls or transformers.GPT2ForSequenceClassification)(config).eval()


def llama(**kw):
    config = transformers.LlamaConfig(**{**SMALL_LLAMA, "num_key_value_heads": 2, **kw})
    torch.manual_seed(0)
    return transformers.LlamaForSequenceClassification(config).eval()


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_a_padded_batch_gives_transformers_logits_and_the_labels_come_back(make, tmp_path):
    hf = make(id2label=LABELS, label2id={v: int(k) for k, v in LABELS.items()})
    ours = from_hf_model(hf)
    assert isinstance(ours, DecoderClassifier) and ours.cfg.n_classes == 3
    ids, mask = padded_batch(hf.config.vocab_size, hf.config.pad_token_id)
    with torch.no_grad():
        want = hf(ids, attention_mask=mask.long()).logits  # (3, 3)
        torch.testing.assert_close(ours(ids, key_padding_mask=mask).logits, want)
    hf.save_pretrained(tmp_path / "hf")
    found = load_pretrained(tmp_path / "hf", tokenizer=False)
    assert found.config == ours.cfg and found.labels == ["neg", "neu", "pos"]

    save_pretrained(ours, tmp_path / "back", labels=["neg", "neu", "pos"])
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    arch = type(hf).__name__
    assert config["architectures"] == [arch] and config["pad_token_id"] == 0
    assert config["id2label"] == LABELS and config["label2id"] == {"neg": 0, "neu": 1, "pos": 2}
    assert config["problem_type"] == "single_label_classification"
    again = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "back")
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(ids, attention_mask=mask.long()).logits, want)


def test_a_language_model_stays_a_language_model():
    """Every transformers config has an id2label; only a ...ForSequenceClassification reads it."""
    ours = from_hf_model(gpt2(transformers.GPT2LMHeadModel))
    assert isinstance(ours, DecoderLM) and ours.cfg.n_classes is None


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"problem_type": "multi_label_classification"}, "problem_type="),
        ({"num_labels": 1}, "num_labels=1 (a classifier needs at least 2)"),
    ],
)
@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_a_classifier_attnlab_cannot_be_is_refused_in_one_message(make, change, needle):
    with pytest.raises(ConfigError, match="cannot build") as err:
        from_hf_model(make(**change))
    assert needle in str(err.value) and "single-label" in str(err.value)
