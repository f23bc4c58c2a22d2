"""Checkpoints (attnlab.checkpoint.save), training state (state.py) and atomic writes (atomic.py).

Round trips for every Transformer kind, tied weights stored once and re-tied, a resumed step that is
bit-identical to an uninterrupted one (AdamW, and Muon + AdamW), keep-last-k + best, crashes at
every point of a save (including a real kill -9), and every bad checkpoint a user can hand us.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import zlib

import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch
import torch.nn.functional as F

import attnlab.checkpoint as ck
import attnlab.checkpoint.atomic as atomic
from attnlab.checkpoint.state import (
    capture_rng_state,
    flatten_state,
    optimizer_state_from_tensors,
    optimizer_state_to_tensors,
    restore_rng_state,
    unflatten_state,
    write_safetensors,
)
from attnlab.config import ModelConfig
from attnlab.data import ByteTokenizer, CharTokenizer, LabelSet
from attnlab.errors import CheckpointError, ConfigError, UserError
from attnlab.interop import load_checkpoint as load_any
from attnlab.models import build_model
from tiny_configs import TINY

TOK = CharTokenizer.train(["abcdefghij klmnop"])


def tiny(kind: str = "decoder_lm", **changes) -> tuple[ModelConfig, torch.nn.Module]:
    extra = {"n_classes": 3} if kind == "classifier" else {}
    cfg = ModelConfig(kind=kind, vocab_size=TOK.vocab_size, **TINY, **extra, **changes)
    return cfg, build_model(cfg)


def save(run, model, cfg, step, **kw):
    return ck.save_checkpoint(run, model=model, config=cfg, tokenizer=TOK, step=step, **kw)


def logits(model, cfg, x):
    model.eval()
    if cfg.kind == "encoder_decoder":
        return model(x, x).logits
    out = model(x)
    return out.logits if hasattr(out, "logits") else out[0]


# Round trips -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["decoder_lm", "encoder_decoder", "classifier", "encoder"])
def test_round_trip_gives_identical_outputs(tmp_path, kind):
    cfg, model = tiny(kind)
    labels = LabelSet(["neg", "neu", "pos"]) if kind == "classifier" else None
    path = save(tmp_path, model, cfg, step=7, labels=labels)
    assert path == tmp_path / "checkpoints" / "step_00000007"
    got = ck.load_checkpoint(tmp_path)
    x = torch.randint(3, cfg.vocab_size, (2, 6))
    torch.testing.assert_close(logits(got.model, cfg, x), logits(model, cfg, x), rtol=0, atol=0)
    assert got.config == cfg and got.step == 7 and got.path == path
    assert got.tokenizer.to_dict() == TOK.to_dict()
    assert (got.labels.names if labels else got.labels) == (labels.names if labels else None)
    assert not got.model.training


def test_tied_weights_stored_once_and_retied(tmp_path):
    cfg, model = tiny(tie_embeddings=True)
    path = save(tmp_path, model, cfg, step=1)
    with safetensors.safe_open(str(path / "model.safetensors"), "pt") as f:
        keys, meta = set(f.keys()), f.metadata()
    assert "lm_head.weight" not in keys and "embed.tok_emb.weight" in keys
    assert json.loads(meta["attnlab.aliases"]) == {"lm_head.weight": "embed.tok_emb.weight"}
    loaded = ck.load_checkpoint(path).model
    assert loaded.lm_head.weight is loaded.embed.tok_emb.weight
    untied_cfg, untied = tiny(tie_embeddings=False)
    loaded = ck.load_checkpoint(save(tmp_path / "u", untied, untied_cfg, step=1)).model
    assert loaded.lm_head.weight is not loaded.embed.tok_emb.weight
    torch.testing.assert_close(loaded.lm_head.weight, untied.lm_head.weight, rtol=0, atol=0)


def test_wrapped_models_save_plain_names(tmp_path):
    cfg, model = tiny()

    class Compiled(torch.nn.Module):  # what torch.compile returns: the module in _orig_mod
        def __init__(self, inner):
            super().__init__()
            self._orig_mod = inner

    assert ck.unwrap_model(Compiled(model)) is model
    loaded = ck.load_checkpoint(save(tmp_path, Compiled(model), cfg, step=2)).model
    torch.testing.assert_close(loaded.state_dict(), model.state_dict(), rtol=0, atol=0)


# Bit-identical resume --------------------------------------------------------------------------
def make_optimizers(model, kind):
    if kind == "adamw":
        opts = [torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)]
    else:  # Muon for 2-D hidden weights, AdamW for embeddings, norms and biases
        hidden = [p for n, p in model.named_parameters() if p.ndim == 2 and "emb" not in n]
        rest = [p for n, p in model.named_parameters() if not (p.ndim == 2 and "emb" not in n)]
        opts = [torch.optim.Muon(hidden, lr=0.02), torch.optim.AdamW(rest, lr=1e-2)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 4)) for o in opts]
    return opts, scheds


def train_steps(model, opts, scheds, n, vocab):
    model.train()
    losses = []
    for _ in range(n):
        x = torch.randint(0, vocab, (4, 9))  # consumes the torch RNG, like a data sampler
        noise = random.random() + np.random.rand()  # noqa: NPY002 (Python's, NumPy's RNG)
        out = model(x[:, :-1]).logits
        loss = F.cross_entropy(out.reshape(-1, out.size(-1)), x[:, 1:].reshape(-1)) * noise
        for o in opts:
            o.zero_grad()
        loss.backward()
        for o in opts:
            o.step()
        for s in scheds:
            s.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("opt_kind", ["adamw", "muon"])
def test_resume_is_bit_identical(tmp_path, opt_kind):
    cfg, model = tiny(dropout=0.1)
    opts, scheds = make_optimizers(model, opt_kind)
    train_steps(model, opts, scheds, 3, cfg.vocab_size)
    save(
        tmp_path,
        model,
        cfg,
        step=3,
        optimizer=opts,
        scheduler=scheds,
        extra_state={"data_position": 123},
        train_config={"lr": 1e-2},
    )
    straight = train_steps(model, opts, scheds, 3, cfg.vocab_size)

    torch.manual_seed(99), random.seed(99), np.random.seed(99)  # noqa: NPY002 (fresh process)
    got = ck.load_checkpoint(tmp_path)
    opts2, scheds2 = make_optimizers(got.model, opt_kind)
    extra = ck.restore_training(got, opts2, scheds2)
    assert extra["data_position"] == 123 and extra["step"] == 3
    assert got.train_state["train_config"] == {"lr": 1e-2}
    restore_rng_state(extra["rng"])
    resumed = train_steps(got.model, opts2, scheds2, 3, cfg.vocab_size)
    assert resumed == straight
    torch.testing.assert_close(got.model.state_dict(), model.state_dict(), rtol=0, atol=0)
    assert scheds2[0].last_epoch == scheds[0].last_epoch == 6


def test_optimizer_state_single_and_mismatch():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), betas=(0.8, 0.9))
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    tensors, meta = optimizer_state_to_tensors(opt)
    json.dumps(meta)  # the metadata is plain JSON
    fresh = torch.optim.AdamW(model.parameters())
    optimizer_state_from_tensors(fresh, tensors, meta)
    assert fresh.param_groups[0]["betas"] == (0.8, 0.9)  # tuples stay tuples
    torch.testing.assert_close(fresh.state_dict()["state"], opt.state_dict()["state"])
    with pytest.raises(CheckpointError, match=r"\['AdamW'\] but this run built \['SGD'\]"):
        optimizer_state_from_tensors(torch.optim.SGD(model.parameters(), lr=1), tensors, meta)
    other = torch.optim.AdamW(torch.nn.Linear(3, 2, bias=False).parameters())
    with pytest.raises(CheckpointError, match="does not fit"):
        optimizer_state_from_tensors(other, tensors, meta)


def test_flatten_state_round_trips_structure():
    t = torch.arange(4.0)
    obj = {
        "state": {0: {"buf": t, "step": 3}},
        "g": [{"betas": (0.9, 0.99), "params": [0]}],
        "__tensor__": "tricky",
        "n": None,
        "views": (t, t[:2]),
    }
    tree, tensors = flatten_state(obj)
    back = unflatten_state(json.loads(json.dumps(tree)), tensors)
    assert back["g"][0]["betas"] == (0.9, 0.99) and back["__tensor__"] == "tricky"
    assert 0 in back["state"] and back["state"][0]["step"] == 3 and back["n"] is None
    torch.testing.assert_close(back["views"][1], t[:2])
    with pytest.raises(TypeError, match="without pickle"):
        flatten_state({"f": lambda: 0})


def test_streaming_safetensors_writer_is_read_by_the_library(tmp_path):
    base = torch.arange(12.0).reshape(3, 4)
    tensors = {
        "f32": base,
        "t": base.t(),
        "bf16": base.to(torch.bfloat16),
        "f16": base.half(),
        "i64": torch.arange(5),
        "u8": torch.arange(7, dtype=torch.uint8),
        "i8": -torch.ones(2, dtype=torch.int8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }
    entry = write_safetensors(tmp_path / "x.safetensors", tensors, {"k": "v"})
    data = (tmp_path / "x.safetensors").read_bytes()
    assert entry == {"bytes": len(data), "crc32": zlib.crc32(data)}
    back = safetensors.torch.load(data)
    assert back.keys() == tensors.keys()
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    with safetensors.safe_open(str(tmp_path / "x.safetensors"), "pt") as f:
        assert f.metadata() == {"k": "v"}
    with pytest.raises(TypeError, match="complex64, which safetensors cannot hold"):
        write_safetensors(tmp_path / "y", {"c": torch.zeros(2, dtype=torch.complex64)})


def test_rng_capture_restore_reproduces_numbers():
    state = capture_rng_state()
    json.dumps(state)

    def draw():
        return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()  # noqa: NPY002

    first = draw()
    restore_rng_state(json.loads(json.dumps(state)))
    assert draw() == first
    with pytest.raises(CheckpointError, match="random-number-generator state is malformed"):
        restore_rng_state({"python": {"version": 3}})


# Retention -------------------------------------------------------------------------------------
def test_keep_last_and_best(tmp_path):
    cfg, model = tiny()
    metrics = {1: 3.0, 2: 1.0, 3: 2.0, 4: 2.5, 5: 4.0, 6: None}
    for step, m in metrics.items():
        save(tmp_path, model, cfg, step=step, metric=m, keep_last=2)
    names = [p.name for p in ck.list_checkpoints(tmp_path)]
    assert names == ["step_00000002", "step_00000005", "step_00000006"]  # last 2 + best
    assert ck.latest_checkpoint(tmp_path).name == "step_00000006"
    assert ck.best_checkpoint(tmp_path).name == "step_00000002"
    assert ck.load_checkpoint(tmp_path / "checkpoints" / "best").step == 2
    assert ck.load_checkpoint(tmp_path).train_state["best_metric"] == 1.0

    hi = tmp_path / "hi"
    for step, m in {1: 0.1, 2: 0.9, 3: 0.5, 4: float("nan")}.items():
        save(hi, model, cfg, step=step, metric=m, higher_is_better=True, keep_last=0)
    assert len(ck.list_checkpoints(hi)) == 4  # keep_last=0 keeps all
    assert ck.best_checkpoint(hi).name == "step_00000002"


def test_resave_same_step_replaces_it(tmp_path):
    cfg, model = tiny()
    save(tmp_path, model, cfg, step=5)
    with torch.no_grad():
        model.embed.tok_emb.weight.add_(1.0)
    save(tmp_path, model, cfg, step=5)
    got = ck.load_checkpoint(tmp_path).model
    torch.testing.assert_close(got.embed.tok_emb.weight, model.embed.tok_emb.weight)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["latest", "step_00000005"]


# Crashes ---------------------------------------------------------------------------------------
@pytest.fixture
def two_saves(tmp_path):
    """A run with checkpoints at steps 1 and 2; returns (run, cfg, model, step-2 logits, x)."""
    cfg, model = tiny()
    save(tmp_path, model, cfg, step=1)
    save(tmp_path, model, cfg, step=2)
    x = torch.randint(3, cfg.vocab_size, (1, 5))
    return tmp_path, cfg, model, logits(model, cfg, x), x


def assert_step2_intact(run, cfg, expected, x, cleaned=True):
    root = run / "checkpoints"
    assert ck.latest_checkpoint(run) == root / "step_00000002"
    got = ck.load_checkpoint(run)
    assert got.step == 2
    torch.testing.assert_close(logits(got.model, cfg, x), expected, rtol=0, atol=0)
    assert cleaned == (not [p for p in os.listdir(root) if p.startswith(".tmp-")])


def test_disk_full_mid_save_keeps_previous(two_saves, monkeypatch):
    run, cfg, model, expected, x = two_saves

    def full(fd):  # delayed allocation: a full disk often shows up only at fsync
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(atomic.DiskFullError, match="model.safetensors.*free some space"):
        save(run, model, cfg, step=3)
    monkeypatch.undo()
    assert_step2_intact(run, cfg, expected, x)


def test_crash_at_rename_or_pointer_keeps_previous(two_saves, monkeypatch):
    run, cfg, model, expected, x = two_saves
    monkeypatch.setattr(ck.save.os, "replace", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        save(run, model, cfg, step=3)
    monkeypatch.undo()
    assert_step2_intact(run, cfg, expected, x)

    def die(*a, **k):
        raise KeyboardInterrupt  # dies after step_3 was renamed into place, before `latest`

    monkeypatch.setattr(ck.save, "atomic_write_text", die)
    with pytest.raises(KeyboardInterrupt):
        save(run, model, cfg, step=3)
    monkeypatch.undo()
    assert_step2_intact(run, cfg, expected, x)  # `latest` still names step 2 ...
    assert ck.load_checkpoint(run / "checkpoints" / "step_00000003").step == 3  # ... 3 is whole


def test_leftovers_of_a_killed_save_are_ignored_and_cleaned(two_saves):
    run, cfg, model, expected, x = two_saves
    root = run / "checkpoints"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    tmp = root / f".tmp-step_00000003-{dead}-abcdef"
    (tmp / "train_state").mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(b"\x00garbage")
    (root / "step_00000004").mkdir()  # a step dir without its files (e.g. a partial copy)
    (root / "step_00000004" / "config.json").write_text("{")
    (root / ".del-step_00000001-abc").mkdir()
    (root / ".latest.tmp-k1ll3d").write_text("step_0000")  # a pointer write killed mid-way
    (root / ".write-probe-k1ll3d").touch()  # killed between ensure_writable_dir's create and unlink
    os.replace(root / "step_00000001", root / ".old-step_00000001")  # killed mid re-save
    assert_step2_intact(run, cfg, expected, x, cleaned=False)
    (root / "latest").write_text("step_00000009\n")  # a stale pointer: fall back to the newest
    assert ck.latest_checkpoint(run) == root / "step_00000002"
    (root / "latest").unlink()
    assert ck.latest_checkpoint(run) == root / "step_00000002"
    save(run, model, cfg, step=5, keep_last=0)
    names = sorted(os.listdir(root))
    assert names == ["latest", "step_00000001", "step_00000002", "step_00000004", "step_00000005"]


def test_killed_resave_of_the_latest_is_recovered(two_saves):
    run, cfg, model, expected, x = two_saves
    root = run / "checkpoints"
    os.replace(root / "step_00000002", root / ".old-step_00000002")  # _place_dir, mid-way
    assert ck.latest_checkpoint(run) == root / ".old-step_00000002"
    torch.testing.assert_close(logits(ck.load_checkpoint(run).model, cfg, x), expected)
    save(run, model, cfg, step=3)  # the next save puts it back
    assert [p.name for p in ck.list_checkpoints(run)][-2:] == ["step_00000002", "step_00000003"]


def test_kill_9_during_saves_leaves_a_loadable_latest(tmp_path):
    child = textwrap.dedent(f"""
        import torch, sys
        torch.set_num_threads(1)
        from attnlab.config import ModelConfig
        from attnlab.models import build_model
        from attnlab.checkpoint import save_checkpoint
        cfg = ModelConfig(vocab_size=64, d_model=64, n_heads=2, n_layers=2, max_len=16)
        model = build_model(cfg)
        for step in range(1, 10_000):
            with torch.no_grad():
                model.embed.tok_emb.weight.fill_(step)
            save_checkpoint({str(tmp_path)!r}, model=model, config=cfg, step=step, keep_last=2)
            print(step, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        while int(proc.stdout.readline() or 10**9) < 3:
            pass
        time.sleep(random.Random(os.getpid()).uniform(0.0, 0.05))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    got = ck.load_checkpoint(tmp_path)
    assert got.step >= 3
    assert torch.all(got.model.embed.tok_emb.weight == got.step)


# Bad checkpoints -------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    cfg, model = tiny()
    return save(tmp_path, model, cfg, step=4), cfg


def test_truncated_or_corrupt_weights_are_named(saved):
    path, _ = saved
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match="model.safetensors.*truncated"):
        ck.load_checkpoint(path)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        ck.load_checkpoint(path, verify=False)
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(CheckpointError, match="corrupt: its CRC-32 differs"):
        ck.load_checkpoint(path)
    weights.write_bytes(b"\xff" * len(data))
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        ck.load_checkpoint(path, verify=False)
    weights.unlink()
    with pytest.raises(CheckpointError, match="model.safetensors' is missing"):
        ck.load_checkpoint(path)


