"""kill -9 at three random moments of a tiny training (saving every step), each time resumed:
the finished run is bit-identical to an uninterrupted one (weights and losses)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

from attnlab.checkpoint import load_checkpoint, model_tensors
from attnlab.cli import main
from conftest import TINY

STEPS = 30
ARGS = ["--task", "reverse", "--max-len", "24", "--n-train", "64", "--n-val", "8", "--steps",
        str(STEPS), "--save-every", "1", "--keep-last", "2", "--eval-every", "0", "--log-every",
        "1", "--seed", "3", *TINY]  # fmt: skip


def _losses(run) -> dict[int, float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["train_loss"] for r in map(json.loads, lines)}


def _lines(run) -> int:
    """metrics.jsonl lines so far (read while the run writes: the last may be partial)."""
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def test_three_kill_9s_finish_bit_identical_to_an_uninterrupted_run(tmp_path, capsys):
    rng = random.Random(36)
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    assert main(["train", *ARGS, "--out", str(reference)]) == 0
    kills = 0
    for _ in range(3):
        cmd = [sys.executable, "-m", "attnlab", "train", *ARGS, "--out", str(killed), "--resume"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        start = _lines(killed)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:  # until it has trained
            if _lines(killed) > start:
                break
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.05))  # a random moment: a step, a save, a pointer update
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=30)
    assert kills == 3  # the run is long enough to be killed three times mid-way
    assert main(["train", *ARGS, "--out", str(killed), "--resume"]) == 0
    want, got = load_checkpoint(reference), load_checkpoint(killed)
    assert got.step == want.step == STEPS
    a, b = model_tensors(want.model)[0], model_tensors(got.model)[0]
    assert all(a[k].equal(b[k]) for k in a) and a.keys() == b.keys()
    assert _losses(killed) == _losses(reference)  # every step's loss, bit for bit
