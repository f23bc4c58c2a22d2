"""``attnlab train`` / ``attnlab evaluate`` end to end, and every bad input of issue 4.

Each bad input must give a one-paragraph error naming the problem and the fix, a non-zero exit
code, no traceback, and must not damage anything saved before.
"""

from __future__ import annotations

import errno
import json
import shutil

import pytest

from attnlab.checkpoint import latest_checkpoint, load_checkpoint
from attnlab.cli import main
from attnlab.train import load_toml

TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32", "--max-len", "24",
        "--batch-size", "8", "--warmup-steps", "1", "--n-train", "200", "--n-val", "16",
        "--no-progress", "--no-plots", "--threads", "1"]  # fmt: skip


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _fails(capsys, *argv: str, match: str) -> str:
    code, _, err = _run(capsys, *argv)
    assert code != 0
    assert "Traceback" not in err
    assert match.lower() in " ".join(err.split()).lower(), err
    return err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 4-step reverse run with checkpoints at steps 2 and 4 (trained once)."""
    out = tmp_path_factory.mktemp("runs") / "run"
    code = main(["train", "--task", "reverse", "--steps", "4", "--save-every", "2",
                 "--eval-every", "2", "--out", str(out), *TINY])  # fmt: skip
    assert code == 0
    return out


@pytest.fixture
def run_dir(finished_run, tmp_path):
    """A private copy of the finished run, free to damage."""
    return shutil.copytree(finished_run, tmp_path / "run")


def test_train_then_evaluate_in_process(run_dir, capsys):
    assert {p.name for p in run_dir.iterdir()} >= {
        "checkpoints",
        "metrics.jsonl",
        "loss.png",
        "config.toml",
    }
    assert latest_checkpoint(run_dir).name == "step_00000004"
    code, out, _ = _run(
        capsys, "evaluate", "--checkpoint", str(run_dir), "--split", "test", "--json"
    )
    metrics = json.loads(out)
    assert code == 0 and metrics["step"] == 4
    assert {"test_loss", "test_ppl", "test_exact_match"} <= set(metrics)
    code, out, _ = _run(capsys, "evaluate", "--checkpoint", str(run_dir), "--examples", "2")
    assert code == 0 and "val_exact_match" in out and out.count("(reference") == 2


def test_config_round_trip_and_precedence(tmp_path, capsys):
    path = tmp_path / "run.toml"
    code, _, _ = _run(
        capsys, "train", "--preset", "dates", "--lr", "0.002", "--dump-config", str(path)
    )
    assert code == 0
    cfg = load_toml(path)
    assert cfg.train.lr == 0.002 and cfg.train.data == "dates" and cfg.model.d_model == 64
    again = tmp_path / "again.toml"
    code, _, _ = _run(
        capsys, "train", "--config", str(path), "--steps", "700", "--dump-config", str(again)
    )
    assert code == 0
    back = load_toml(again)
    assert back.train.steps == 700 and back.model == cfg.model  # flags override the file
    assert back.train.replace(steps=cfg.train.steps) == cfg.train


def test_unknown_toml_key_lists_the_valid_ones(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text("[train]\nlearning_rate = 0.1\n", encoding="utf-8")
    err = _fails(capsys, "train", "--config", str(path), match="unknown [train] key")
    assert "valid TrainConfig keys" in err and "warmup_steps" in err


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--lr", "-1"], "train.lr=-1.0 must be a finite number > 0"),
        (["--n-heads", "3"], "must be divisible by n_heads=3"),
        (["--set", "no_such_field=1"], "unknown setting 'no_such_field'"),
        (["--model-kind", "decoder_lm"], "cannot be trained on task 'seq2seq'"),
        (["--task", "nonsense"], "unknown --task 'nonsense'"),
        (["--preset", "nonsense"], "unknown preset 'nonsense'"),
    ],
)
def test_bad_config_values(tmp_path, capsys, flags, match):
    _fails(capsys, "train", "--task", "reverse", *TINY, "--out", str(tmp_path / "r"), *flags,
           match=match)  # fmt: skip


def test_missing_empty_and_undecodable_files(tmp_path, capsys):
    out = ["--out", str(tmp_path / "r"), *TINY]
    _fails(capsys, "train", "--text", str(tmp_path / "nope.txt"), *out, match="does not exist")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    _fails(capsys, "train", "--text", str(empty), *out, match="is empty")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\u00e9 au lait ".encode("latin-1") * 50)
    _fails(capsys, "train", "--text", str(latin), *out, match="is not valid UTF-8")
    _fails(capsys, "train", "--pairs", str(tmp_path / "none.tsv"), *out, match="does not exist")
    blank = tmp_path / "blank.csv"
    blank.write_text("text,label\n", encoding="utf-8")
    _fails(capsys, "train", "--labels", str(blank), *out, match="holds no examples")


def test_corrupt_and_truncated_checkpoints(run_dir, capsys):
    ckpt = latest_checkpoint(run_dir)
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    _fails(capsys, "evaluate", "--checkpoint", str(ckpt), match="is corrupt")
    weights.write_bytes(bytes(data[: len(data) // 2]))
    _fails(capsys, "evaluate", "--checkpoint", str(ckpt), match="truncated")
    older = load_checkpoint(run_dir / "checkpoints" / "step_00000002")  # earlier work intact
    assert older.step == 2
    code, out, err = _run(capsys, "train", "--out", str(run_dir), "--resume", "--steps", "6")
    assert code == 0 and "truncated" in err and "resuming from step_00000002" in err  # fallback
    assert (run_dir / "checkpoints" / "damaged-step_00000004" / "model.safetensors").is_file()
    _fails(capsys, "evaluate", "--checkpoint", str(run_dir / "nowhere"), match="no checkpoint")


def test_checkpoint_from_a_different_model(run_dir, capsys):
    err = _fails(capsys, "train", "--out", str(run_dir), "--resume", "--steps", "6",
                 "--d-model", "32", match="is from a different model")  # fmt: skip
    assert "d_model: checkpoint 16, config 32" in err
    _fails(capsys, "train", "--task", "reverse", "--out", str(run_dir), *TINY,
           match="already holds checkpoints")  # fmt: skip


def test_unwritable_run_directory(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory", encoding="utf-8")
    _fails(capsys, "train", "--task", "reverse", *TINY, "--out", str(blocker / "run"),
           match="could not create the directory")  # fmt: skip
    _fails(
        capsys,
        "train",
        "--task",
        "reverse",
        *TINY,
        "--out",
        str(blocker),
        match="is a file, not a directory",
    )


def test_full_disk_keeps_the_previous_checkpoint(run_dir, capsys, monkeypatch):
    import attnlab.checkpoint.save as checkpoint

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint, "write_synced", full)
    err = _fails(
        capsys,
        "train",
        "--out",
        str(run_dir),
        "--resume",
        "--steps",
        "6",
        match="no space left on the device",
    )
    assert "free some space" in err
    monkeypatch.undo()
    assert load_checkpoint(run_dir).step == 4  # the latest good checkpoint still loads
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".tmp")]


def test_language_model_on_a_text_file_then_a_test_file(tmp_path, capsys):
    text, other = tmp_path / "train.txt", tmp_path / "test.txt"
    text.write_text("a rose is a rose is a rose. " * 80, encoding="utf-8")
    other.write_text("is a rose a rose? " * 20, encoding="utf-8")
    out = tmp_path / "lm"
    code, stdout, _ = _run(
        capsys,
        "train",
        "--text",
        str(text),
        "--out",
        str(out),
        "--steps",
        "2",
        "--context-len",
        "16",
        *TINY,
    )
    assert code == 0 and "decoder_lm on task 'lm'" in stdout and "val_ppl" in stdout
    code, stdout, _ = _run(
        capsys,
        "evaluate",
        "--checkpoint",
        str(out),
        "--split",
        "test",
        "--text",
        str(other),
        "--json",
    )
    assert code == 0 and json.loads(stdout)["test_ppl"] > 1.0
    _fails(
        capsys, "evaluate", "--checkpoint", str(out), "--split", "test", match="needs its own text"
    )


def test_tensorboard_without_the_package_is_a_clear_error(tmp_path, capsys):
    pytest.importorskip("torch")
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        _fails(capsys, "train", "--task", "reverse", *TINY, "--steps", "2", "--tensorboard",
               "--out", str(tmp_path / "r"), match="needs the tensorboard package")  # fmt: skip
    else:
        code, _, _ = _run(
            capsys,
            "train",
            "--task",
            "reverse",
            *TINY,
            "--steps",
            "2",
            "--tensorboard",
            "--out",
            str(tmp_path / "r"),
        )
        assert code == 0 and (tmp_path / "r" / "tensorboard").is_dir()