def test_bad_json_and_missing_paths(saved, tmp_path):
    path, _ = saved
    (path / "config.json").write_text('{"format": "attnlab-checkpoint", ')
    with pytest.raises(CheckpointError, match="config.json' is not valid JSON"):
        ck.load_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        ck.load_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint in .*train first"):
        ck.load_checkpoint(tmp_path / "empty")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ConfigError, match="GPT-2 config is missing"):  # read as a HF directory
        load_any(tmp_path / "hf")
    with pytest.raises(CheckpointError, match="Hugging Face model directory.*interop"):
        ck.load_checkpoint(tmp_path / "hf")  # attnlab's own format only, one floor down


def test_wrong_kind(saved):
    path, _ = saved
    with pytest.raises(CheckpointError, match="holds a 'decoder_lm' model but this needs 'class"):
        ck.load_checkpoint(path, expect_kind="classifier")
    assert ck.load_checkpoint(path, expect_kind=("decoder_lm", "rnn_lm")).step == 4


def test_tokenizer_vocab_mismatch(saved, tmp_path):
    path, cfg = saved
    (path / "tokenizer.json").write_text(json.dumps(ByteTokenizer().to_dict()))
    with pytest.raises(CheckpointError, match="checkpoint and tokenizer disagree"):
        ck.load_checkpoint(path, verify=False)
    _, model = tiny()
    with pytest.raises(CheckpointError, match="checkpoint and tokenizer disagree"):
        ck.save_checkpoint(
            tmp_path / "x", model=model, config=cfg, tokenizer=ByteTokenizer(), step=1
        )


