"""Every error hint names what a user can type on the command line."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from tiny_configs import tiny_config


def _error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err
    return err


def test_a_short_run_of_a_preset_suggests_warmup_steps(tmp_path, capsys):
    err = _error(capsys, "train", "--preset", "dates", "--steps", "20", "--out", str(tmp_path))
    assert "must not exceed steps=20; lower warmup_steps (e.g. to 2)" in err
    assert "(on the command line: --warmup-steps, --steps)" in err


def test_a_directory_without_text_files_names_the_suffixes(tmp_path, capsys):
    (tmp_path / "notes.csv").write_text("some text")
    err = _error(capsys, "train", "--text", str(tmp_path), "--out", str(tmp_path / "run"))
    assert "give the files one of these suffixes" in err


def test_too_little_text_names_the_flags(tmp_path, capsys):
    (tmp_path / "tiny.txt").write_text("just a few words of text here " * 3)
    err = _error(
        capsys, "train", "--text", str(tmp_path / "tiny.txt"), "--out", str(tmp_path / "run")
    )
    assert "--context-len" in err


def test_an_unknown_pair_file_suffix_says_rename(tmp_path, capsys):
    pairs = tmp_path / "pairs.dat"
    pairs.write_text("a\tb\n" * 20)
    err = _error(capsys, "train", "--pairs", str(pairs), "--out", str(tmp_path / "run"))
    assert "rename it to end in one of" in err


def test_unknown_characters_in_a_source_say_remove_them(tmp_path, capsys):
    from attnlab.checkpoint import save_checkpoint
    from attnlab.data import CharTokenizer
    from attnlab.models import build_model

    tok = CharTokenizer("abc ")
    cfg = tiny_config("encoder_decoder", vocab_size=tok.vocab_size)
    save_checkpoint(tmp_path / "run", model=build_model(cfg), config=cfg, tokenizer=tok, step=1)
    err = _error(capsys, "generate", "--checkpoint", str(tmp_path / "run"), "--source", "abz")
    assert "'z' at 2" in err and "remove them from the input" in err


@pytest.mark.parametrize("rank", ["0", "1"])
def test_under_torchrun_the_error_is_printed_once(tmp_path, capsys, monkeypatch, rank):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    assert main(["train", "--preset", "dates", "--steps", "20", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    if rank == "0":
        assert "--warmup-steps" in err and "ChildFailedError report below" in err
    else:
        assert err == ""
