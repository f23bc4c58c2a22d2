"""Interrupted training as a user meets it: SIGTERM saves and exits; kill -9 loses nothing saved."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from attnlab.checkpoint import latest_checkpoint, load_checkpoint
from attnlab.cli import main

ARGS = ["--task", "reverse", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff",
        "32", "--max-len", "24", "--batch-size", "8", "--warmup-steps", "1", "--n-train", "200",
        "--n-val", "8", "--eval-every", "0", "--log-every", "1", "--no-progress", "--no-plots",
        "--threads", "1", "--steps", "100000"]  # fmt: skip


def _start(out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "attnlab", "train", *ARGS, "--out", str(out), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"training exited early: {proc.communicate()[1]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("training did not get going in time")
        time.sleep(0.05)


def _logged_steps(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def test_sigterm_finishes_the_step_saves_and_exits_143(tmp_path, capsys):
    out = tmp_path / "run"
    proc = _start(out, "--save-every", "0")
    _wait_for(lambda: _logged_steps(out) >= 3, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert "stopped by SIGTERM" in stderr and "--resume" in stderr and "Traceback" not in stderr
    ckpt = load_checkpoint(out)
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    assert ckpt.step == last >= 3  # the step in progress was finished and saved
    code = main(["train", "--out", str(out), "--resume", "--steps", str(ckpt.step + 2)])
    assert code == 0 and load_checkpoint(out).step == ckpt.step + 2
    assert f"resumed from {ckpt.path}" in capsys.readouterr().out


def test_kill_9_never_corrupts_the_latest_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    proc = _start(out, "--save-every", "1", "--keep-last", "2")  # saving all the time
    _wait_for(lambda: (p := latest_checkpoint(out)) is not None and p.name >= "step_00000005", proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    ckpt = load_checkpoint(out)  # verifies every file against the manifest's SHA-256
    assert ckpt.step >= 5
    code = main(["train", "--out", str(out), "--resume", "--steps", str(ckpt.step + 1)])
    assert code == 0
    assert f"resumed from {ckpt.path}" in capsys.readouterr().out
    leftovers = [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # the next save cleaned up what the killed one left
