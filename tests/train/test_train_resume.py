"""Resuming as promised: changed settings are named (and refused unless asked), log windows stay
exact, progress reaches a log file as it happens, a damaged latest checkpoint is skipped."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from attnlab.cli import main
from attnlab.errors import ConfigError
from attnlab.train import RunConfig, TrainConfig, train
from tiny_configs import tiny_config

TINY_S2S = tiny_config("encoder_decoder", max_len=24, dropout=0.1)
CLI_TINY = ["--task", "reverse", "--d-model", "16", "--n-heads", "2", "--n-layers", "1",
            "--d-ff", "32", "--max-len", "24", "--batch-size", "8", "--warmup-steps", "1",
            "--n-train", "200", "--n-val", "8", "--no-plots", "--threads", "1"]  # fmt: skip


def _cfg(**kw) -> RunConfig:
    train_cfg = dict(task="seq2seq", data="reverse", n_train=200, n_val=16, steps=6,
                     batch_size=8, warmup_steps=1, lr=3e-3, eval_every=0, save_every=0,
                     log_every=1, progress=False, threads=1)  # fmt: skip
    return RunConfig(TINY_S2S, TrainConfig(**{**train_cfg, **kw}))


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_resume_with_changed_settings_names_them_and_refuses_unless_asked(tmp_path):
    train(_cfg(), run_dir=tmp_path, stop_at=3)
    with pytest.raises(
        ConfigError, match=r"lr 0\.003 -> 0\.01; seed 1337 -> 7.*allow_changes=True"
    ):
        train(_cfg(lr=1e-2, seed=7), run_dir=tmp_path, resume=True)
    with pytest.raises(ConfigError, match=r"n_val 16 -> 12"):  # a different validation set
        train(_cfg(n_val=12), run_dir=tmp_path, resume=True)
    with pytest.warns(UserWarning, match=r"changed settings: lr 0\.003 -> 0\.01"):
        done = train(_cfg(lr=1e-2), run_dir=tmp_path, resume=True, allow_changes=True)
    assert done.start_step == 3 and done.step == 6
    with pytest.warns(UserWarning, match=r"steps 6 -> 8"):  # extending a run stays allowed
        assert train(_cfg(lr=1e-2, steps=8), run_dir=tmp_path, resume=True).step == 8


def test_cli_resume_with_a_changed_flag(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", *CLI_TINY, "--steps", "2", "--out", out, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["train", "--out", out, "--resume", "--steps", "3", "--lr", "0.5"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "lr 0.001 -> 0.5" in err and "--allow-changes" in err and "Traceback" not in err
    code = main(["train", "--out", out, "--resume", "--steps", "3", "--lr", "0.5",
                 "--allow-changes"])  # fmt: skip
    assert code == 0
    assert "attnlab: warning: resuming step_00000002 with changed settings" in (
        capsys.readouterr().err
    )


def test_log_windows_are_exact_across_a_resume(tmp_path):
    """log_every=4 and a resume at step 5: the line of step 8 averages steps 5..8 as straight."""
    cfg = _cfg(steps=8, log_every=4)
    train(cfg, run_dir=tmp_path / "a")
    train(cfg, run_dir=tmp_path / "b", stop_at=6)
    train(cfg, run_dir=tmp_path / "b", resume=True)
    straight, resumed = _records(tmp_path / "a"), _records(tmp_path / "b")
    assert [r["step"] for r in resumed] == [4, 8]
    assert [r["train_loss"] for r in resumed] == [r["train_loss"] for r in straight]
    assert not any("partial_window_steps" in r for r in resumed)


def test_a_resume_keeps_the_good_records_of_a_damaged_metrics_log(tmp_path):
    """Bytes that are not UTF-8 and lines that are not JSON (a damaged disk, an editor) in the
    log of an interrupted run: the resume keeps the good records up to its step, never a bare
    UnicodeDecodeError."""
    cfg = _cfg(steps=6)
    train(cfg, run_dir=tmp_path, stop_at=4)
    log = tmp_path / "metrics.jsonl"
    log.write_bytes(log.read_bytes() + b"\xff\xfe garbage\n[1, 2]\n")
    train(cfg, run_dir=tmp_path, resume=True)
    assert [r["step"] for r in _records(tmp_path)] == [1, 2, 3, 4, 5, 6]


def test_a_window_the_checkpoint_did_not_save_is_marked_partial(tmp_path):
    from attnlab.train.loop import LogWindow

    assert LogWindow.resumed(None, step=6, log_every=4).partial
    assert not LogWindow.resumed(None, step=8, log_every=4).partial
    window = LogWindow.resumed({"loss": 1.5, "steps": 2}, step=6, log_every=4)
    assert (window.loss, window.steps, window.partial) == (1.5, 2, False)
    partial = LogWindow(partial=True, loss=2.0, steps=2)
    assert partial.close()["partial_window_steps"] == 2


def test_no_progress_logs_each_evaluation_as_it_happens(tmp_path):
    """stdout to a file: the resume line and every evaluation are there while training runs."""
    out = tmp_path / "run"
    assert main(["train", *CLI_TINY, "--steps", "2", "--out", str(out), "--no-progress"]) == 0
    log = tmp_path / "log.txt"
    cmd = [
        sys.executable,
        "-m",
        "attnlab",
        "train",
        "--out",
        str(out),
        "--resume",
        "--steps",
        "100000",
        "--eval-every",
        "2",
        "--eval-batches",
        "1",
        "--no-progress",
    ]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while log.read_text().count("val_loss") < 2:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    lines = log.read_text().splitlines()
    assert any(line.startswith("resumed from") and "(step 2)" in line for line in lines)
    assert any(line.startswith("step 4: train_loss") and "val_loss" in line for line in lines)


def _tiny_lm_run(run_dir, steps=(1,)):
    from attnlab.checkpoint import save_checkpoint
    from attnlab.data import CharTokenizer
    from attnlab.models import build_model

    tok = CharTokenizer("abc ")
    cfg = tiny_config(vocab_size=tok.vocab_size)
    for step in steps:
        save_checkpoint(run_dir, model=build_model(cfg), config=cfg, tokenizer=tok, step=step)


def test_pointers_resolve_only_inside_their_own_run(tmp_path):
    import os

    from attnlab.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint

    _tiny_lm_run(tmp_path / "mine", steps=(1, 2))
    _tiny_lm_run(tmp_path / "other", steps=(9,))
    root = tmp_path / "mine" / "checkpoints"
    (root / "latest").write_text("../../other/checkpoints/step_00000009\n")
    with pytest.warns(UserWarning, match="not a checkpoint of this run"):
        assert latest_checkpoint(tmp_path / "mine") == root / "step_00000002"
    with pytest.warns(UserWarning, match="not a checkpoint of this run"):
        assert load_checkpoint(root / "latest").step == 2
    os.symlink(tmp_path / "other" / "checkpoints" / "step_00000009", root / "step_00000009")
    assert [p.name for p in list_checkpoints(tmp_path / "mine")] == [
        "step_00000001",
        "step_00000002",
    ]
    (root / "latest").write_text("step_00000009\n")  # a symlink out of the run
    with pytest.warns(UserWarning, match="not a checkpoint of this run"):
        assert load_checkpoint(tmp_path / "mine").step == 2
