"""Experiment ``parallelism`` (quick form): no timing assertions (timing is noisy), only that the
report has its tables, columns and figures."""

from __future__ import annotations

from attnlab.lab import run_experiment
from attnlab.lab.experiments.parallelism import MODELS


def test_report_has_step_times_slopes_and_thread_speedups(tmp_path):
    report, readme = run_experiment("parallelism", quick=True, out_dir=tmp_path)
    steps = report.table("training-step time against sequence length").rows
    assert {r["model"] for r in steps} == set(MODELS)
    assert {"model", "B", "T", "ms / step (1 thread)", "tokens / s", "us / token"} <= set(steps[0])
    assert {r["B"] for r in steps} == {1, 2}
    assert all(r["ms / step (1 thread)"] > 0 for r in steps)
    growth = report.table("growth with T").rows
    assert {"parameters", "ms per extra position (slope)", "tokens/s at longest T"} <= set(
        growth[0]
    )
    threads = report.table("intra-op threads: speed-up of 2 threads over 1").rows
    assert {r["model"] for r in threads} == set(MODELS)
    assert all(v > 0 for vs in report.metrics["speedup"].values() for v in vs)
    for png in ("step_time.png", "throughput.png", "threads.png"):
        assert (tmp_path / png).is_file()
    assert report.competence == [] and report.seeds == [0]
    assert "attnlab experiment parallelism --quick" in readme.read_text()


def test_fused_rnn_lm_matches_the_elman_recurrence():
    import torch

    from attnlab.lab.experiments.parallelism import FusedRNNLM

    torch.manual_seed(0)
    model = FusedRNNLM(10, 6)
    ids = torch.randint(0, 10, (2, 5))
    x = model.embed(ids)  # (B, T, D)
    h = torch.zeros(2, 6)
    rnn = model.rnn
    for t in range(5):  # h_t = tanh(W h_{t-1} + U x_t + b)
        h = torch.tanh(
            x[:, t] @ rnn.weight_ih_l0.T + rnn.bias_ih_l0 + h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0
        )
    assert torch.allclose(model(ids).logits[:, -1], model.head(h), atol=1e-6)


def test_verdict_says_cpu_only_and_write_up_does_not_time(tmp_path, monkeypatch):
    import os

    from attnlab.lab.experiments import parallelism

    measured = parallelism.measure(True, 0)
    assert measured["logical_cores"] == os.cpu_count()

    def no_timing(*args, **kwargs):
        raise AssertionError("write_up must not time anything")

    monkeypatch.setattr(parallelism, "step_ms", no_timing)
    report = parallelism.write_up(measured, tmp_path, quick=True)
    assert report.verdict_reason.startswith("CPU only")
    assert report.arms == [] and report.competence == [] and report.thresholds
    assert any("no trained arms are compared" in s for s in report.setup)
    assert f"{os.cpu_count()} logical cores" in report.findings[-1]