def test_state_dict_mismatch_names_keys(saved):
    path, _ = saved
    data = json.loads((path / "config.json").read_text())
    data["model"]["d_ff"] = 48
    data["model"]["n_layers"] = 2
    (path / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"missing keys blocks\.1\..*shape mismatches"):
        ck.load_checkpoint(path, verify=False)


def test_resuming_with_a_different_model_names_the_fields(saved):
    path, cfg = saved
    got = ck.load_checkpoint(path)
    ck.check_same_model(got, cfg)
    with pytest.raises(
        CheckpointError, match=r"d_model 16 \(checkpoint\) vs 32.*new out directory"
    ):
        ck.check_same_model(got, cfg.replace(d_model=32, d_ff=64))


def test_restore_training_needs_train_state(tmp_path):
    cfg, model = tiny()
    path = ck.save_inference_checkpoint(tmp_path / "export", model=model, config=cfg, tokenizer=TOK)
    got = ck.load_checkpoint(path)
    assert got.train_state is None
    with pytest.raises(CheckpointError, match="no training state"):
        ck.restore_training(got, torch.optim.AdamW(got.model.parameters()))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="not an attnlab checkpoint"):
        ck.save_inference_checkpoint(tmp_path / "mine", model=model, config=cfg)
    (tmp_path / "mine" / "config.json").write_text('{"model_type": "gpt2"}')  # an HF directory
    with pytest.raises(CheckpointError, match="not an attnlab checkpoint"):
        ck.save_inference_checkpoint(tmp_path / "mine", model=model, config=cfg)
    assert ck.save_inference_checkpoint(path, model=model, config=cfg) == path  # replaces ours
    saved_no_opt = ck.load_checkpoint(save(tmp_path / "run", model, cfg, step=1))
    with pytest.raises(CheckpointError, match="saved without optimizer state"):
        ck.restore_training(saved_no_opt, torch.optim.AdamW(model.parameters()))


# Atomic writes ---------------------------------------------------------------------------------
def test_atomic_writes(tmp_path, monkeypatch):
    target = tmp_path / "sub" / "f.json"
    atomic.atomic_write_json(target, {"a": [1, 2]})
    atomic.atomic_write_text(target, atomic.json.dumps({"a": 3}))
    assert json.loads(target.read_text()) == {"a": 3}
    assert os.listdir(target.parent) == ["f.json"]
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()

    def fail(code):
        def replace(*a):
            raise OSError(code, os.strerror(code))

        return replace

    monkeypatch.setattr(atomic.os, "replace", fail(errno.ENOSPC))
    with pytest.raises(atomic.DiskFullError, match="no space left.*free some space"):
        atomic.atomic_write_bytes(target, b"new")
    monkeypatch.setattr(atomic.os, "replace", fail(errno.EACCES))
    with pytest.raises(atomic.NotWritableError, match="choose a directory you can write"):
        atomic.atomic_write_bytes(target, b"new")
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"a": 3} and os.listdir(target.parent) == ["f.json"]
    with pytest.raises(UserError, match="is a file, not a directory"):
        atomic.ensure_writable_dir(target)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
