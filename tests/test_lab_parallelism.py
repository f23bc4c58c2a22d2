"""Experiment ``parallelism`` (quick form): no timing assertions (timing is noisy), only that the
report has its tables, columns and figures."""

from __future__ import annotations

from attnlab.lab import run_experiment
from attnlab.lab.parallelism import MODELS


def test_report_has_step_times_slopes_and_thread_speedups(tmp_path):
    report, readme = run_experiment("parallelism", quick=True, out_dir=tmp_path)
    steps = report.table("training-step time against sequence length").rows
    assert {r["model"] for r in steps} == set(MODELS)
    assert set(steps[0]) == {"model", "B", "T", "ms / step (1 thread)", "tokens / s", "us / token"}
    assert {r["B"] for r in steps} == {1, 2}
    assert all(r["ms / step (1 thread)"] > 0 for r in steps)
    growth = report.table("growth with T").rows
    assert {"parameters", "ms per extra position (slope)", "tokens/s at longest T"} <= set(
        growth[0]
    )
    threads = report.table("intra-op threads: 1 vs 2").rows
    assert all(r["speed-up"] > 0 for r in threads)
    assert (tmp_path / "step_time.png").is_file() and (tmp_path / "throughput.png").is_file()
    assert "attnlab experiment parallelism --quick" in readme.read_text()
