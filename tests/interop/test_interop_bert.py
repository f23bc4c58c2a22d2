"""BERT parity with ``transformers`` on random-weight models built here (nothing downloads):
BertModel hidden states and pooler, BertForSequenceClassification and BertForMaskedLM logits to
1e-5 in float32 with padding and token types; export round trips; masked-token filling from the
CLI on a directory with BERT's vocab.txt; errors that list what does not map."""

from __future__ import annotations

import pytest
import torch

from attnlab.cli import main
from attnlab.errors import ConfigError
from attnlab.generate.fill_mask import fill_mask
from attnlab.interop.bert import bert_config_to_model_config
from attnlab.interop.pretrained import from_hf_model, load_pretrained, save_pretrained
from hf_dirs import bigger_weights, wordpiece_vocab

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
TOL = {"rtol": 1e-5, "atol": 1e-5}
CONFIG = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
CLASSES = {
    "encoder": "BertModel",
    "classifier": "BertForSequenceClassification",
    "masked_lm": "BertForMaskedLM",
}


def hf_bert(kind: str, seed: int = 0, **extra):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(**{**CONFIG, **extra}, num_labels=3)
    hf = getattr(transformers, CLASSES[kind])(cfg).eval()
    bigger_weights(hf, 0.1)
    return hf


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 120, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 7:] = 0  # right padding, as BERT batches are
    mask[2, 4:] = 0
    types = torch.zeros(3, 12, dtype=torch.long)
    types[:, 6:] = 1  # a sentence pair: segment B from position 6
    return ids, mask, types


def test_bert_model_hidden_states_and_pooler_equal_transformers():
    hf = hf_bert("encoder")
    ours = from_hf_model(hf)
    ids, mask, types = batch()
    with torch.no_grad():
        want = hf(ids, attention_mask=mask, token_type_ids=types)
        hidden = ours(ids, key_padding_mask=mask.bool(), token_types=types).hidden
        real = mask.bool()
        torch.testing.assert_close(hidden[real], want.last_hidden_state[real], **TOL)
        torch.testing.assert_close(ours.pool(hidden), want.pooler_output, **TOL)
        # No token types given: segment 0 everywhere, as in transformers.
        torch.testing.assert_close(ours(ids).hidden, hf(ids).last_hidden_state, **TOL)


def test_sequence_classification_logits_equal_transformers():
    hf = hf_bert("classifier")
    ours = from_hf_model(hf)
    assert (ours.cfg.kind, ours.cfg.n_classes, ours.cfg.pooler) == ("classifier", 3, True)
    ids, mask, types = batch()
    with torch.no_grad():
        want = hf(ids, attention_mask=mask, token_type_ids=types).logits
        got = ours(ids, key_padding_mask=mask.bool(), token_types=types).logits
    torch.testing.assert_close(got, want, **TOL)


def test_masked_lm_logits_equal_transformers():
    hf = hf_bert("masked_lm")
    ours = from_hf_model(hf)
    assert (
        ours.cfg.kind == "masked_lm"
        and ours.mlm.decoder.weight is ours.encoder.embed.tok_emb.weight
    )
    ids, mask, types = batch()
    with torch.no_grad():
        want = hf(ids, attention_mask=mask, token_type_ids=types).logits
        got = ours(ids, key_padding_mask=mask.bool(), token_types=types).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], **TOL)


@pytest.mark.parametrize("kind", list(CLASSES))
def test_export_round_trip_loads_in_transformers_with_equal_outputs(kind, tmp_path):
    hf = hf_bert(kind)
    ours = from_hf_model(hf)
    save_pretrained(ours, tmp_path / kind)
    again = getattr(transformers, CLASSES[kind]).from_pretrained(tmp_path / kind).eval()
    ids, mask, types = batch()
    with torch.no_grad():
        a = hf(ids, attention_mask=mask, token_type_ids=types)
        b = again(ids, attention_mask=mask, token_type_ids=types)
    key = "last_hidden_state" if kind == "encoder" else "logits"
    torch.testing.assert_close(b[key], a[key], rtol=0, atol=0)
    back = load_pretrained(tmp_path / kind)
    assert back.config == ours.cfg


