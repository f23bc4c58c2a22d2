"""Pair and label file readers on temporary files, including every bad-input error."""

from __future__ import annotations

import json
import os

import pytest

from attnlab.data import LabelSet, read_labelled, read_pairs, read_parallel


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


# Pairs --------------------------------------------------------------------------------------
def test_read_tsv_pairs(tmp_path):
    path = write(tmp_path / "p.tsv", "hallo\thello\n\nwelt\tworld\r\n")
    assert read_pairs(path) == [("hallo", "hello"), ("welt", "world")]


def test_read_jsonl_pairs_both_key_styles(tmp_path):
    lines = [{"src": "a", "tgt": "b"}, {"source": "c", "target": "d", "id": 7}]
    path = write(tmp_path / "p.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    assert read_pairs(path) == [("a", "b"), ("c", "d")]


def test_read_parallel(tmp_path):
    de = write(tmp_path / "train.de", "Ein Hund.\nZwei Katzen.\n")
    en = write(tmp_path / "train.en", "A dog.\nTwo cats.\n")
    assert read_parallel(de, en) == [("Ein Hund.", "A dog."), ("Zwei Katzen.", "Two cats.")]


# (file name, content, the error's text) for each malformed pair file
BAD_PAIR_FILES = [
    ("empty.tsv", "", "is empty"),
    ("blank.tsv", "\n\n", "no examples"),
    ("bad.tsv", "a\tb\nno tab here\n", r"bad.tsv:2: expected 'source<TAB>target' but found 0"),
    ("bad.jsonl", '{"src": "a", "tgt": "b"}\n{oops\n', r"bad.jsonl:2: invalid JSON"),
    ("keys.jsonl", '{"src": "a", "target": "b"}\n', r"keys.jsonl:1: expected keys 'src' and 'tgt'"),
    ("type.jsonl", '{"src": "a", "tgt": 3}\n', r"type.jsonl:1: 'tgt' must be a string"),
    ("list.jsonl", '["a", "b"]\n', r"list.jsonl:1: expected a JSON object"),
    ("pairs.dat", "a\tb\n", "cannot tell the pair format.*pass format="),
]


@pytest.mark.parametrize(("name", "text", "match"), BAD_PAIR_FILES)
def test_bad_pair_file_is_named(tmp_path, name, text, match):
    with pytest.raises(ValueError, match=match):
        read_pairs(write(tmp_path / name, text))


def test_pair_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_pairs(tmp_path / "missing.tsv")
    assert read_pairs(write(tmp_path / "pairs.dat", "a\tb\n"), format="tsv") == [("a", "b")]
    (tmp_path / "latin.tsv").write_bytes("caf\xe9\tcoffee\n".encode("latin-1"))
    with pytest.raises(ValueError, match="not valid UTF-8: byte 0xe9 at offset 3"):
        read_pairs(tmp_path / "latin.tsv")


def test_parallel_line_counts_must_match(tmp_path):
    de = write(tmp_path / "a.de", "eins\nzwei\ndrei\n")
    en = write(tmp_path / "a.en", "one\ntwo\n")
    with pytest.raises(ValueError, match=r"a.de' has 3, .*a.en' has 2"):
        read_parallel(de, en)
    with pytest.raises(FileNotFoundError):
        read_parallel(de, tmp_path / "missing.en")


def test_multi30k_validation_split_if_present():
    root = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "multi30k")
    if not os.path.exists(os.path.join(root, "val.de")):
        pytest.skip("multi30k not present")
    pairs = read_parallel(os.path.join(root, "val.de"), os.path.join(root, "val.en"))
    assert len(pairs) == 1014 and all(s and t for s, t in pairs)


# Labelled -----------------------------------------------------------------------------------
def test_read_csv_labelled(tmp_path):
    path = write(tmp_path / "c.csv", 'id,Text,label\n1,"good, really",pos\n2,bad,neg\n\n')
    assert read_labelled(path) == [("good, really", "pos"), ("bad", "neg")]


def test_read_jsonl_labelled(tmp_path):
    path = write(
        tmp_path / "c.jsonl", '{"text": "good", "label": 1}\n{"text": "bad", "label": 0}\n'
    )
    assert read_labelled(path) == [("good", "1"), ("bad", "0")]


BAD_LABEL_FILES = [
    ("h.csv", "sentence,label\nhi,1\n", r"h.csv:1: the CSV header must name 'text' and 'label'"),
    ("f.csv", "text,label\nhi,1\nhi, there,0\n", r"f.csv:3: expected 2 fields"),
    ("e.csv", "text,label\nhi,\n", r"e.csv:2: empty label"),
    ("k.jsonl", '{"text": "hi", "y": 1}\n', r"k.jsonl:1: expected keys 'text' and 'label'"),
    ("b.jsonl", '{"text": "hi", "label": [1]}\n', r"b.jsonl:1: 'label' must be a string or int"),
]


@pytest.mark.parametrize(("name", "text", "match"), BAD_LABEL_FILES)
def test_bad_label_file_is_named(tmp_path, name, text, match):
    with pytest.raises(ValueError, match=match):
        read_labelled(write(tmp_path / name, text))


def test_missing_label_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_labelled(tmp_path / "nope.csv")


# Label ids ----------------------------------------------------------------------------------
def test_label_set_round_trip(tmp_path):
    labels = LabelSet.from_labels(["neg", "pos", "neg", "neutral"])
    assert labels.names == ("neg", "neutral", "pos")
    assert [labels.encode(x) for x in ("neg", "pos")] == [0, 2] and labels.decode(1) == "neutral"
    assert LabelSet.load(labels.save(tmp_path / "labels.json")) == labels
    assert LabelSet.from_labels(["10", "2", "1"]).names == ("1", "2", "10")  # numeric order
    with pytest.raises(ValueError, match="unknown label 'happy'; known labels"):
        labels.encode("happy")
    with pytest.raises(ValueError, match="at least 2 labels"):
        LabelSet.from_labels(["only"])
    with pytest.raises(FileNotFoundError, match="LabelSet.save"):
        LabelSet.load(tmp_path / "missing.json")
