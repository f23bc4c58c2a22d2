"""New experiments (quick forms): concatenated vs added positions, the cost table. Quick runs
are CI-sized: they check the measurements' wiring and the exact parts, not the verdicts (those
come from the committed full-size runs)."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.lab import run_experiment


def test_permuted_examples_follow_the_permutation():
    import numpy as np

    from attnlab.lab.experiments.concat_positions import permuted_examples
    from attnlab.lab.kit.copy_task import SEP

    perm = np.array([2, 0, 1])
    ids, targets = permuted_examples(2, 3, perm, 8, np.random.default_rng(0))
    row = ids[0].tolist()  # <bos> a b c | c a b <eos>
    assert row[4] == SEP and row[5:8] == [row[1 + p] for p in perm]
    assert targets[0].tolist() == [-100] * 4 + row[5:9]


def test_concat_positions_quick_report(tmp_path, monkeypatch):
    from attnlab.lab.experiments import concat_positions
    from attnlab.lab.experiments.concat_positions import COMPARED, LRS, MAX_EXTRA, TASKS

    measured = concat_positions.measure(True, 0)
    monkeypatch.setattr(concat_positions, "fit", None)  # write_up must not train
    report = concat_positions.write_up(measured, tmp_path, quick=True)
    arms = {c.arm for c in report.competence}
    assert arms == {
        f"{a}, {t}"
        for a in ("added", "concatenated", "concatenated, unit")
        for t in ("copy", "permute")
    }
    assert set(report.arms) == {f"{a}, {t}" for a in COMPARED for t in TASKS}
    for c in report.competence:  # every compared arm: a swept rate and a step doubling
        assert c.gated == c.in_verdict
        if c.in_verdict:
            assert c.lr.chosen in c.lr.grid and c.doubling.seeds == [0]
            grid = sorted(c.lr.grid)  # an edge choice only when the extensions ran out
            assert c.lr.bracketed or len(grid) == len(LRS) + MAX_EXTRA
    assert report.thresholds and report.verdict in (
        "held",
        "did not hold",
        "mixed",
        "no effect resolved",
        "inconclusive",
    )
    scale = report.setup[-1]  # the concatenated arm's sinusoids enter at the token scale c
    assert "mapped positions (|W_p| x RMS(c PE))" in scale
    assert (tmp_path / "learning_copy.png").is_file() and (
        tmp_path / "learning_permute.png"
    ).is_file()
    # every compared arm and task is swept over its grid; exactly one lr each is chosen, the one
    # the main table and the competence check report
    sweep = report.table("learning-rate sweep (validation sets, every seed)").rows
    assert len(sweep) == sum(len(measured["grids"][(a, t)]) for a in COMPARED for t in TASKS)
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


def test_complexity_says_cpu_only_and_write_up_does_not_time(tmp_path, monkeypatch):
    import os

    from attnlab.lab.experiments import complexity

    measured = complexity.measure(True, 0)

    def no_timing(*args, **kwargs):
        raise AssertionError("write_up must not time anything")

    monkeypatch.setattr(complexity, "best_ms", no_timing)
    report = complexity.write_up(measured, tmp_path, quick=True)
    assert report.verdict_reason.startswith(f"CPU only ({os.cpu_count()} logical cores")
    assert report.arms == [] and report.competence == [] and len(report.thresholds) == 2
    assert any(s.startswith("CPU only") for s in report.setup)


def test_complexity_gpu_form_adds_gpu_timings_check_and_table(tmp_path):
    """The GPU form's code path, with the CPU standing in for the GPU."""
    from attnlab.lab.experiments import complexity

    measured = complexity.measure(True, 0, gpu=torch.device("cpu"))
    assert measured["gpu"] == "cpu" and set(measured["ms_gpu"]) == set(measured["ms"])
    report = complexity.write_up(measured, tmp_path, quick=True)
    assert report.verdict_reason.startswith("GPU: cpu, and the CPU")
    assert "On the GPU the wall times cross " in report.verdict_reason
    assert "faster than the recurrence at every n < d on every round: d = 32 " in (
        report.verdict_reason
    )
    assert len(report.thresholds) == 3 and report.metrics["gpu"] == "cpu"
    assert len(report.table("cost per layer against n, GPU").rows) == len(measured["ns"])
    assert set(report.metrics["crossover_ms_gpu"]) == {"32"}
    assert report.findings[-1].startswith("On the GPU (cpu) the wall times cross ")
    assert not any(s.startswith("CPU only") for s in report.setup)


def test_complexity_faster_below_d_and_crossing_text():
    from attnlab.lab.experiments.complexity import crossing_text, faster_below_d

    ns = [8, 16, 32, 64]
    m = {
        "ns": ns,
        "rounds": [0],
        "widths": [32],
        "ms_gpu": {("self-attention", 32): {0: [1, 1, 5, 9]}, ("recurrent", 32): {0: [2, 2, 4, 4]}},
    }
    assert faster_below_d(m) == {32: True}  # n = 8, 16 below d: 1 < 2 both times
    m["ms_gpu"][("self-attention", 32)][0][1] = 3
    assert faster_below_d(m) == {32: False}
    assert crossing_text({32: [math.inf]}, ns) == (
        "beyond n = 64 for d = 32 (attention faster at every n measured)"
    )
    assert crossing_text({32: [0.0]}, ns).startswith("below n = 8 for d = 32 (attention slower")
    assert crossing_text({32: [20.0, 30.0]}, ns) == "at n = 25 (20-30) for d = 32"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_complexity_gpu_form_on_cuda(tmp_path):
    report, _ = run_experiment("complexity", quick=True, out_dir=tmp_path)
    assert report.verdict_reason.startswith(f"GPU: {torch.cuda.get_device_name(0)}")
    assert report.table("cost per layer against n, GPU").rows
