"""``attnlab demo``: the tour runs the real training loop and reads the trained model through
attnlab.inspect (a short run here: the 300-step default takes about a minute)."""

from __future__ import annotations

import re

import pytest

from attnlab.checkpoint import load_checkpoint
from attnlab.cli import main


def test_the_tour_trains_reads_and_ablates_a_reverser_and_keeps_the_run(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--steps", "30", "--word", "abc", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "permutation equivariant on 'the oven cooked the bread so': True" in text
    ckpt = load_checkpoint(out)  # the real loop's run directory, with its checkpoint
    assert ckpt.step == 30 and ckpt.model.cfg.kind == "encoder_decoder"
    heads = re.findall(r"cross head (\d+): \[([\d, ]+)\]", text)
    assert [int(h) for h, _ in heads] == list(range(ckpt.model.cfg.n_heads))
    for _, reads in heads:  # one source position per output step: "cba" and the end token
        positions = [int(p) for p in reads.split(", ")]
        assert len(positions) == 4 and all(0 <= p < 3 for p in positions)
    assert re.search(r"the largest increase when one cross-attention head is zeroed: [+-]", text)
    assert f"`attnlab explore {out}`" in text


@pytest.mark.parametrize("word", ["Attention", "", "abcdefghijk", "a b"])
def test_a_word_the_reverser_never_saw_is_refused_before_training(word, tmp_path, capsys):
    assert main(["demo", "--word", word, "--out", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err
    assert "--word" in err and "abcdefghijklmnopqrstuvwxyz" in err
    assert not (tmp_path / "demo").exists()
