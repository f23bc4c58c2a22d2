"""New experiments (quick forms): the future mask, concatenated vs added positions, the cost
table. Quick runs are CI-sized: they check the measurements' wiring and the exact parts, not
the verdicts (those come from the committed full-size runs)."""

from __future__ import annotations

import pytest
import torch

from attnlab.lab import run_experiment
from attnlab.lab.experiments.future_mask import make_model, prefix_loss
from attnlab.lab.kit.fit import eval_loss, lm_loss


def test_masked_model_prefix_loss_equals_teacher_forced_loss():
    """With the future mask, feeding prefixes one at a time gives the teacher-forced loss."""
    torch.manual_seed(0)
    model = make_model("masked", 11, 12, quick=True)
    windows = torch.randint(0, 11, (4, 9))
    assert abs(prefix_loss(model, windows) - eval_loss(model, (windows,), lm_loss)) < 1e-5
    model = make_model("unmasked", 11, 12, quick=True)  # sees the future: the two differ
    assert abs(prefix_loss(model, windows) - eval_loss(model, (windows,), lm_loss)) > 1e-4


def test_future_mask_quick_report(tmp_path):
    report, path = run_experiment("future_mask", quick=True, out_dir=tmp_path)
    assert {c.arm for c in report.competence} == {"masked", "unmasked"}
    assert (tmp_path / "training.png").is_file() and (tmp_path / "losses.png").is_file()
    rows = report.table("losses per arm (mean (min-max) over seeds)").rows
    assert [r["arm"] for r in rows][:2] == ["masked", "unmasked"]
    assert report.metrics["unigram"] > report.metrics["bigram"] > 0


def test_permuted_examples_follow_the_permutation():
    import numpy as np

    from attnlab.lab.experiments.concat_positions import permuted_examples
    from attnlab.lab.kit.copy_task import SEP

    perm = np.array([2, 0, 1])
    ids, targets = permuted_examples(2, 3, perm, 8, np.random.default_rng(0))
    row = ids[0].tolist()  # <bos> a b c | c a b <eos>
    assert row[4] == SEP and row[5:8] == [row[1 + p] for p in perm]
    assert targets[0].tolist() == [-100] * 4 + row[5:9]


def test_concat_positions_quick_report(tmp_path):
    report, _ = run_experiment("concat_positions", quick=True, out_dir=tmp_path)
    arms = {c.arm for c in report.competence}
    assert arms == {
        f"{a}, {t}"
        for a in ("added", "concatenated", "concatenated, unit")
        for t in ("copy", "permute")
    }
    scale = report.setup[-1]  # the concatenated arm's sinusoids enter at the token scale c
    assert "mapped positions (|W_p| x RMS(c PE))" in scale
    assert (tmp_path / "learning_copy.png").is_file() and (
        tmp_path / "learning_permute.png"
    ).is_file()
    # every compared arm and task is swept over LRS; exactly one lr each is chosen, the one the
    # main table and the competence check report
    from attnlab.lab.experiments.concat_positions import COMPARED, LRS, TASKS

    sweep = report.table("learning-rate sweep (validation sets, every seed)").rows
    assert len(sweep) == len(TASKS) * len(COMPARED) * len(LRS)
    chosen = {(r["task"], r["position input"]): r["peak lr"] for r in sweep if r["chosen"]}
    assert len(chosen) == len(TASKS) * len(COMPARED)
    rows = report.table("accuracy and learning speed per task and position input").rows
    for row in rows:
        if row["position input"] in COMPARED:
            assert row["peak lr"] == chosen[(row["task"], row["position input"])]
            assert report.metrics["lr"][f"{row['position input']}, {row['task']}"] == row["peak lr"]


def test_concat_positions_lr_is_chosen_on_validation_only():
    import math

    from attnlab.lab.experiments.concat_positions import choose_lr

    def run(val, steps, loss=0.1, final=0.0):  # ``final`` is the test accuracy: never looked at
        return {"val": val, "val_steps": steps, "loss": loss, "final": final, "steps": 1}

    plateau = [run(1.0, 300), run(0.926, math.inf), run(1.0, 300)]  # fast, one seed stuck
    slower = [run(1.0, 600), run(1.0, 1100), run(0.995, 500)]  # every seed >= 0.99
    assert choose_lr({3e-3: plateau, 1e-3: slower}) == 1e-3
    faster = [run(1.0, 400, final=0.1), run(1.0, 500), run(1.0, 400)]
    assert choose_lr({1e-3: slower, 3e-3: faster}) == 3e-3  # all pass: fewest steps (val) wins
    worst = [run(0.5, math.inf), run(0.9, math.inf), run(0.9, math.inf)]
    better = [run(0.8, math.inf), run(0.8, math.inf), run(0.8, math.inf)]
    assert choose_lr({1e-2: worst, 1e-3: better}) == 1e-3  # none pass: the best worst seed


