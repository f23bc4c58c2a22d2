"""The supported PyTorch range: the floor in pyproject.toml is at most what CI installs (2.11,
where the CUDA suite passed; CI installs 2.13) and both are in the README, and private or recent
torch APIs fall back to eager code with one warning when the installed version lacks them."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tiny_configs import tiny_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version).groups("0"))


def test_the_installed_torch_is_in_the_declared_and_documented_range():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("torch"))
    floor = re.search(r">=\s*([\d.]+)", spec).group(1)
    ceiling = re.search(r"<\s*([\d.]+)", spec).group(1)
    assert _release(floor) <= _release(torch.__version__) < _release(ceiling)
    readme = (ROOT / "README.md").read_text()
    assert f"PyTorch >= {floor}" in readme and "Tested versions:" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    tested = re.search(r"torch==([\d.]+)", ci).group(1)
    assert _release(floor) <= _release(tested)  # CI tests a version the range admits
    assert f"PyTorch {tested}" in readme and f"PyTorch {floor}" in readme


def test_training_without_torch_compile_runs_eagerly_with_one_warning(tmp_path, monkeypatch):
    from attnlab.train import RunConfig, TrainConfig, train

    model = tiny_config()
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat and the dog ran off. " * 40)
    cfg = TrainConfig(task="lm", data=str(text), context_len=8, steps=3, batch_size=4,
                      warmup_steps=1, eval_every=0, eval_batches=1, save_every=0, log_every=1,
                      progress=False, threads=1)  # fmt: skip
    eager = train(RunConfig(model, cfg), run_dir=tmp_path / "eager")
    monkeypatch.delattr(torch, "compile")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback = train(RunConfig(model, cfg.replace(compile=True)), run_dir=tmp_path / "c")
    notes = [w for w in caught if "lacks; training runs eagerly" in str(w.message)]
    assert len(notes) == 1
    assert fallback.losses == eager.losses


def test_a_missing_onednn_query_means_no_native_bf16(monkeypatch):
    from attnlab.train import distributed

    class NoQuery:  # a torch.ops.mkldnn without _is_mkldnn_bf16_supported
        pass

    monkeypatch.setattr(torch.ops, "mkldnn", NoQuery())
    assert distributed.cpu_has_native_bf16() is False
    with pytest.warns(UserWarning, match="without native bfloat16"):  # the one warning
        assert distributed.autocast_dtype("bf16", torch.device("cpu")) == torch.bfloat16
