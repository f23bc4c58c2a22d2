"""Experiment ``future_mask`` (quick form): both arms gated alike (learning-rate sweep, step
doubling, each in its own training condition), the prefix loss, measure()/write_up() apart."""

from __future__ import annotations

import torch

from attnlab.lab.experiments import future_mask
from attnlab.lab.experiments.future_mask import make_model, prefix_loss
from attnlab.lab.kit.fit import eval_loss, lm_loss
from lab_write_up import write_up_without_training


def test_masked_model_prefix_loss_equals_teacher_forced_loss():
    """With the future mask, feeding prefixes one at a time gives the teacher-forced loss."""
    torch.manual_seed(0)
    model = make_model("masked", 11, 12)
    windows = torch.randint(0, 11, (4, 9))
    assert abs(prefix_loss(model, windows) - eval_loss(model, (windows,), lm_loss)) < 1e-5
    model = make_model("unmasked", 11, 12)  # sees the future: the two differ
    assert abs(prefix_loss(model, windows) - eval_loss(model, (windows,), lm_loss)) > 1e-4


def test_future_mask_quick_report(tmp_path, monkeypatch):
    measured = future_mask.measure(True, 0, None)
    report = future_mask.write_up(measured, tmp_path, True)
    assert set(report.arms) == {"masked", "unmasked"} == {c.arm for c in report.competence}
    for c in report.competence:  # the unmasked arm, the claim's loser, swept and doubled too
        assert c.lr is not None and len(c.lr.grid) >= 2 and c.doubling is not None
        assert c.doubling.steps == 40 and c.doubling.seeds == [0]
    assert len(report.thresholds) == 2 and all(t.source for t in report.thresholds)
    assert (tmp_path / "training.png").is_file() and (tmp_path / "losses.png").is_file()
    rows = report.table("losses per arm (mean (min-max) over seeds)").rows
    assert [r["arm"] for r in rows][:2] == ["masked", "unmasked"]
    assert report.metrics["unigram"] > report.metrics["bigram"] > 0
    continuations = report.table("continuations of validation prompts (seed 0)").rows
    assert len(continuations) == 8 and all(r["continuation"] for r in continuations)
    again = write_up_without_training(
        monkeypatch, future_mask, measured, tmp_path / "again", "gate_arms", "train_job"
    )
    assert again.verdict_reason == report.verdict_reason


def test_verdict_words():
    """Both differences inside the seed spread: "no effect resolved"; both resolved as the claim
    predicts: "held"; one resolved against the claim, one inside: "did not hold"."""
    m = {"seeds": [0, 1, 2], "bigram": 2.5, "unigram": 3.3}

    def losses(train, prefix):
        return {"train": train, "val teacher-forced": train, "val prefix": prefix}

    same = {a: losses([1.0, 1.2, 1.4], [1.5, 1.7, 1.9]) for a in ("masked", "unmasked")}
    assert future_mask._verdict(m, same)[0] == "no effect resolved"
    claim = {
        "masked": losses([1.6, 1.7, 1.8], [1.6, 1.7, 1.8]),
        "unmasked": losses([0.04, 0.05, 0.06], [7.0, 8.0, 9.0]),
    }
    assert future_mask._verdict(m, claim)[0] == "held"
    against = {
        "masked": losses([0.04, 0.05, 0.06], [1.5, 1.7, 1.9]),
        "unmasked": losses([1.6, 1.7, 1.8], [1.6, 1.7, 1.8]),
    }
    assert future_mask._verdict(m, against)[0] == "did not hold"
