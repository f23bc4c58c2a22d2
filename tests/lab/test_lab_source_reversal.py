"""Experiment ``source_reversal`` (quick form, the copy task without data): both arms gated,
the reversed arm's encoder reads x_{T:1}, write_up judges stored numbers."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.errors import UserError
from attnlab.lab import run_experiment
from attnlab.lab.experiments import source_reversal as sr
from attnlab.lab.kit.verdict import LearningRate
from attnlab.models import build_model


def test_the_reversed_arm_reads_the_source_backwards():
    """Same weights: the reversed model's encoder states on x are the forward model's on x
    reversed (in reversed order), so the arms differ in reading order alone."""
    models = {}
    for arm, reverse in sr.ARMS.items():
        torch.manual_seed(0)
        cfg = ModelConfig(kind="lstm_seq2seq", vocab_size=20, d_model=16, n_layers=2,
                          rnn_attention="none", reverse_source=reverse)  # fmt: skip
        models[arm] = build_model(cfg).eval()
    src = torch.randint(3, 20, (4, 7))
    with torch.no_grad():
        backwards = models["reversed"].encode(src).memory  # (B, S, E) in source order
        forwards = models["as written"].encode(src.flip(1)).memory
    assert torch.allclose(backwards, forwards.flip(1), atol=1e-6)


def test_the_full_run_needs_multi30k():
    with pytest.raises(UserError, match="multi30k"):
        sr.raw_splits(quick=False, data=None)


def test_quick_source_reversal_run(tmp_path):
    report, path = run_experiment("source_reversal", quick=True, out_dir=tmp_path / "sr")
    assert path.is_file() and (path.parent / "val_loss.png").is_file()
    assert report.arms == list(sr.ARMS)
    for c in report.competence:  # both arms, the one whose loss is the claim too
        assert c.gated and len(c.lr.grid) >= 3 and c.doubling.seeds == [0]
        assert c.doubling.steps == sr.STEPS[True] and not c.higher_is_better
        assert 0 < c.threshold < 10  # the unigram entropy of the targets, in nats
    assert len(report.thresholds) == 3 and all(t.source for t in report.thresholds)
    assert set(report.metrics["test_bleu"]) == set(sr.ARMS)


def _measured(rev_bleu: list[float], fwd_bleu: list[float]) -> dict:
    lr = LearningRate(1e-3, [3e-4, 1e-3, 3e-3])

    def runs(bleus: list[float]) -> list[dict]:
        return [{"val_loss": 2.0, "test_loss": 2.0 + (30 - b) / 10, "val_bleu": b, "test_bleu": b,
                 "curve": [(250, 3.0), (500, 2.5)], "seconds": 300.0, "samples": ["A man."],
                 "entropy": 6.0, "train_pairs": 21830} for b in bleus]  # fmt: skip

    per = {"reversed": runs(rev_bleu), "as written": runs(fwd_bleu)}
    return {"data": "multi30k", "seeds": [0, 1, 2], "steps": 2000,
            "lr": dict.fromkeys(sr.ARMS, lr), "sweeps": {a: {3e-4: 3.0, 1e-3: 2.0, 3e-3: 2.5}
                                                        for a in sr.ARMS},
            "per": per, "double": {a: per[a][0] for a in sr.ARMS}}  # fmt: skip


@pytest.mark.parametrize(
    ("rev", "fwd", "verdict"),
    [([20.0, 21.0, 22.0], [15.0, 16.0, 17.0], "held"),
     ([20.0, 21.0, 22.0], [20.5, 21.5, 22.5], "no effect resolved")],
)  # fmt: skip
def test_write_up_judges_measured_numbers_without_training(tmp_path, monkeypatch, rev, fwd,
                                                           verdict):  # fmt: skip
    monkeypatch.setattr(sr, "train_job", None)  # write_up must not train
    report = sr.write_up(_measured(rev, fwd), tmp_path, quick=False)
    assert report.verdict == verdict, report.verdict_reason
    assert all(c.passed for c in report.competence)
