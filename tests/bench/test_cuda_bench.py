"""The CUDA benchmark script (benchmarks/cuda_bench.py), checked on the CPU at toy sizes.

Its timings mean nothing here (the figures in benchmarks/cuda/ come from a GPU); what is tested is
that every contender runs on the same batches, the report is written, the greedy tokens of attnlab
equal transformers' from the same weights (the premise of comparing their speeds), and that the
script refuses, with one clear line, to time a CPU or a missing GPU as if it were one.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cuda_bench.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600
    )


def test_tiny_run_times_every_contender_and_writes_the_report(tmp_path):
    run = _run("--device", "cpu", "--tiny", "--rounds", "1", "--min-round-s", "0.01",
               "--no-compile", "--out", str(tmp_path))  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads((tmp_path / "results.json").read_text())
    assert [row["shape"]["name"] for row in result["training"]] == ["nanogpt_char", "gpt2_small"]
    for row in result["training"]:
        assert set(row["contenders"]) == {
            f"{name}{bf16}"
            for name in ("attnlab", "hf_gpt2_sdpa", "torch_nn")
            for bf16 in ("", "_bf16")
        }
        assert all(c["tokens_per_s"] > 0 for c in row["contenders"].values())
        assert all(r > 0 for r in row["ratios"].values())
    generation = result["generation"]
    assert set(generation["contenders"]) == {"attnlab", "hf_gpt2"}
    assert generation["tokens_agree"] == {"attnlab": 1.0}
    report = (tmp_path / "RESULTS.md").read_text()
    assert "| attnlab_bf16 |" in report and "attnlab_vs_hf_gpt2:" in report


def test_refuses_to_time_the_cpu_at_full_size(tmp_path):
    run = _run("--device", "cpu", "--out", str(tmp_path))
    assert run.returncode == 2
    assert "attnlab bench" in run.stderr.splitlines()[-1]
    assert not (tmp_path / "results.json").exists()


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_says_how_to_run_it_without_a_gpu(tmp_path):
    run = _run("--out", str(tmp_path))
    assert run.returncode == 2
    assert "no CUDA device here" in run.stderr.splitlines()[-1]
