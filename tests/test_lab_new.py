"""New experiments (quick forms): the future mask, concatenated vs added positions, the cost
table. Quick runs are CI-sized: they check the measurements' wiring and the exact parts, not
the verdicts (those come from the committed full-size runs)."""

from __future__ import annotations

import torch

from attnlab.lab import run_experiment
from attnlab.lab.future_mask import make_model, prefix_loss, teacher_forced_loss


def test_masked_model_prefix_loss_equals_teacher_forced_loss():
    """With the future mask, feeding prefixes one at a time gives the teacher-forced loss."""
    torch.manual_seed(0)
    model = make_model("masked", 11, 12, quick=True)
    windows = torch.randint(0, 11, (4, 9))
    assert abs(prefix_loss(model, windows) - teacher_forced_loss(model, windows)) < 1e-5
    model = make_model("unmasked", 11, 12, quick=True)  # sees the future: the two differ
    assert abs(prefix_loss(model, windows) - teacher_forced_loss(model, windows)) > 1e-4


def test_future_mask_quick_report(tmp_path):
    report, path = run_experiment("future_mask", quick=True, out_dir=tmp_path)
    assert {c.arm for c in report.competence} == {"masked", "unmasked"}
    assert (tmp_path / "training.png").is_file() and (tmp_path / "losses.png").is_file()
    rows = report.table("losses per arm (mean (min-max) over seeds)").rows
    assert [r["arm"] for r in rows][:2] == ["masked", "unmasked"]
    assert report.metrics["unigram"] > report.metrics["bigram"] > 0
