"""A run directory on a file system that fills up (a real 60 KB tmpfs): one clear error, exit 2.

Mounting needs root and a kernel that allows it (CI's machines do); elsewhere the test skips and
says so. The other storage failures (read-only, damaged files) are in test_damage.py.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from attnlab.cli import main


@pytest.fixture
def tiny_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a 60 KB tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=60k", "tmpfs", str(mount)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_is_one_clear_error(tiny_disk, capsys):
    argv = ["train", "--preset", "dates", "--steps", "4", "--warmup-steps", "1", "--eval-every",
            "0", "--n-train", "200", "--n-val", "20", "--no-progress", "--no-plots",
            "--out", str(tiny_disk / "run")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "free some space" in err
    assert "Traceback" not in err
    assert not any(p.name.startswith("step_") for p in (tiny_disk / "run").rglob("*"))
