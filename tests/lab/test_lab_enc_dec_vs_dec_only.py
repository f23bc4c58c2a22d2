"""Experiment ``enc_dec_vs_dec_only`` (quick form) and the decoder-only form of a pair
(:func:`attnlab.lab.kit.seq2seq.concatenated`)."""

from __future__ import annotations

import pytest

from attnlab.lab import run_experiment
from attnlab.lab.experiments import enc_dec_vs_dec_only as ed
from attnlab.lab.kit.seq2seq import concatenated, pair_batch
from attnlab.lab.kit.verdict import LearningRate


def test_concatenated_puts_the_target_half_after_the_separator():
    tok = ed.tokenizer()
    pairs = [("abc", "cba"), ("a", "a"), ("12+9", "21")]
    ids, targets = concatenated(pair_batch(pairs, tok), sep=tok.encode(ed.SEP)[0], pad=0)
    for row, (src, tgt) in enumerate(pairs):
        seq = tok.encode(src) + tok.encode(ed.SEP) + tok.encode(tgt) + [tok.eos_id]
        assert ids[row, : len(seq)].tolist() == seq and not ids[row, len(seq) :].any()
        kept = [(j, t) for j, t in enumerate(targets[row].tolist()) if t != -100]
        assert [t for _, t in kept] == tok.encode(tgt) + [tok.eos_id]  # y EOS only
        assert all(ids[row, j + 1] == t for j, t in kept)  # next-token targets


def test_parameter_counts_are_matched():
    vocab = ed.tokenizer().vocab_size
    enc_dec = ed.count(ed.model_of("encoder-decoder", vocab, ed.D_FF))
    dec_only = ed.count(ed.model_of("decoder-only", vocab, ed.matched_d_ff(vocab)))
    assert abs(enc_dec - dec_only) / enc_dec < 0.01


def test_quick_enc_dec_run(tmp_path):
    report, path = run_experiment("enc_dec_vs_dec_only", quick=True, out_dir=tmp_path / "ed")
    assert path.is_file() and (path.parent / "exact_match.png").is_file()
    assert report.arms == ed.arm_names(True) and len(report.arms) == 2
    assert [c.arm for c in report.competence] == report.arms
    for c in report.competence:  # both architectures gated alike
        assert c.gated and len(c.lr.grid) >= 3 and c.doubling.seeds == [0]
        assert c.doubling.steps == ed.STEPS[True]["reversal"]
    assert len(report.thresholds) == 3 and all(t.source for t in report.thresholds)
    params = report.metrics["parameters"]
    assert abs(params[report.arms[0]] - params[report.arms[1]]) / params[report.arms[0]] < 0.01


def _measured(enc_dec: list[float], dec_only: list[float]) -> dict:
    arms = ed.arm_names(False)
    lr = LearningRate(1e-3, [3e-4, 1e-3, 3e-3])

    def runs(exact: list[float]) -> list[dict]:
        return [{"val_loss": 0.1, "val_token": 0.99, "token": 0.99, "exact": e,
                 "parameters": 241_000, "seconds": 60.0} for e in exact]  # fmt: skip

    per = {a: runs(enc_dec if a.endswith("encoder-decoder") else dec_only) for a in arms}
    return {"arms": arms, "tasks": list(ed.TASKS), "seeds": [0, 1, 2],
            "steps": dict(ed.STEPS[False]),
            "lr": dict.fromkeys(arms, lr), "sweeps": {a: {3e-4: 1.0, 1e-3: 0.1, 3e-3: 0.5}
                                                     for a in arms},
            "per": per, "double": {a: per[a][0] for a in arms}}  # fmt: skip


@pytest.mark.parametrize(
    ("enc_dec", "dec_only", "verdict"),
    [([0.9, 0.92, 0.95], [0.6, 0.7, 0.8], "held"),
     ([0.9, 0.92, 0.95], [0.91, 0.93, 0.94], "no effect resolved"),
     ([0.5, 0.55, 0.6], [0.9, 0.92, 0.95], "did not hold")],
)  # fmt: skip
def test_write_up_judges_measured_numbers_without_training(
    tmp_path, monkeypatch, enc_dec, dec_only, verdict
):
    monkeypatch.setattr(ed, "train_job", None)  # write_up must not train
    report = ed.write_up(_measured(enc_dec, dec_only), tmp_path, quick=False)
    assert report.verdict == verdict, report.verdict_reason
    assert all(c.passed for c in report.competence)
    steps = {c.arm: c.doubling.steps for c in report.competence}  # each task its own budget
    assert steps == {a: ed.STEPS[False][a.split(", ")[0]] for a in report.arms}
    assert "reversal 2000 steps, addition 8000 steps" in " ".join(report.setup)