def test_fill_mask_from_a_bert_directory_on_the_command_line(tmp_path, capsys):
    wordpiece_vocab(tmp_path)
    n_vocab = len((tmp_path / "vocab.txt").read_text().split())
    hf = hf_bert("masked_lm", vocab_size=n_vocab)
    hf.save_pretrained(tmp_path)
    found = load_pretrained(tmp_path)
    text = "the quick brown [MASK] jumps over the lazy [MASK]."
    res = fill_mask(found.model, found.tokenizer, text, top_k=3)
    ids = found.tokenizer.encode(text)
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0]
    masks = [i for i, t in enumerate(ids) if t == found.tokenizer.mask_id]
    assert [c[0].id for c in res.candidates] == logits[masks].argmax(-1).tolist()
    assert len(res.candidates) == 2 and all(len(c) == 3 for c in res.candidates)
    code = main(["generate", "--checkpoint", str(tmp_path), "--prompt", text, "--top-k", "3"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip() == res.text and "mask 2:" in err
    assert "[MASK]" not in out
    code = main(["generate", "--checkpoint", str(tmp_path), "--prompt", "no mask here"])
    assert code != 0 and "[MASK]" in capsys.readouterr().err
    # options of step-by-step decoding do not apply to one fill-in pass: refused, all named
    unused = ["--weights", "int8", "--kv-cache", "bf16", "--beams", "3", "--temperature", "0"]
    code = main(["generate", "--checkpoint", str(tmp_path), "--prompt", text, *unused])
    err = capsys.readouterr().err
    assert code != 0 and "masked language model" in err and "Traceback" not in err
    assert all(f in err for f in ("--weights", "--kv-cache", "--beams", "--temperature"))
    code = main(
        [
            "plot",
            "attention",
            "--checkpoint",
            str(tmp_path),
            "--input",
            "the cat sat",
            "--out",
            str(tmp_path / "plots"),
        ]
    )
    assert code == 0 and (tmp_path / "plots" / "self_attention.png").is_file()


def test_unsupported_bert_settings_are_listed_together():
    bad = {
        **CONFIG,
        "model_type": "bert",
        "architectures": ["BertForSequenceClassification"],
        "hidden_act": "swish",
        "position_embedding_type": "relative_key",
        "problem_type": "multi_label_classification",
        "id2label": {"0": "a", "1": "b"},
    }
    with pytest.raises(ConfigError) as err:
        bert_config_to_model_config(bad)
    message = str(err.value)
    for part in ("hidden_act='swish'", "relative_key", "multi_label_classification"):
        assert part in message
    with pytest.raises(ConfigError, match="architecture 'BertForQuestionAnswering'"):
        bert_config_to_model_config({**CONFIG, "architectures": ["BertForQuestionAnswering"]})


class _HFMaskedLM(torch.nn.Module):
    """transformers' BertForMaskedLM behind attnlab's masked-LM call signature."""

    def __init__(self, hf):
        super().__init__()
        self.hf, self.max_len = hf, hf.config.max_position_embeddings

    def forward(self, ids, *, key_padding_mask=None):
        return self.hf(ids, attention_mask=key_padding_mask.long())


def test_masked_lm_evaluation_of_a_text_file_equals_transformers(tmp_path, capsys):
    import json

    from attnlab.train.masked_lm_eval import masked_lm_metrics

    wordpiece_vocab(tmp_path)
    n_vocab = len((tmp_path / "vocab.txt").read_text().split())
    hf = hf_bert("masked_lm", vocab_size=n_vocab, max_position_embeddings=16)
    hf.save_pretrained(tmp_path)
    found = load_pretrained(tmp_path)
    text = "the quick brown fox jumps over the lazy dog. a cat sat on the mat. " * 5
    ours = masked_lm_metrics(found.model, found.tokenizer, text, batch_size=3)
    theirs = masked_lm_metrics(_HFMaskedLM(hf), found.tokenizer, text, batch_size=3)
    assert ours["val_mlm_loss"] == pytest.approx(theirs["val_mlm_loss"], rel=1e-5)
    n_tokens = len(found.tokenizer.encode(text, add_special=False))
    assert 0.1 * n_tokens < ours["val_masked_tokens"] < 0.25 * n_tokens
    (tmp_path / "t.txt").write_text(text)
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                str(tmp_path),
                "--text",
                str(tmp_path / "t.txt"),
                "--json",
                "--batch-size",
                "3",
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)
    assert got["val_mlm_loss"] == pytest.approx(ours["val_mlm_loss"], rel=1e-6)
