"""A damaged latest checkpoint: resume, generate and evaluate fall back to the newest checkpoint
that verifies, say which and why, and delete nothing. Non-finite weights are named on load."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

from attnlab.checkpoint import load_checkpoint, save_checkpoint, save_inference_checkpoint
from attnlab.cli import main
from attnlab.errors import CheckpointError
from attnlab.train import RunConfig, TrainConfig, train
from attnlab.train.eval_checkpoint import evaluate_checkpoint
from tiny_configs import tiny_config

TINY_S2S = tiny_config("encoder_decoder", max_len=24)


def _cfg(steps: int) -> RunConfig:
    return RunConfig(TINY_S2S, TrainConfig(task="seq2seq", data="reverse", n_train=200, n_val=8,
                                           steps=steps, batch_size=8, warmup_steps=1,
                                           eval_every=0, eval_batches=1, save_every=2,
                                           keep_last=0, log_every=1, progress=False,
                                           threads=1))  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 4-step run with checkpoints at steps 2 and 4 (trained once, copied per test)."""
    run = tmp_path_factory.mktemp("fallback") / "run"
    train(_cfg(4), run_dir=run)
    return run


def _damage(ckpt, how: str) -> None:
    if how == "truncated weights":
        weights = ckpt / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    elif how == "garbage JSON":
        (ckpt / "config.json").write_text("{not json")
    else:
        (ckpt / "train_state" / "optimizer.safetensors").unlink()


DAMAGE = ["truncated weights", "garbage JSON", "missing optimizer state"]


@pytest.fixture(params=DAMAGE)
def damaged(request, trained, tmp_path):
    run = shutil.copytree(trained, tmp_path / "run")
    _damage(run / "checkpoints" / "step_00000004", request.param)
    return run, request.param


def test_resume_falls_back_to_the_newest_checkpoint_that_verifies(damaged):
    run, how = damaged
    with pytest.warns(UserWarning, match=r"step_00000004.*resuming from step_00000002"):
        result = train(_cfg(6), run_dir=run, resume=True)
    assert result.start_step == 2 and result.step == 6
    kept = run / "checkpoints" / "damaged-step_00000004"
    assert kept.is_dir() and (kept / "manifest.json").is_file()  # set aside, never deleted
    assert load_checkpoint(run).step == 6


def test_resume_with_every_checkpoint_damaged_is_one_error(trained, tmp_path):
    run = shutil.copytree(trained, tmp_path / "run")
    for step in ("step_00000002", "step_00000004"):
        _damage(run / "checkpoints" / step, "truncated weights")
    with pytest.raises(CheckpointError, match="no other checkpoint of the run verifies"):
        train(_cfg(6), run_dir=run, resume=True)
    assert (run / "checkpoints" / "step_00000004").is_dir()


def test_evaluate_falls_back_with_a_warning(damaged):
    run, how = damaged
    if how == "missing optimizer state":  # evaluation does not need it: the latest is used
        assert evaluate_checkpoint(run, max_batches=1).step == 4
        return
    with pytest.warns(UserWarning, match=r"step_00000004.*using step_00000002 \(step 2\)"):
        assert evaluate_checkpoint(run, max_batches=1).step == 2
    assert (run / "checkpoints" / "step_00000004").is_dir()  # a read-only command moves nothing
    with pytest.raises(CheckpointError):  # a checkpoint named explicitly is never swapped
        evaluate_checkpoint(run / "checkpoints" / "step_00000004")


