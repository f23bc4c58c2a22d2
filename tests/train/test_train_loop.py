"""The training loop through its Python API: resume, accumulation, run-directory safety."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from attnlab.checkpoint import latest_checkpoint, load_checkpoint
from attnlab.config import ModelConfig
from attnlab.errors import CheckpointError, ConfigError, UserError
from attnlab.train import RunConfig, TrainConfig, TrainingDiverged, train
from tiny_configs import tiny_config

TINY_S2S = tiny_config("encoder_decoder", max_len=24, dropout=0.1)
TINY_LM = tiny_config()


def _s2s(**kw) -> RunConfig:
    train_cfg = dict(task="seq2seq", data="reverse", n_train=200, n_val=16, steps=8,
                     batch_size=8, grad_accum=2, warmup_steps=2, lr=3e-3, eval_every=0,
                     save_every=0, log_every=1, progress=False)  # fmt: skip
    return RunConfig(TINY_S2S, TrainConfig(**{**train_cfg, **kw}))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("text") / "text.txt"
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "and",
        "the",
        "dog",
        "ran",
        "off",
        "to",
        "the",
        "park",
    ]
    path.write_text(" ".join(words[(i * 7) % len(words)] for i in range(3000)), encoding="utf-8")
    return str(path)


def _losses(run_dir) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["train_loss"] for line in lines]


def test_resume_in_a_fresh_process_is_bit_identical(tmp_path):
    """N steps straight == N/2 steps, then a new process resuming for the other N/2 (dropout on,
    gradient accumulation, Muon)."""
    cfg = _s2s(optimizer="muon", threads=1)  # same reduction order in both processes
    straight = train(cfg, run_dir=tmp_path / "a")
    first = train(cfg, run_dir=tmp_path / "b", stop_at=4)
    assert first.step == 4 and latest_checkpoint(tmp_path / "b").name == "step_00000004"
    cmd = [sys.executable, "-m", "attnlab", "train", "--out", str(tmp_path / "b"), "--resume"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout
    assert [loss for _, loss in straight.losses] == _losses(tmp_path / "a")
    assert _losses(tmp_path / "b") == _losses(tmp_path / "a")  # exact float equality


def test_gradient_accumulation_matches_one_big_batch(tmp_path, corpus):
    base = dict(task="lm", data=corpus, context_len=16, steps=3, warmup_steps=1, eval_every=0,
                save_every=0, log_every=1, progress=False)  # fmt: skip
    big = train(RunConfig(TINY_LM, TrainConfig(**base, batch_size=8)), run_dir=tmp_path / "a")
    acc = train(
        RunConfig(TINY_LM, TrainConfig(**base, batch_size=4, grad_accum=2)), run_dir=tmp_path / "b"
    )
    for (_, x), (_, y) in zip(big.losses, acc.losses):
        assert x == pytest.approx(y, rel=1e-5)
    assert big.metrics["val_ppl"] == pytest.approx(acc.metrics["val_ppl"], rel=1e-4)


def test_a_run_directory_with_checkpoints_is_never_overwritten(tmp_path):
    train(_s2s(steps=2), run_dir=tmp_path)
    before = (latest_checkpoint(tmp_path) / "model.safetensors").read_bytes()
    with pytest.raises(ConfigError, match="already holds checkpoints.*resume=True"):
        train(_s2s(steps=2), run_dir=tmp_path)
    assert (latest_checkpoint(tmp_path) / "model.safetensors").read_bytes() == before
    other = RunConfig(TINY_S2S.replace(d_model=24), _s2s(steps=4).train)
    with pytest.raises(CheckpointError, match="different model.*d_model: checkpoint 16"):
        train(other, run_dir=tmp_path, resume=True)


def test_resume_without_a_checkpoint_starts_fresh_and_extends_a_finished_run(tmp_path):
    result = train(_s2s(steps=2), run_dir=tmp_path, resume=True)
    assert result.resumed_from is None and result.step == 2
    longer = train(_s2s(steps=4), run_dir=tmp_path, resume=True)
    assert longer.start_step == 2 and longer.step == 4 and len(longer.losses) == 2
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # one consistent history


def test_outputs_of_a_run(tmp_path):
    result = train(
        _s2s(steps=4, eval_every=2, save_every=2, keep_last=1, best_metric="val_exact_match"),
        run_dir=tmp_path,
    )
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert (tmp_path / "config.toml").is_file()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    keys = {
        "step",
        "train_loss",
        "lr",
        "tokens_per_s",
        "elapsed_s",
        "val_loss",
        "val_ppl",
        "val_exact_match",
    }
    assert keys <= set(records[-1]) and records[1]["step"] == 2 and "val_loss" in records[1]
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.step == 4 and ckpt.tokenizer.to_dict() == result.tokenizer.to_dict()
    assert ckpt.config.vocab_size == result.tokenizer.vocab_size
    assert set(result.metrics) >= {"val_loss", "val_exact_match"}
    assert len(result.predictions) == len(set(p.source for p in result.predictions))


def test_classifier_and_recurrent_kinds_train(tmp_path):
    clf = RunConfig(ModelConfig(kind="classifier", n_classes=2, d_model=16, n_heads=2, n_layers=1,
                                d_ff=32, max_len=40),
                    TrainConfig(task="classify", data="parens", n_train=100, n_val=20, steps=2,
                                batch_size=8, warmup_steps=1, progress=False))  # fmt: skip
    result = train(clf, run_dir=tmp_path / "clf")
    assert set(result.metrics) == {"val_loss", "val_accuracy"}
    pytest.importorskip("attnlab.models.lstm_seq2seq")
    rnn = RunConfig(
        ModelConfig(kind="lstm_seq2seq", d_model=16, rnn_attention="additive"), _s2s(steps=2).train
    )
    result = train(rnn, run_dir=tmp_path / "rnn")
    assert "val_exact_match" in result.metrics


def test_model_kind_must_fit_the_task(tmp_path):
    with pytest.raises(ConfigError, match="cannot be trained on task 'seq2seq'.*encoder_decoder"):
        train(RunConfig(TINY_LM, _s2s().train), run_dir=tmp_path)


@pytest.mark.filterwarnings("ignore:dtype='bf16' on a CPU without native")  # AVX2 hosts
def test_bf16_autocast_trains_on_cpu(tmp_path, corpus):
    cfg = TrainConfig(
        task="lm",
        data=corpus,
        context_len=16,
        steps=3,
        warmup_steps=1,
        batch_size=4,
        dtype="bf16",
        progress=False,
    )
    result = train(RunConfig(TINY_LM, cfg), run_dir=tmp_path)
    assert all(math.isfinite(loss) for _, loss in result.losses)
    assert next(result.model.parameters()).dtype == torch.float32  # master weights stay fp32


def test_training_restores_the_process_cpu_settings(tmp_path):
    """train() flushes denormals and may set threads only while it runs."""
    before = torch.get_num_threads()
    train(_s2s(steps=2, threads=2), run_dir=tmp_path / "run", progress=False)
    assert torch.get_num_threads() == before
    tiny = torch.tensor([1e-40], dtype=torch.float32)
    assert (tiny * 1.0).item() != 0.0  # denormals are kept again (PyTorch's default)


def test_compile_on_padded_batches_warns_and_lm_windows_do_not(tmp_path, corpus, monkeypatch):
    """--compile recompiles for every new padded batch shape; the loop says so (torch.compile is
    replaced by the identity here: the warning, not compilation, is under test)."""
    import warnings

    import attnlab.train.loop as loop

    monkeypatch.setattr(loop.torch, "compile", lambda module: module)
    with pytest.warns(UserWarning, match="compile=True on padded seq2seq batches"):
        train(_s2s(steps=2, compile=True), run_dir=tmp_path / "s2s", progress=False)
    cfg = TrainConfig(task="lm", data=corpus, context_len=16, steps=1, warmup_steps=0,
                      batch_size=4, compile=True, progress=False)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        train(RunConfig(TINY_LM, cfg), run_dir=tmp_path / "lm")


def test_bf16_on_a_cpu_that_emulates_it_warns(monkeypatch):
    import warnings

    from attnlab.train import distributed

    monkeypatch.setattr(distributed, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="without native bfloat16.*dtype='fp32'"):
        assert distributed.autocast_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    monkeypatch.setattr(distributed, "cpu_has_native_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert distributed.autocast_dtype("bf16", torch.device("cpu")) == torch.bfloat16
        assert distributed.autocast_dtype("fp32", torch.device("cpu")) is None


def test_a_diverging_run_stops_with_its_step_and_loss_and_keeps_its_checkpoints(tmp_path, corpus):
    cfg = TrainConfig(task="lm", data=corpus, context_len=16, steps=30, warmup_steps=0,
                      batch_size=4, lr=1e6, grad_clip=0.0, save_every=1,
                      progress=False)  # fmt: skip
    with pytest.raises(TrainingDiverged) as caught:
        train(RunConfig(TINY_LM, cfg), run_dir=tmp_path)
    err = caught.value
    assert not math.isfinite(err.loss) and 1 <= err.step <= 30
    assert f"became {err.loss} at step {err.step}; lower the learning rate" in str(err)
    if err.step > 1:  # the last finite step's checkpoint is intact
        assert latest_checkpoint(tmp_path).name == f"step_{err.step - 1:08d}"


def test_merged_lm_batches_keep_every_window_in_order():
    from attnlab.data.batching import LMBatch
    from attnlab.train.evaluate import merged_lm_batches

    batches = [LMBatch(torch.full((2, 4), i), torch.full((2, 4), -i)) for i in range(5)]
    merged = merged_lm_batches(batches, max_tokens=16)  # two batches of 8 tokens per chunk
    assert [b.x.shape for b in merged] == [(4, 4), (4, 4), (2, 4)]
    assert torch.equal(torch.cat([b.x for b in merged]), torch.cat([b.x for b in batches]))
    assert torch.equal(torch.cat([b.y for b in merged]), torch.cat([b.y for b in batches]))
    assert merged_lm_batches(batches, max_tokens=4)[0] is batches[0]  # too big: left alone


def test_the_loss_plot_is_drawn_off_the_loop_and_complete_when_train_returns(tmp_path):
    from attnlab.train.report import LossPlotter

    plotter = LossPlotter(tmp_path / "loss.png", title="t")
    for n in range(1, 6):  # requests faster than drawing: older pending ones are replaced
        plotter.request([{"step": s, "train_loss": 1.0 / s} for s in range(1, n + 1)])
    plotter.close()
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "blocked").write_text("a file where the plot's directory should be")
    broken = LossPlotter(tmp_path / "blocked" / "loss.png")
    broken.request([{"step": 1, "train_loss": 1.0}])
    with pytest.raises((OSError, UserError)):  # the worker's error reaches the training thread
        broken.close()


def test_redrawing_the_loss_plot_is_rationed_and_the_last_drawing_is_the_newest(tmp_path):
    """Drawings may take at most max_share of the plotter's lifetime; requests made meanwhile
    replace each other and close() draws the newest, so the final loss.png is complete."""
    import time

    from attnlab.train.report import LossPlotter

    drawn: list[int] = []

    class Slow(LossPlotter):
        def _draw(self, records):
            time.sleep(0.05)  # a drawing that takes 50 ms
            drawn.append(len(records))
            return b"png"

    plotter = Slow(tmp_path / "loss.png", max_share=0.1)  # so at most one drawing per 0.5 s
    began = time.perf_counter()
    for n in range(1, 31):  # a request every 20 ms for 0.6 s: 30 requests
        plotter.request([{"step": s} for s in range(n)])
        time.sleep(0.02)
    plotter.close()
    lifetime = time.perf_counter() - began
    assert drawn[-1] == 30  # the newest records, drawn at close
    assert plotter.drawings == len(drawn)
    assert 1 <= len(drawn) <= 1 + 0.1 * lifetime / 0.05 + 1  # the ration, plus close's drawing
    assert (tmp_path / "loss.png").read_bytes() == b"png"


def test_a_cpu_run_reports_its_runtime_and_times_its_steps(tmp_path, corpus):
    from attnlab.cli.train_cmd import process_age_s
    from attnlab.train.loop import cuda_matmul_precision
    from attnlab.train.timing import time_summary

    events = []
    cfg = RunConfig(
        ModelConfig(kind="decoder_lm", d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=16),
        TrainConfig(task="lm", data=corpus, context_len=8, batch_size=4, steps=5,
                    warmup_steps=1, eval_every=0, save_every=0, progress=False),
    )  # fmt: skip
    result = train(cfg, run_dir=tmp_path / "run", on_event=lambda n, d: events.append((n, d)))
    assert ("runtime", {"line": "cpu, fp32, eager"}) in events
    assert result.first_step_s > 0 and result.steps_s > 0
    assert result.steps_s + result.first_step_s <= result.elapsed_s
    age = process_age_s()
    assert age is None or age > result.elapsed_s
    line = time_summary(result.phases, result.step - result.start_step, 100.0)
    assert line.startswith(f"time: {result.steps_s:.1f} s of training (")
    assert f"{100.0 - result.steps_s:.1f} s of setup and evaluation" in line
    before = torch.get_float32_matmul_precision()
    with cuda_matmul_precision("high", torch.device("cpu")):  # the CPU is never changed
        assert torch.get_float32_matmul_precision() == before
