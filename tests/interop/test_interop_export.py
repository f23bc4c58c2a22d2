"""``attnlab export`` never overwrites by accident and never writes inside a checkpoint."""

from __future__ import annotations

import pytest

from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.cli.outputs import recorded
from attnlab.data import CharTokenizer
from attnlab.errors import ConfigError
from attnlab.interop import export_as, load_checkpoint
from attnlab.models import build_model
from tiny_configs import tiny_config


@pytest.fixture
def run(tmp_path):
    tok = CharTokenizer("abc ")
    cfg = tiny_config(vocab_size=tok.vocab_size)
    save_checkpoint(tmp_path / "run", model=build_model(cfg), config=cfg, tokenizer=tok, step=1)
    return tmp_path / "run"


def test_an_existing_file_is_replaced_only_with_force(run, tmp_path, capsys):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"precious")
    args = ["export", "--checkpoint", str(run), "--format", "safetensors", "--out", str(target)]
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "already exists; pass force=True" in err and "(on the command line: --force" in err
    assert target.read_bytes() == b"precious"
    assert main([*args, "--force"]) == 2  # --force replaces attnlab's own exports, not this
    assert "attnlab did not write" in " ".join(capsys.readouterr().err.split())
    assert target.read_bytes() == b"precious"
    target.unlink()
    assert main(args) == 0
    first = target.read_bytes()
    assert main(args) == 2 and main([*args, "--force"]) == 0  # an earlier export: replaced
    assert len(target.read_bytes()) == len(first)
    assert "model.safetensors" in recorded(tmp_path)  # the manifest of what export wrote


@pytest.mark.parametrize("where", ["checkpoint", "checkpoints", "hf-dir"])
def test_never_inside_a_checkpoint_directory_even_with_force(run, capsys, where):
    ckpt = load_checkpoint(run).path
    before = (ckpt / "model.safetensors").read_bytes()
    fmt, out = "safetensors", ckpt / "model.safetensors"
    if where == "checkpoints":
        out = ckpt.parent / "export.safetensors"
    elif where == "hf-dir":
        fmt, out = "hf-gpt2", ckpt
    argv = ["export", "--checkpoint", str(run), "--format", fmt, "--out", str(out), "--force"]
    assert main(argv) == 2
    assert "inside the checkpoint directory" in " ".join(capsys.readouterr().err.split())
    assert (ckpt / "model.safetensors").read_bytes() == before
    load_checkpoint(run)  # still verifies against its manifest


def test_hf_export_into_a_non_empty_directory_needs_force(run, tmp_path):
    ckpt = load_checkpoint(run)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists; pass force=True"):
        export_as(ckpt.model, "hf-gpt2", out, tokenizer=ckpt.tokenizer)
    export_as(ckpt.model, "hf-gpt2", out, tokenizer=ckpt.tokenizer, force=True)
    assert (out / "config.json").is_file() and (out / "notes.txt").read_text() == "mine"
