"""Bad input at the command line, one table: each case gives the exact exit code (2: a user
error), prints no traceback, names the fix, and changes no file outside its run directory."""

from __future__ import annotations

import os

import pytest

from attnlab.cli import main
from conftest import TINY, snapshot

# (case id, argv, run directory the command may write, exit code, words of the fix: one string
# or several, e.g. the field a library message names and the flag the CLI's hint adds)
CASES = [
    ("train into a directory with the user's files",
     ["train", "--text", "text.txt", "--steps", "2", "--out", "mine", *TINY], "mine", 2,
     ("pass overwrite=True", "--overwrite")),
    ("train over another run's config.toml",
     ["train", "--task", "reverse", "--steps", "2", "--out", "other", *TINY], "other", 2,
     ("pass overwrite=True", "--overwrite")),
    ("--set kind=masked_lm with --text",
     ["train", "--set", "kind=masked_lm", "--text", "text.txt", "--out", "k", *TINY], "k", 2,
     ("kind='decoder_lm'", "--model-kind")),
    ("--set kind=encoder_decoder with --text",
     ["train", "--set", "kind=encoder_decoder", "--text", "text.txt", "--out", "k", *TINY], "k",
     2, ("kind='decoder_lm'", "--model-kind")),
    ("--set kind=classifier with --text",
     ["train", "--set", "kind=classifier", "--text", "text.txt", "--out", "k", *TINY], "k", 2,
     ("kind='decoder_lm'", "--model-kind")),
    ("--d-model 1000000", ["train", "--task", "reverse", "--d-model", "1000000", "--out", "big"],
     "big", 2, "make it smaller"),
    ("--config given a directory", ["train", "--config", "lm", "--out", "c"], "c", 2,
     "give the TOML file itself"),
    ("--dump-config given a directory",
     ["train", "--task", "reverse", "--dump-config", "lm"], None, 2, "give a file name"),
    ("/dev/null as --text", ["train", "--text", "/dev/null", "--out", "n", *TINY], "n", 2,
     "give a text file"),
    ("a FIFO as --text", ["train", "--text", "pipe.txt", "--out", "n", *TINY], "n", 2,
     "give a text file"),
    ("--best-metric accuracy with --text",
     ["train", "--text", "text.txt", "--best-metric", "accuracy", "--out", "b", *TINY], "b", 2,
     ("best_metric='val_ppl'", "--best-metric")),
    ("--weight-decay inf", ["train", "--task", "reverse", "--weight-decay", "inf", "--out", "w"],
     "w", 2, "finite number"),
    ("--set norm_eps=nan", ["train", "--task", "reverse", "--set", "norm_eps=nan", "--out", "w"],
     "w", 2, "finite number"),
    ("--set rope_base=nan", ["train", "--task", "reverse", "--set", "rope_base=nan", "--out", "w"],
     "w", 2, "finite number"),
    ("--set ffn_mult=nan", ["train", "--task", "reverse", "--set", "ffn_mult=nan", "--out", "w"],
     "w", 2, "finite number"),
    ("--resume --allow-changes with a new tokenizer",
     ["train", "--out", "lm", "--resume", "--allow-changes", "--tokenizer", "byte", "--steps",
      "6"], "lm", 2, ("keep those settings", "--tokenizer")),
    ("evaluate an LM with --pairs", ["evaluate", "--checkpoint", "lm", "--pairs", "text.txt"],
     None, 2, ("give the model data of its own task", "--text")),
    ("evaluate an LM with --labels", ["evaluate", "--checkpoint", "lm", "--labels", "text.txt"],
     None, 2, ("give the model data of its own task", "--text")),
    ("evaluate an LM on a text shorter than its context",
     ["evaluate", "--checkpoint", "lm", "--text", "mine/notes.txt"], None, 2,
     ("'mine/notes.txt' has", "give a longer text file")),
    ("evaluate --device foo", ["evaluate", "--checkpoint", "lm", "--device", "foo"], None, 2,
     "'cpu'"),
    ("generate --temperature 1e-45",
     ["generate", "--checkpoint", "lm", "--prompt", "the", "--temperature", "1e-45"], None, 2,
     "use 0"),
    ("generate --length-penalty 1e308",
     ["generate", "--checkpoint", "s2s", "--source", "abc", "--beams", "2", "--length-penalty",
      "1e308"], None, 2, "must be between"),
    ("plot positions of 1e5 x 1e5",
     ["plot", "positions", "--d-model", "100000", "--max-len", "100000", "--out", "pe.png"],
     None, 2, "lower --d-model or --max-len"),
    ("experiment over a directory of the user's files",
     ["experiment", "order", "--quick", "--out", "mine"], None, 2, "choose a new or empty --out"),
    ("export --force into a run directory",
     ["export", "--checkpoint", "lm", "--format", "hf-gpt2", "--out", "s2s", "--force"], None, 2,
     "choose a new --out"),
    ("export --force over the user's files",
     ["export", "--checkpoint", "lm", "--format", "hf-gpt2", "--out", "mine", "--force"], None, 2,
     "choose a new or empty --out"),
    ("export --force of safetensors over the user's notes.txt",
     ["export", "--checkpoint", "lm", "--format", "safetensors", "--out", "mine/notes.txt",
      "--force"], None, 2, "name it 'mine/notes.safetensors'"),
    ("export into a directory holding a config.toml",
     ["export", "--checkpoint", "lm", "--format", "hf-gpt2", "--out", "other"], None, 2,
     "looks like a training run directory (it holds config.toml)"),
    ("plot positions over the user's file",
     ["plot", "positions", "--out", "mine/notes.txt"], None, 2, "choose a new or empty --out"),
    ("NaN in Hugging Face weights: evaluate",
     ["evaluate", "--checkpoint", "hf-nan", "--text", "text.txt"], None, 2,
     "export or download the model again"),
    ("NaN in Hugging Face weights: generate",
     ["generate", "--checkpoint", "hf-nan", "--prompt", "the"], None, 2,
     "export or download the model again"),
    ("a Hugging Face config asking for 1e6 width and 1e9 tokens",
     ["generate", "--checkpoint", "hf-huge", "--prompt", "the"], None, 2, "make it smaller"),
    ("a Hugging Face directory without its tokenizer",
     ["generate", "--checkpoint", "hf-no-tokenizer", "--prompt", "the"], None, 2,
     "copy the tokenizer file"),
    ("bench --memory-cap-gib nan", ["bench", "--memory-cap-gib", "nan"], None, 2,
     "finite number > 0"),
    ("--dump-config over the user's file",
     ["train", "--task", "reverse", "--dump-config", "mine/notes.txt"], None, 2,
     "add --overwrite to replace it"),
    ("--allow-changes without --resume",
     ["train", "--text", "text.txt", "--allow-changes", "--out", "ac", *TINY], "ac", 2,
     "add --resume"),
    ("--freeze without --init-from",
     ["train", "--text", "text.txt", "--freeze", "embeddings", "--out", "fz", *TINY], "fz", 2,
     "add --init-from MODEL"),
    ("generate --length-penalty without --beams",
     ["generate", "--checkpoint", "lm", "--prompt", "the", "--length-penalty", "2"], None, 2,
     "act only in beam search; set num_beams > 1"),
    ("generate --early-stopping without --beams",
     ["generate", "--checkpoint", "s2s", "--source", "abc", "--early-stopping"], None, 2,
     "act only in beam search; set num_beams > 1"),
    ("evaluate --examples -3", ["evaluate", "--checkpoint", "lm", "--examples", "-3"], None, 2,
     "must be >= 0"),
    ("generate from ./missing (a relative path, not a hub id)",
     ["generate", "--checkpoint", "./missing", "--prompt", "the"], None, 2,
     "no checkpoint at './missing': the path does not exist"),
    ("evaluate ./missing", ["evaluate", "--checkpoint", "./missing"], None, 2,
     "no checkpoint at './missing'"),
    ("plot positions into a directory", ["plot", "positions", "--out", "mine"], None, 2,
     "is a directory; give the figure's file name"),
    ("experiment --list of an unknown name", ["experiment", "nosuch", "--list"], None, 2,
     "choose one of"),
]  # fmt: skip


