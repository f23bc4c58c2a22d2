"""Fine-tuning from a pretrained model (``attnlab train --init-from``): a small GPT-2 and a small
Llama made by transformers (random weights, a BPE trained here) are fine-tuned for a few steps,
resumed bit-identically, and exported back to their family; transformers loads the export with the
same logits as attnlab's fine-tuned model. Nothing is downloaded."""

from __future__ import annotations

import pytest
import torch

from attnlab.cli import main
from attnlab.interop import load_checkpoint
from attnlab.train.finetune import freeze, parse_freeze
from hf_dirs import SMALL_LLAMA, TEXTS, gpt2_dir, llama_bpe

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def llama_dir(root):
    tok = llama_bpe()
    cfg = transformers.LlamaConfig(
        **{**SMALL_LLAMA, "vocab_size": tok.get_vocab_size(), "num_key_value_heads": 2}
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(root)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    return root


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text("".join(TEXTS), encoding="utf-8")
    return path


# The flags every fine-tuning run here shares: small batches, one warm-up step, quiet, on the CPU.
QUIET = ["--batch-size", "4", "--warmup-steps", "1", "--eval-every", "0", "--no-progress"]
QUIET += ["--no-plots", "--device", "cpu", "--examples", "0"]


def fine_tune(capsys, init, data: list[str], out, *extra) -> str:
    """``attnlab train --init-from init`` on ``data`` (e.g. ["--text", FILE]) into ``out`` with
    the QUIET flags and ``extra`` (later flags win); asserts it succeeds, returns its stdout."""
    code = main(["train", "--init-from", str(init), *data, "--out", str(out), *QUIET, *extra])
    out_text, err = capsys.readouterr()
    assert code == 0, err
    return out_text


def train(capsys, init, text, out, *extra):
    """A 4-step language-model fine-tune on ``text``, saved every 2 steps; returns stdout."""
    flags = ["--steps", "4", "--context-len", "16", "--lr", "3e-3", "--lr-schedule", "constant"]
    flags += ["--eval-batches", "1", "--save-every", "2"]
    return fine_tune(capsys, init, ["--text", str(text)], out, *flags, *extra)


def export_hf(run, out):
    """``attnlab export --format hf`` of the run's checkpoint into ``out``; returns ``out``."""
    assert main(["export", "--checkpoint", str(run), "--format", "hf", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_fine_tune_resume_and_export_back_to_the_family(family, text, tmp_path, capsys):
    pre = tmp_path / "pretrained"
    pre.mkdir()
    if family == "gpt2":
        gpt2_dir(pre, transformers)
    else:
        llama_dir(pre)
    before = load_checkpoint(pre)
    train(capsys, pre, text, tmp_path / "run")
    tuned = load_checkpoint(tmp_path / "run")
    assert tuned.step == 4 and tuned.config == before.config  # the pretrained config, kept
    assert tuned.tokenizer.to_dict() == before.tokenizer.to_dict()  # and its tokenizer
    changed = [
        k
        for k, v in tuned.model.state_dict().items()
        if not torch.equal(v, before.model.state_dict()[k])
    ]
    assert changed, "fine-tuning changed no weight"

    # Resume: 2 steps, then on to 4, equals the 4 steps in one go, bit for bit.
    train(capsys, pre, text, tmp_path / "split", "--steps", "2")
    train(capsys, pre, text, tmp_path / "split", "--steps", "4", "--resume")
    split = load_checkpoint(tmp_path / "split")
    for k, v in tuned.model.state_dict().items():
        assert torch.equal(v, split.model.state_dict()[k]), k

    # Export back: transformers loads it with attnlab's logits.
    exported = export_hf(tmp_path / "run", tmp_path / "export")
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    assert hf.config.model_type == family
    ids = torch.tensor([tuned.tokenizer.encode("the cat sat on the mat")])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, tuned.model(ids).logits, atol=1e-5, rtol=1e-5)
    again = transformers.AutoTokenizer.from_pretrained(exported)
    assert again("the cat sat")["input_ids"] == tuned.tokenizer.encode("the cat sat")


def test_freeze_embeddings_and_first_layer_keeps_them_pretrained(text, tmp_path, capsys):
    pre = tmp_path / "pretrained"
    pre.mkdir()
    gpt2_dir(pre, transformers)
    before = load_checkpoint(pre).model.state_dict()
    train(capsys, pre, text, tmp_path / "run", "--freeze", "embeddings,1")
    after = load_checkpoint(tmp_path / "run").model.state_dict()
    for k, v in after.items():
        kept = k.startswith(("embed.", "blocks.0.")) or k == "lm_head.weight"  # tied to embed
        assert torch.equal(v, before[k]) == kept, k


def test_freeze_spec_and_its_errors():
    assert parse_freeze("embeddings,2") == (True, 2) and parse_freeze("3") == (False, 3)
    with pytest.raises(ValueError, match="neither 'embeddings' nor a number"):
        parse_freeze("heads")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(Exception, match="matches no parameters"):
        freeze(model, "embeddings")


def test_bad_init_from_is_one_sentence_and_writes_nothing(text, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        ["train", "--init-from", str(tmp_path / "nowhere"), "--text", str(text), "--out", str(out)]
    )
    err = " ".join(capsys.readouterr().err.split())
    assert (
        code == 2
        and "init_from: no checkpoint at" in err
        and "--init-from" in err
        and "does not exist" in err
    )
    assert not out.exists()
    pre = tmp_path / "pretrained"
    pre.mkdir()
    gpt2_dir(pre, transformers)
    code = main(
        [
            "train",
            "--init-from",
            str(pre),
            "--text",
            str(text),
            "--out",
            str(out),
            "--d-model",
            "64",
        ]
    )
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "--init-from takes the model settings and tokenizer" in err
    assert not out.exists()


def test_fine_tune_a_bert_classifier_and_export_it(tmp_path, capsys):
    from hf_dirs import wordpiece_vocab

    pre = tmp_path / "bert"
    pre.mkdir()
    wordpiece_vocab(pre)
    n_vocab = len((pre / "vocab.txt").read_text().split())
    cfg = transformers.BertConfig(
        vocab_size=n_vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    transformers.BertForMaskedLM(cfg).save_pretrained(pre)
    labels = labelled_file(tmp_path / "labels.csv")
    fine_tune(capsys, pre, ["--labels", str(labels)], tmp_path / "run", "--steps", "3")
    tuned = load_checkpoint(tmp_path / "run")
    assert tuned.config.kind == "classifier" and tuned.config.n_classes == 2
    exported = export_hf(tmp_path / "run", tmp_path / "export")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(exported).eval()
    ids = torch.tensor([tuned.tokenizer.encode("the cat sat on the mat")])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, tuned.model(ids).logits, atol=1e-5, rtol=1e-5)
    assert [hf.config.id2label[i] for i in range(2)] == list(tuned.labels.names)


def labelled_file(path):
    """A CSV of (text, label): the three TEXTS, labelled by whether an animal is in them."""
    rows = [
        f"{t.strip().replace(',', '')},{'animal' if 'cat' in t or 'fox' in t else 'other'}"
        for t in TEXTS[:3]
    ]
    path.write_text("text,label\n" + "\n".join(rows * 20) + "\n")
    return path


def classify(capsys, init, labels, out, *extra):
    """An 8-step classifier fine-tune on ``labels``, saved every 4 steps, logging every step."""
    flags = ["--steps", "8", "--lr", "3e-3", "--lr-schedule", "constant", "--save-every", "4"]
    fine_tune(capsys, init, ["--labels", str(labels)], out, *flags, "--log-every", "1", *extra)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_fine_tune_a_decoder_classifier_resume_and_export_it(family, tmp_path, capsys):
    import json

    from attnlab import inspect
    from attnlab.explore.session import Session
    from attnlab.models import DecoderClassifier

    pre = tmp_path / "pretrained"
    pre.mkdir()
    gpt2_dir(pre, transformers) if family == "gpt2" else llama_dir(pre)
    before = load_checkpoint(pre)
    labels = labelled_file(tmp_path / "labels.csv")
    classify(capsys, pre, labels, tmp_path / "run")
    tuned = load_checkpoint(tmp_path / "run")
    cfg = tuned.config
    assert isinstance(tuned.model, DecoderClassifier) and tuned.step == 8
    assert cfg.kind == "decoder_classifier" and cfg.n_classes == 2
    # The pretrained config is kept but for the head (and the pad id the data pads with).
    assert cfg.replace(kind="decoder_lm", n_classes=None, pad_id=before.config.pad_id) == (
        before.config
    )
    assert tuned.tokenizer.to_dict() == before.tokenizer.to_dict()
    pretrained = before.model.state_dict()
    trunk = {k: v for k, v in tuned.model.state_dict().items() if k != "head.weight"}
    assert set(trunk) == set(pretrained) - {"lm_head.weight"}  # the LM head is dropped
    assert any(not torch.equal(v, pretrained[k]) for k, v in trunk.items())
    losses = [
        json.loads(line)["train_loss"]
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(losses) == 8 and sum(losses[-3:]) < sum(losses[:3]), losses  # it learns

    # Resume: 4 steps, then on to 8, equals the 8 steps in one go, bit for bit.
    classify(capsys, pre, labels, tmp_path / "split", "--steps", "4")
    classify(capsys, pre, labels, tmp_path / "split", "--resume")
    split = load_checkpoint(tmp_path / "split").model.state_dict()
    for k, v in tuned.model.state_dict().items():
        assert torch.equal(v, split[k]), k

    # Export: transformers' ...ForSequenceClassification gives the same logits on a padded batch.
    exported = export_hf(tmp_path / "run", tmp_path / "export")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(exported).eval()
    assert type(hf).__name__ == {"gpt2": "GPT2", "llama": "Llama"}[family] + (
        "ForSequenceClassification"
    )
    assert [hf.config.id2label[i] for i in range(2)] == list(tuned.labels.names)
    assert hf.config.pad_token_id == tuned.tokenizer.pad_id == cfg.pad_id
    texts = ["the cat sat on the mat", "attention is all", "a dog"]
    rows = [tuned.tokenizer.encode(t, add_bos=True) for t in texts]
    width = max(map(len, rows))
    ids = torch.tensor([r + [cfg.pad_id] * (width - len(r)) for r in rows])  # right-padded
    mask = torch.tensor([[i < len(r) for i in range(width)] for r in rows])
    with torch.no_grad():
        ours = tuned.model(ids, key_padding_mask=mask).logits  # (3, 2)
        want = hf(ids, attention_mask=mask.long()).logits
        torch.testing.assert_close(want, ours, atol=1e-5, rtol=1e-5)
        alone = torch.cat([tuned.model(torch.tensor([r])).logits for r in rows])
        torch.testing.assert_close(alone, ours, atol=1e-5, rtol=1e-5)  # padding changes nothing

    # The export reads back as the same classifier, and inspect opens it.
    back = load_checkpoint(exported)
    assert back.config == cfg and list(back.labels.names) == list(tuned.labels.names)
    with torch.no_grad():
        torch.testing.assert_close(back.model(ids, key_padding_mask=mask).logits, ours)
    out, cache = inspect.run_with_cache(back.model, ids[:1], names="blocks.*.self_attn.A")
    assert out.logits.shape == (1, 2) and cache["blocks.1.self_attn.A"].shape[-1] == width
    session = Session(back.model, back.tokenizer, labels=back.labels)  # the explorer
    got = session.next_token(texts[0])["candidates"]  # read after <bos>, as in training
    p = ours[0].softmax(-1)
    assert sorted(c["token"] for c in got) == sorted(tuned.labels.names)
    torch.testing.assert_close(torch.tensor([c["p"] for c in got]), p[[c["id"] for c in got]])
    assert session.info()["output"] == "labels" and session.attention(texts[1])["sites"]


def test_freeze_keeps_a_decoder_classifier_trunk_pretrained(tmp_path, capsys):
    pre = tmp_path / "pretrained"
    pre.mkdir()
    gpt2_dir(pre, transformers)
    before = load_checkpoint(pre).model.state_dict()
    labels = labelled_file(tmp_path / "labels.csv")
    classify(capsys, pre, labels, tmp_path / "run", "--freeze", "embeddings,2", "--steps", "2")
    after = load_checkpoint(tmp_path / "run").model.state_dict()
    for k, v in after.items():
        if k != "head.weight":  # the new head is trained; the final norm too, the rest frozen
            assert torch.equal(v, before[k]) == k.startswith(("embed.", "blocks.")), k


def test_a_single_class_is_one_sentence_and_writes_nothing(tmp_path, capsys):
    pre = tmp_path / "pretrained"
    pre.mkdir()
    gpt2_dir(pre, transformers)
    labels = tmp_path / "labels.csv"
    labels.write_text("text,label\n" + "a cat,x\nno dog,x\n" * 10)
    out = tmp_path / "run"
    code = main(["train", "--init-from", str(pre), "--labels", str(labels), "--out", str(out)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "has one class only (['x'])" in err and "at least 2 different" in err
    assert not out.exists()


def test_a_pretrained_classifier_head_follows_the_runs_labels_by_name(tmp_path):
    from attnlab.data import LabelSet
    from attnlab.train.finetune import initial_weights

    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=8, vocab_size=20, n_positions=8, pad_token_id=0,
        id2label={0: "other", 1: "animal"}, label2id={"other": 0, "animal": 1},
    )  # fmt: skip
    transformers.GPT2ForSequenceClassification(config).save_pretrained(tmp_path)
    pre = load_checkpoint(tmp_path)
    head = pre.model.state_dict()["head.weight"]  # (2, D): rows "other", "animal"
    run = initial_weights(pre, pre.config, LabelSet(["animal", "other"]))
    assert torch.equal(run["head.weight"], head[[1, 0]])  # the same classes, in the run's order
    assert "head.weight" not in initial_weights(pre, pre.config, LabelSet(["x", "y"]))  # new head
    three = pre.config.replace(n_classes=3)
    assert "head.weight" not in initial_weights(pre, three, LabelSet(["a", "animal", "other"]))
