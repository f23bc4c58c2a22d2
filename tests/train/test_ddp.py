"""Two-process DistributedDataParallel (gloo, CPU) matches one process with the same global batch.

``torchrun --nproc_per_node 2`` with batch 4 per process must follow the loss curve of a single
process with batch 8: the data layer gives the two ranks the two halves of the single process's
batch (``attnlab.train.task_data``), both start from the same seed, and DDP averages gradients
of per-rank losses that the loop scales to the global mean. The only difference is the order of
floating-point additions (two partial sums, then an all-reduce, instead of one sum), which moves
float32 results by a few ulps per step. Over 6 steps of a tiny model that stays below 1e-5
relative; a data or scaling bug would show up as an O(1e-2) difference from the first step.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from attnlab.cli import main

STEPS = 6
TOLERANCE = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(text: str, out, batch: int) -> list[str]:
    return [
        "train",
        "--text",
        text,
        "--out",
        str(out),
        "--steps",
        str(STEPS),
        "--warmup-steps",
        "2",
        "--d-model",
        "16",
        "--n-heads",
        "2",
        "--n-layers",
        "1",
        "--d-ff",
        "32",
        "--context-len",
        "16",
        "--max-len",
        "16",
        "--batch-size",
        str(batch),
        "--eval-every",
        "3",
        "--eval-batches",
        "2",
        "--log-every",
        "1",
        "--no-progress",
        "--no-plots",
        "--threads",
        "1",
    ]


def _curve(out, key: str = "train_loss") -> list[float]:
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in records if key in r]


def test_two_processes_match_one_with_the_same_global_batch(tmp_path):
    text = tmp_path / "text.txt"
    words = [
        "to",
        "be",
        "or",
        "not",
        "to",
        "be",
        "that",
        "is",
        "the",
        "question",
        "whether",
        "tis",
        "nobler",
        "in",
        "the",
        "mind",
    ]
    text.write_text(" ".join(words[(i * 5) % len(words)] for i in range(2000)), encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
        "-m",
        "attnlab",
        *_args(str(text), tmp_path / "ddp", 4),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("attnlab train:") == 1  # only rank 0 reports and writes
    assert main(_args(str(text), tmp_path / "single", 8)) == 0
    ddp, single = _curve(tmp_path / "ddp"), _curve(tmp_path / "single")
    assert len(ddp) == len(single) == STEPS
    assert ddp == pytest.approx(single, rel=TOLERANCE)
    assert _curve(tmp_path / "ddp", "val_loss") == pytest.approx(
        _curve(tmp_path / "single", "val_loss"), rel=TOLERANCE
    )
    assert ddp[-1] < ddp[0]  # and it is learning
