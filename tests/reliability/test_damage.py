"""Every way a checkpoint can be incomplete is found by one check, named by every command that
reads the run (train --resume, evaluate, generate), and kept as damaged-step_* on resume, never
trained over."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from attnlab.checkpoint import load_checkpoint
from attnlab.checkpoint.rundir import damage_of
from attnlab.cli import main


def _damage(ckpt, how: str) -> str:
    """Damage ``ckpt`` one way; returns the words the report names it by."""
    if how == "missing manifest":
        (ckpt / "manifest.json").unlink()
        return "'manifest.json' is missing"
    if how == "missing weights":
        (ckpt / "model.safetensors").unlink()
        return "'model.safetensors' is missing"
    if how == "directory weights":
        (ckpt / "model.safetensors").unlink()
        (ckpt / "model.safetensors").mkdir()
        return "'model.safetensors' is a directory"
    if how == "missing tokenizer":
        (ckpt / "tokenizer.json").unlink()
        return "tokenizer.json' is missing"
    (ckpt.parent / "latest").write_text("step_00000002\n")  # a save that did not finish
    return "newer than step_00000002"


KINDS = ["missing manifest", "missing weights", "directory weights", "missing tokenizer",
         "pointer to an older step"]  # fmt: skip


def _digest(path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.fixture(params=KINDS)
def damaged(request, workspace):
    step4 = workspace / "s2s" / "checkpoints" / "step_00000004"
    words = _damage(step4, request.param)
    return workspace / "s2s", step4, words, request.param


def test_the_structural_check_names_each_kind(damaged):
    run, step4, words, how = damaged
    if how in ("missing manifest", "missing weights", "directory weights"):
        assert words in damage_of(step4)
    else:  # caught by the manifest (a listed file) or by the pointer
        assert damage_of(step4) is None


@pytest.mark.parametrize("command", ["evaluate", "generate"])
def test_readers_report_it_and_use_the_newest_good_checkpoint(damaged, capsys, command):
    run, step4, words, how = damaged
    argv = ["evaluate", "--checkpoint", str(run), "--max-batches", "1"]
    if command == "generate":
        argv = ["generate", "--checkpoint", str(run), "--source", "abc", "--temperature", "0"]
    before = _digest(step4)
    assert main(argv) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "step_00000004" in err and words in err and "Traceback" not in err
    assert _digest(step4) == before  # reading changes nothing


def test_resume_keeps_the_damage_aside_and_never_trains_over_it(damaged, capsys):
    run, step4, words, how = damaged
    before = _digest(step4)
    assert main(["train", "--out", str(run), "--resume", "--steps", "6"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert words in err and "kept as" in err and "Traceback" not in err
    kept = run / "checkpoints" / "damaged-step_00000004"
    assert _digest(kept) == before  # kept byte for byte
    assert load_checkpoint(run).step == 6
    assert load_checkpoint(run / "checkpoints" / "step_00000004").step == 4  # the step again


def test_a_run_with_only_damaged_checkpoints_is_not_trained_over(workspace, capsys):
    run = workspace / "s2s"
    for step in ("step_00000002", "step_00000004"):
        _damage(run / "checkpoints" / step, "missing manifest")
    (run / "checkpoints" / "latest").unlink()
    before = _digest(run / "checkpoints")
    config = ["--config", str(run / "config.toml")]
    for extra in ([], ["--resume"]):
        assert main(["train", "--out", str(run), "--steps", "6", *config, *extra]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "only incomplete checkpoints" in err and "choose a new out directory" in err
    assert _digest(run / "checkpoints") == before
    shutil.rmtree(run / "checkpoints")  # the fix the message names
    assert main(["train", "--out", str(run), "--steps", "2", *config]) == 0


def test_a_checkpoint_retired_while_it_is_read_is_not_called_damage(tmp_path, monkeypatch):
    """A reader of a run that is saving with --keep-last 1: the checkpoint it resolved may be
    retired (moved away, then deleted) before it reads it; it then reads the new latest."""
    import warnings

    import attnlab.checkpoint.load as loading
    from attnlab.checkpoint import save_checkpoint
    from attnlab.data import CharTokenizer
    from attnlab.models import build_model
    from tiny_configs import tiny_config

    tok = CharTokenizer("abc ")
    cfg = tiny_config("decoder_lm", vocab_size=tok.vocab_size)
    model = build_model(cfg)
    for step in (1, 2):
        save_checkpoint(tmp_path, model=model, config=cfg, tokenizer=tok, step=step, keep_last=0)
    real, seen = loading._load_one, []

    def racing(ckpt, *args):
        if not seen:  # the trainer saves step 3 and retires step 2 just as we start reading
            seen.append(ckpt.name)
            save_checkpoint(tmp_path, model=model, config=cfg, tokenizer=tok, step=3, keep_last=1)
        return real(ckpt, *args)

    monkeypatch.setattr(loading, "_load_one", racing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "cannot be used" warning: nothing is damaged
        got = load_checkpoint(tmp_path)
    assert seen == ["step_00000002"] and got.step == 3
    assert not list(tmp_path.glob("checkpoints/damaged-*"))


def test_ctrl_c_while_the_commands_import_is_one_line(monkeypatch, capsys):
    import attnlab.cli as cli

    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    assert main(["train", "--help"]) == 130
    err = capsys.readouterr().err
    assert err == "attnlab: interrupted\n"