def test_concat_positions_test_set_is_held_out_from_validation():
    from attnlab.lab.experiments.concat_positions import task_data

    for task in ("copy", "permute"):
        data = task_data(task, True, 0)
        (val, _), (test, _) = data["val"], data["test"]
        assert val.shape == test.shape and not torch.equal(val, test)
    data = task_data("permute", True, 0)  # the same permutation in validation and test
    n = data["n_max"]
    for ids, _ in (data["val"], data["test"]):
        first = ids[:, 1 : n + 1]  # (N, n) x_1..x_n
        out = ids[:, n + 2 : 2 * n + 2]  # (N, n) x_pi(1)..x_pi(n)
        perm = [first[0].tolist().index(v) for v in out[0].tolist()]
        assert torch.equal(out, first[:, perm])


def test_complexity_counts_and_crossover():
    from torch import nn

    from attnlab.lab.experiments.complexity import (
        attention_core,
        counted_flops,
        crossover,
        recurrence_loop,
    )

    q, k, v = (torch.randn(1, 1, 10, 6) for _ in range(3))
    assert counted_flops(attention_core, q, k, v) == 4 * 10 * 10 * 6  # Q K^T and A V
    rnn = nn.RNN(6, 6, batch_first=True)
    x = torch.randn(1, 5, 6)
    assert counted_flops(recurrence_loop, x, rnn) == 4 * 5 * 6 * 6  # W h and U x per step
    assert torch.allclose(recurrence_loop(x, rnn), rnn(x)[0], atol=1e-6)  # the same recurrence
    ns = [8, 16, 32, 64]
    assert crossover(
        ns, [4 * n * n * 16 for n in ns], [4 * n * 16 * 16 for n in ns]
    ) == pytest.approx(16)


def test_complexity_quick_report(tmp_path):
    report, _ = run_experiment("complexity", quick=True, out_dir=tmp_path)
    assert report.metrics["crossover_flops"] == {"32": pytest.approx(32.0)}
    assert report.competence == [] and (tmp_path / "flops.png").is_file()


def test_residual_switch_and_position_probe():
    from attnlab.lab.experiments.residual import layer_outputs, make_model, position_probe

    torch.manual_seed(0)
    ids = torch.randint(0, 9, (6, 8))
    with_res, without = (
        make_model("with residuals", 9, 8, 2),
        make_model("without residuals", 9, 8, 2),
    )
    without.load_state_dict(with_res.state_dict())
    a, b = layer_outputs(with_res, ids), layer_outputs(without, ids)
    assert len(a) == 3 and torch.equal(a[0], b[0]) and not torch.allclose(a[1], b[1])
    # The probe reads a position that is written in the vectors, and not one that is absent.
    coded = torch.stack([torch.nn.functional.one_hot(torch.arange(8), 8).float()] * 10)
    assert position_probe(coded + 0.01 * torch.randn(10, 8, 8)) == 1.0
    assert position_probe(torch.randn(10, 8, 4)) < 0.5


def test_residual_quick_report(tmp_path):
    report, _ = run_experiment("residual", quick=True, out_dir=tmp_path)
    assert {c.arm for c in report.competence} == {
        "with residuals, 2 layers",
        "with residuals, 4 layers",
    }
    probe = report.metrics["probe"]["with residuals"]
    assert len(probe) == 5 and probe[0] > 0.9  # learned positions are readable from the embedding


def test_concat_positions_scaled_arm_puts_pe_at_the_token_scale():
    import math

    from attnlab.lab.experiments.concat_positions import ScaledConcat, build
    from attnlab.lab.kit.copy_task import rms

    scaled, raw = build("concatenated", 20, 9, True), build("concatenated, unit", 20, 9, True)
    assert isinstance(scaled.embed.pos_enc, ScaledConcat)
    c = scaled.embed.pos_enc.scale
    assert c == pytest.approx(rms(scaled.embed.tok_emb.weight) * math.sqrt(2.0))
    x, pos = torch.zeros(1, 9, 32), torch.arange(9)
    assert torch.allclose(scaled.embed.pos_enc.signal(pos, x), c * raw.embed.pos_enc.signal(pos, x))
