"""Experiment ``parallelism`` (quick form): no timing assertions (timing is noisy), only that the
report has its tables, columns and figures."""

from __future__ import annotations

import pytest
import torch

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


def test_gpu_form_adds_gpu_timings_checks_tables_and_figure(tmp_path):
    """The GPU form's code path, with the CPU standing in for the GPU (the real one runs in
    test_gpu_form_on_cuda where a GPU is present)."""
    import torch

    from attnlab.lab.experiments import parallelism

    measured = parallelism.measure(True, 0, gpu=torch.device("cpu"))
    assert measured["gpu"] == "cpu"
    lengths, batches = measured["lengths"], measured["batches"]
    for name in MODELS:
        for b in batches:
            for t in lengths:
                assert measured["ms"][(name, b, parallelism.GPU, t)][0] > 0
    report = parallelism.write_up(measured, tmp_path, quick=True)
    assert report.verdict_reason.startswith("GPU: cpu, and the CPU")
    assert "; GPU: fused RNN" in report.verdict_reason
    gpu_checks = [k for k in parallelism.checks(measured) if k.startswith("GPU: ")]
    assert len(gpu_checks) == 3 and all(k in report.verdict_reason for k in gpu_checks)
    rows = report.table("training-step time against sequence length, GPU").rows
    assert len(rows) == len(MODELS) * len(batches) * len(lengths)
    assert all(r["ms / step (GPU)"] > 0 for r in rows)
    assert report.table("growth with T, GPU").rows
    assert (tmp_path / "step_time_gpu.png").is_file()
    assert not any(s.startswith("CPU only") for s in report.setup)
    assert report.findings[-2].startswith("On the GPU (cpu), at B = 1")
    assert sum(", GPU, T=" in k for k in report.per_seed["ms"]) == len(rows)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_form_on_cuda(tmp_path):
    report, _ = run_experiment("parallelism", quick=True, out_dir=tmp_path)
    name = torch.cuda.get_device_name(0)
    assert report.verdict_reason.startswith(f"GPU: {name}")
    assert report.machine["gpu"] == name
    assert report.table("training-step time against sequence length, GPU").rows
