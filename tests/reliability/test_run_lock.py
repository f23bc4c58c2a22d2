"""One training per run directory: a second process is refused naming the holder's PID, the lock
goes with its holder (however it ends), and a stale lock file is reported and taken over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from attnlab.checkpoint import load_checkpoint
from attnlab.cli import main
from attnlab.train.lock import LOCK_FILE, RunLockedError, run_lock
from conftest import TINY

LONG = ["--task", "reverse", "--max-len", "24", "--n-train", "64", "--n-val", "8", "--steps",
        "100000", "--save-every", "0", "--eval-every", "0", "--log-every", "1"]  # fmt: skip


def _train(out, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "attnlab", "train", *LONG, *TINY, "--out", str(out), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(out, proc, n: int = 2, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    metrics = out / "metrics.jsonl"
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= n):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "training did not get going in time"
        time.sleep(0.05)


def test_a_second_training_process_is_refused_naming_the_first(tmp_path):
    out = tmp_path / "run"
    first = _train(out)
    try:
        _wait_for_steps(out, first)
        second = _train(out, "--resume")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        flat = " ".join(err.split())
        assert f"process {first.pid}" in flat and "another out directory" in flat
        assert "(on the command line: --out)" in flat
        assert "Traceback" not in err
        assert first.poll() is None  # the first run goes on untouched
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 143
    assert not (out / LOCK_FILE).exists()  # released on exit
    step = load_checkpoint(out).step  # and the next process may take the lock
    assert main(["train", "--out", str(out), "--resume", "--steps", str(step + 1)]) == 0


def test_the_lock_is_held_in_process_and_released_after(tmp_path):
    with run_lock(tmp_path / "run") as path:
        assert path.read_text().split()[0] == str(os.getpid())
        with pytest.raises(RunLockedError, match=f"process {os.getpid()}"), run_lock(path.parent):
            pass
    assert not path.exists()
    with run_lock(tmp_path / "run"):  # free again
        pass


def test_the_lock_holder_removes_the_write_probes_of_a_killed_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".write-probe-k1ll3d").touch()  # killed between ensure_writable_dir's create and unlink
    (run / ".write-probe-dir").mkdir()  # not a probe (probes are files): left alone
    with run_lock(run):
        assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE, ".write-probe-dir"]


def test_a_stale_lock_of_a_dead_process_is_reported_and_taken_over(tmp_path, capsys):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text(f"{dead} {os.uname().nodename}\n")
    argv = ["train", "--task", "reverse", "--max-len", "24", "--n-train", "64", "--n-val", "8",
            "--steps", "2", "--out", str(out), *TINY]  # fmt: skip
    assert main(argv) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"names process {dead}, which is no longer running" in err
    assert not (out / LOCK_FILE).exists()