def test_generate_falls_back_with_a_warning(damaged, capsys):
    run, how = damaged
    code = main(["generate", "--checkpoint", str(run), "--source", "abc", "--temperature", "0",
                 "--max-new-tokens", "4"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    if how == "missing optimizer state":
        assert "warning" not in err
    else:
        assert "attnlab: warning: the latest checkpoint cannot be used" in err
        assert "using step_00000002" in err


def test_non_finite_weights_are_never_saved(tmp_path):
    from attnlab.checkpoint import latest_checkpoint
    from attnlab.data import CharTokenizer
    from attnlab.models import build_model

    tok = CharTokenizer("abc ")
    cfg = tiny_config(vocab_size=tok.vocab_size)
    model = build_model(cfg)
    first = save_checkpoint(tmp_path / "run", model=model, config=cfg, tokenizer=tok, step=1)
    name = next(k for k, v in model.state_dict().items() if v.dim() == 2 and "emb" not in k)
    with torch.no_grad():
        model.state_dict()[name][0, 1] = float("inf")
    with pytest.raises(CheckpointError, match=rf"non-finite weights .*in {name}.*step 2 is not"):
        save_checkpoint(tmp_path / "run", model=model, config=cfg, tokenizer=tok, step=2)
    assert latest_checkpoint(tmp_path / "run") == first  # nothing written, latest unchanged
    with pytest.raises(CheckpointError, match=rf"non-finite weights .*in {name}.*is not written"):
        save_inference_checkpoint(tmp_path / "export", model=model, config=cfg, tokenizer=tok)
    assert not (tmp_path / "export").exists()
    from attnlab.interop import save_gpt2_dir, save_safetensors
    from attnlab.interop.export import export_as
    from attnlab.interop.pretrained import save_pretrained

    for fmt, out in (("safetensors", "m.safetensors"), ("hf", "hf"), ("hf-gpt2", "g")):
        with pytest.raises(CheckpointError, match=rf"non-finite weights .*in {name}"):
            export_as(model, fmt, tmp_path / out, config=cfg, tokenizer=tok)
        assert not (tmp_path / out).exists()
    writers = (  # the public writers refuse by themselves, not only through export_as
        lambda out: save_safetensors(model, out, cfg),
        lambda out: save_pretrained(model, out),
        lambda out: save_gpt2_dir(model, out),
    )
    for i, write in enumerate(writers):
        with pytest.raises(CheckpointError, match=rf"non-finite weights .*in {name}.*not written"):
            write(tmp_path / f"w{i}")
        assert not (tmp_path / f"w{i}").exists()
    assert sorted(p.name for p in first.parent.iterdir() if p.name.startswith("step_")) == [
        first.name
    ]


def test_non_finite_weights_are_named_on_load(tmp_path, capsys, monkeypatch):
    from attnlab.checkpoint import load as load_module
    from attnlab.data import CharTokenizer
    from attnlab.models import build_model

    tok = CharTokenizer("abc ")
    cfg = tiny_config(vocab_size=tok.vocab_size)
    model = build_model(cfg)
    save_checkpoint(tmp_path / "run", model=model, config=cfg, tokenizer=tok, step=1)
    name = next(k for k, v in model.state_dict().items() if v.dim() == 2 and "emb" not in k)
    with torch.no_grad():
        model.state_dict()[name][0, 0] = float("nan")
    with monkeypatch.context() as m:  # written by another tool (attnlab refuses to save it)
        m.setattr(load_module, "non_finite", lambda tensors: [])
        ckpt = save_checkpoint(tmp_path / "run", model=model, config=cfg, tokenizer=tok, step=2)
    with pytest.raises(CheckpointError, match=rf"non-finite weights .*in {name}"):
        load_checkpoint(ckpt)
    for argv in (["generate", "--checkpoint", str(ckpt), "--prompt", "ab"],
                 ["generate", "--checkpoint", str(ckpt), "--prompt", "ab", "--temperature", "0"],
                 ["export", "--checkpoint", str(ckpt), "--format", "safetensors", "--out",
                  str(tmp_path / "m.safetensors")]):  # fmt: skip
        assert main(argv) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "non-finite weights" in err and name in err and "Traceback" not in err
    assert not (tmp_path / "m.safetensors").exists()
    with pytest.warns(UserWarning, match="non-finite weights.*using step_00000001"):
        assert load_checkpoint(tmp_path / "run").step == 1  # a run directory falls back


def test_a_prompt_with_unknown_characters_warns_naming_them(tmp_path, capsys):
    from attnlab.data import CharTokenizer
    from attnlab.models import build_model

    tok = CharTokenizer.train(["abc "], unk=True)
    cfg = tiny_config(vocab_size=tok.vocab_size)
    save_checkpoint(tmp_path / "run", model=build_model(cfg), config=cfg, tokenizer=tok, step=1)
    code = main(["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "abXcY!X",
                 "--temperature", "0", "--max-new-tokens", "2"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0
    assert "characters the tokenizer does not know: 'X', 'Y', '!'" in err
    main(["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "abc",
          "--temperature", "0", "--max-new-tokens", "2"])  # fmt: skip
    assert "does not know" not in capsys.readouterr().err


def test_a_data_file_that_fails_to_load_leaves_no_run_directory(tmp_path, capsys):
    bad = tmp_path / "pairs.tsv"
    bad.write_text("no tab on this line\n", encoding="utf-8")
    out = tmp_path / "run"
    assert main(["train", "--pairs", str(bad), "--out", str(out), "--steps", "2",
                 "--warmup-steps", "1", "--no-progress"]) == 2  # fmt: skip
    assert "Traceback" not in capsys.readouterr().err
    assert not out.exists()
    out.mkdir()  # a directory the user made is left alone
    assert main(["train", "--pairs", str(bad), "--out", str(out), "--steps", "2",
                 "--warmup-steps", "1", "--no-progress"]) == 2  # fmt: skip
    assert out.is_dir()


def test_a_vocab_size_the_data_replaces_is_announced(tmp_path):
    cfg = _cfg(1)
    cfg = RunConfig(cfg.model.replace(vocab_size=3), cfg.train.replace(save_every=0))
    with pytest.warns(UserWarning, match="vocab_size=3 is replaced by the tokenizer's"):
        result = train(cfg, run_dir=tmp_path / "run")
    assert json.loads((result.checkpoint / "config.json").read_text())["model"]["vocab_size"] > 3


def test_a_wrong_kind_is_not_mistaken_for_damage(trained):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: every checkpoint has this kind
        with pytest.raises(CheckpointError, match="needs 'decoder_lm'") as err:
            load_checkpoint(trained, expect_kind="decoder_lm")
    assert "no other checkpoint" not in str(err.value)


def test_only_the_announcing_process_warns(trained, tmp_path):
    """Every torchrun process picks the same fallback; only rank 0 (announce=True) says so."""
    from attnlab.train.setup import load_resume_point

    run = shutil.copytree(trained, tmp_path / "run")
    latest = run / "checkpoints" / "step_00000004"
    _damage(latest, "truncated weights")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ckpt, skipped = load_resume_point(latest, announce=False)
    assert ckpt.step == 2 and skipped == [latest]
    with pytest.warns(UserWarning, match="resuming from step_00000002"):
        load_resume_point(latest)