def run_cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse's usage errors
        return int(stop.code)


@pytest.mark.parametrize(("argv", "run_dir", "code", "fix"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_bad_input_is_one_clear_error(workspace, capsys, argv, run_dir, code, fix):
    (workspace / "mine").mkdir()
    (workspace / "mine" / "notes.txt").write_text("my notes")
    os.mkfifo(workspace / "pipe.txt")  # reading it would block forever
    (workspace / "other").mkdir()
    (workspace / "other" / "config.toml").write_text((workspace / "lm" / "config.toml").read_text())
    skip = workspace / run_dir if run_dir else None
    before = snapshot(workspace, skip)
    assert run_cli(argv) == code
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err
    for words in (fix,) if isinstance(fix, str) else fix:
        assert words in err, err
    assert snapshot(workspace, skip) == before  # nothing outside the run directory changed
    if run_dir in ("mine", "other"):  # and the user's own files inside it neither
        assert sorted(p.name for p in (workspace / run_dir).iterdir()) in (
            ["notes.txt"], ["config.toml"])  # fmt: skip


def test_overwrite_trains_into_it_and_leaves_other_files_alone(workspace, capsys):
    (workspace / "mine").mkdir()
    (workspace / "mine" / "notes.txt").write_text("my notes")
    argv = ["train", "--text", "text.txt", "--steps", "2", "--out", "mine", "--overwrite", *TINY]
    assert main(argv) == 0
    assert (workspace / "mine" / "notes.txt").read_text() == "my notes"
    assert (workspace / "mine" / "checkpoints" / "latest").is_file()


def test_a_restart_of_the_same_run_is_allowed(workspace, capsys):
    """A run killed before its first checkpoint: the same command starts it again."""
    argv = ["train", "--text", "text.txt", "--steps", "2", "--out", "again", *TINY]
    assert main(argv) == 0
    import shutil

    shutil.rmtree(workspace / "again" / "checkpoints")
    assert main(argv) == 0


def test_sampling_several_seq2seq_outputs_prints_the_seed(workspace, capsys):
    argv = ["generate", "--checkpoint", "s2s", "--source", "abc", "--num-samples", "2"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "pass --seed" in err and "Traceback" not in err


def test_resume_without_config_toml_uses_the_checkpoint_settings(workspace, capsys):
    (workspace / "lm" / "config.toml").unlink()
    assert main(["train", "--out", "lm", "--resume", "--steps", "6"]) == 0
    captured = capsys.readouterr()
    assert "config.toml' is missing; resuming with the settings saved in" in captured.err
    assert "resumed from" in captured.out and (workspace / "lm" / "config.toml").is_file()


def test_allow_changes_with_new_text_encodes_the_new_text(workspace, capsys):
    (workspace / "other.txt").write_text("a different text with other words in it. " * 80)
    argv = ["train", "--out", "lm", "--resume", "--allow-changes", "--text", "other.txt",
            "--steps", "6"]  # fmt: skip
    assert main(argv) == 0
    import json

    stamp = json.loads((workspace / "lm" / "data" / "corpus" / "source.json").read_text())
    assert stamp["data"] == str((workspace / "other.txt").resolve())
    n = json.loads((workspace / "lm" / "data" / "corpus" / "meta.json").read_text())["n_tokens"]
    assert n >= len("a different text with other words in it. " * 80)


def test_export_force_replaces_exactly_its_own_earlier_export(workspace, capsys):
    from attnlab.cli.outputs import files_in, record

    argv = ["export", "--checkpoint", "lm", "--format", "hf-gpt2", "--out", "hf2"]
    assert main(argv) == 0
    before = files_in(workspace / "hf2")
    assert "merges.txt" not in before  # a char-level export has no BPE merges
    (workspace / "hf2" / "merges.txt").write_text("#v2\n")  # as an earlier BPE export left it
    record(workspace / "hf2", before)
    assert main(argv) == 2  # without --force nothing is replaced
    assert main([*argv, "--force"]) == 0
    assert not (workspace / "hf2" / "merges.txt").exists()  # no stale tokenizer file left behind
    assert set(files_in(workspace / "hf2")) == set(before)


def test_plot_may_replace_its_own_earlier_figure(workspace, capsys):
    argv = ["plot", "positions", "--d-model", "8", "--max-len", "8", "--out", "pe.png"]
    assert main(argv) == 0 and main(argv) == 0
    (workspace / "pe.png").write_bytes(b"edited by hand")
    assert main(argv) == 2 and (workspace / "pe.png").read_bytes() == b"edited by hand"


@pytest.mark.parametrize("checkpoint", ["hf", "lm.safetensors"])
def test_exports_are_read_back_by_generate(workspace, capsys, checkpoint):
    """An HF directory with attnlab's char tokenizer, and a single-file safetensors export."""
    argv = ["generate", "--checkpoint", checkpoint, "--prompt", "the", "--temperature", "0",
            "--max-new-tokens", "4"]  # fmt: skip
    assert main(argv) == 0
    assert main(["generate", "--checkpoint", "lm", *argv[3:]]) == 0
    ours, theirs = capsys.readouterr().out.splitlines()[-2:]
    assert ours == theirs  # the same greedy text as the run it was exported from


def test_evaluate_names_the_file_and_warns_when_it_is_mostly_unknown(workspace, capsys):
    (workspace / "oov.txt").write_text("日本語のテキスト。" * 40 + "the cat\n")
    assert main(["evaluate", "--checkpoint", "lm", "--text", "oov.txt"]) == 0
    captured = capsys.readouterr()
    assert "tokens of 'oov.txt'" in captured.out and "training" not in captured.out
    err = " ".join(captured.err.split())
    assert "of the tokens of 'oov.txt' are <unk>" in err and "say little about the model" in err
    assert main(["evaluate", "--checkpoint", "lm", "--text", "text.txt"]) == 0
    assert "<unk>" not in capsys.readouterr().err  # the model's own alphabet: no warning


def test_plot_attention_names_unknown_input_characters(workspace, capsys):
    argv = ["plot", "attention", "--checkpoint", "lm", "--input", "ZZ日 the", "--out", "maps"]
    assert main(argv) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "--input has characters the tokenizer does not know: 'Z', '日'" in err
