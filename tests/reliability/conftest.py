"""The bad-input suite's shared pieces: the tests/ helpers on the path, tiny trained runs (trained
once per session, copied per test) and the check every case makes."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tiny_configs and friends

TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32", "--batch-size",
        "4", "--warmup-steps", "1", "--eval-batches", "1", "--no-progress", "--no-plots",
        "--threads", "1"]  # fmt: skip
TEXT = "the cat sat on the mat and the dog ran far away from the big red barn. " * 60


def snapshot(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Every file under ``root`` (but not under ``skip``) with the SHA-256 of its bytes."""
    found = {}
    for p in sorted(root.rglob("*")):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        if p.is_file() and not p.is_symlink():
            found[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return found


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory):
    """A tiny LM run (steps 2, 4) and a tiny seq2seq run (steps 2, 4), trained once."""
    from attnlab.cli import main

    root = tmp_path_factory.mktemp("reliability-runs")
    (root / "text.txt").write_text(TEXT)
    saves = ["--steps", "4", "--save-every", "2", "--keep-last", "0"]  # two checkpoints each
    lm = ["train", "--text", str(root / "text.txt"), "--context-len", "16", "--max-len", "32",
          *saves, "--out", str(root / "lm")]  # fmt: skip
    s2s = ["train", "--task", "reverse", "--max-len", "24", "--n-train", "64", "--n-val", "8",
           *saves, "--out", str(root / "s2s")]  # fmt: skip
    for argv in (lm, s2s):
        assert main([*argv, *TINY]) == 0
    for fmt, out in (("hf-gpt2", "hf"), ("safetensors", "lm.safetensors")):
        assert main(["export", "--checkpoint", str(root / "lm"), "--format", fmt, "--out",
                     str(root / out)]) == 0  # fmt: skip
    shutil.copytree(root / "hf", root / "hf-no-tokenizer")
    for name in ("attnlab_tokenizer.json", "tokenizer.json", "tokenizer_config.json"):
        (root / "hf-no-tokenizer" / name).unlink(missing_ok=True)  # every tokenizer file
    _nan_copy(root / "hf", root / "hf-nan")
    shutil.copytree(root / "hf", root / "hf-huge")
    config = json.loads((root / "hf-huge" / "config.json").read_text())
    config.update(n_embd=1_000_000, vocab_size=10**9)  # asks for ~4e15 bytes
    (root / "hf-huge" / "config.json").write_text(json.dumps(config))
    return root


def _nan_copy(src: Path, dst: Path) -> None:
    """A copy of the Hugging Face directory ``src`` with one NaN in its weights."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        meta = f.metadata()
    tensors = load_file(src / "model.safetensors")
    first = next(iter(tensors))
    tensors[first].view(-1)[0] = float("nan")
    save_file(tensors, dst / "model.safetensors", metadata=meta)


@pytest.fixture
def workspace(trained_runs, tmp_path, monkeypatch):
    """A fresh copy of the trained runs and the text file, as the current directory."""
    for name in (
        "lm",
        "s2s",
        "text.txt",
        "hf",
        "hf-no-tokenizer",
        "hf-nan",
        "hf-huge",
        "lm.safetensors",
    ):
        src = trained_runs / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path
