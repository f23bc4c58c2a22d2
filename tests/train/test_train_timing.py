"""Where a run's time goes (issue 37, item 3): the phases add up to the wall time, ``attnlab
train`` imports nothing heavy before it plots, evaluations compile nothing, outputs complete.

No timing assertions: the tests check accounting and behaviour, never how fast anything is.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys

import pytest
import torch

from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.train import RunConfig, TrainConfig, train
from attnlab.train.timing import RUN_PHASES, TIMING_FILE, TRAINING, PhaseTimes, time_summary

TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32", "--batch-size",
        "4", "--warmup-steps", "1", "--eval-batches", "2", "--no-progress", "--threads", "1",
        "--device", "cpu"]  # fmt: skip
LM = [*TINY, "--max-len", "16", "--context-len", "8"]
# Imported by `attnlab train` only when it draws or logs there.
HEAVY = ("matplotlib", "transformers", "tensorboard", "huggingface_hub", "sacrebleu",
         "attnlab.viz")  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("text") / "text.txt"
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "the", "dog", "ran", "off", "to"]
    path.write_text(" ".join(words[(i * 5) % len(words)] for i in range(2000)), encoding="utf-8")
    return str(path)


class FakeClock:
    """time.perf_counter for the timing module: advances only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_nested_phases_count_self_time_and_sum_to_the_span(monkeypatch):
    import attnlab.train.timing as timing

    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    times = PhaseTimes()
    with times.phase("setup"):
        clock.now += 1.0
        with times.phase("data"):
            clock.now += 2.0
        times.add("first step", 0.5)  # timed elsewhere, inside setup's span
        clock.now += 0.5
    with times.phase("evaluation"):
        clock.now += 0.25
    with times.phase("evaluation"):
        clock.now += 0.25
    assert times.seconds == {"setup": 1.0, "data": 2.0, "first step": 0.5, "evaluation": 0.5}
    assert times.counts == {"setup": 1, "data": 1, "first step": 1, "evaluation": 2}
    assert times.total() == pytest.approx(clock.now)  # 3.5 s in setup's span + 0.5 s of evals
    record = times.to_dict(wall_s=5.0)
    assert record["other_s"] == pytest.approx(1.0)
    assert [p["name"] for p in record["phases"]] == ["setup", "data", "first step", "evaluation"]
    times.add(TRAINING, 9.0, count=10)
    summary = time_summary(times, steps=11, wall_s=14.0)
    assert summary.startswith("time: 9.0 s of training (900.0 ms per step after the first), ")
    assert "5.0 s of setup and evaluation" in summary
    assert "evaluation 2 x 0.25 s" in summary and "other 1.00 s" in summary
    assert TRAINING not in summary.split("\n")[1]  # the breakdown lists the overhead only


def _phases(record: dict) -> dict[str, dict]:
    return {p["name"]: p for p in record["phases"]}


def test_the_summary_breaks_the_wall_time_down_and_outputs_are_complete(tmp_path, corpus, capsys):
    """4 steps, evaluated every 2: two evaluations (none repeated at the end), one checkpoint,
    the phases and the unaccounted rest add up to the wall time in timing.json."""
    out = tmp_path / "run"
    argv = ["train", "--text", corpus, "--steps", "4", "--eval-every", "2", "--out", str(out)]
    assert main([*argv, *LM]) == 0
    printed = capsys.readouterr().out
    m = re.search(r"time: ([\d.]+) s of training .*?, ([\d.]+) s of setup and evaluation "
                  r"\(([\d.]+) s since the command started\)\nsetup and evaluation: (.*)",
                  printed)  # fmt: skip
    assert m, printed
    record = json.loads((out / TIMING_FILE).read_text())
    phases = _phases(record)
    total = sum(p["seconds"] for p in record["phases"])
    assert total + record["other_s"] == pytest.approx(record["wall_s"], abs=1e-5)
    assert all(p["seconds"] >= 0 for p in record["phases"])
    assert record["other_s"] >= -1e-3
    assert {"config", *RUN_PHASES} <= set(phases)
    assert "imports" not in phases  # called in process: the command started with main()
    assert phases["evaluation"]["count"] == 2  # steps 2 and 4; the end is not evaluated again
    assert phases["checkpoints"]["count"] == 1  # the final checkpoint, written once
    assert phases[TRAINING]["count"] == 3 and phases["first step"]["count"] == 1
    training = phases[TRAINING]["seconds"]
    assert float(m.group(1)) == pytest.approx(training, abs=0.051)
    assert float(m.group(2)) == pytest.approx(record["wall_s"] - training, abs=0.051)
    for name in ("config", "data", "first step", "checkpoints", "other"):
        assert re.search(rf"\b{name} [\d.]+ s", m.group(4)), m.group(4)
    assert {p.name for p in out.iterdir()} >= {
        "config.toml", "metrics.jsonl", "metrics.csv", "loss.png", TIMING_FILE, "checkpoints"
    }  # fmt: skip
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "checkpoints" / "step_00000004" / "model.safetensors").is_file()


def test_seq2seq_heatmaps_are_timed_and_written(tmp_path, capsys):
    out = tmp_path / "s2s"
    argv = ["train", "--task", "reverse", "--steps", "2", "--eval-every", "0", "--n-train", "64",
            "--n-val", "8", "--max-len", "24", "--out", str(out)]  # fmt: skip
    assert main([*argv, *TINY]) == 0
    phases = _phases(json.loads((out / TIMING_FILE).read_text()))
    assert phases["heatmaps"]["count"] == 1 and phases["evaluation"]["count"] == 1
    assert list((out / "plots").glob("*.png"))
    assert "attention heatmaps of" in capsys.readouterr().out


def test_train_imports_nothing_heavy_before_it_plots(tmp_path, corpus):
    """A fresh process running the program: when loss.png is first drawn, none of HEAVY is
    imported; at the end only matplotlib (for that plot) is; its imports are timed too."""
    argv = ["train", "--text", corpus, "--steps", "2", "--eval-every", "1", "--out",
            str(tmp_path / "run"), *LM]  # fmt: skip
    script = f"""
import json, sys
import attnlab.train.report as report
HEAVY = {HEAVY!r}
seen = {{}}
draw = report.loss_figure_png
def spy(*args, **kwargs):
    seen.setdefault("at_first_plot", sorted(m for m in HEAVY if m in sys.modules))
    return draw(*args, **kwargs)
report.loss_figure_png = spy
from attnlab.cli import main
sys.argv = ["attnlab", *{argv!r}]
code = main()  # as the program: its imports are a phase
seen["at_end"] = sorted(m for m in HEAVY if m in sys.modules)
print("SEEN " + json.dumps(seen))
sys.exit(code)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.split("SEEN ", 1)[1])
    assert seen["at_first_plot"] == []
    assert seen["at_end"] == ["matplotlib"]
    record = json.loads((tmp_path / "run" / TIMING_FILE).read_text())
    assert _phases(record)["imports"]["seconds"] > 0  # the process's start until the command ran
    total = sum(p["seconds"] for p in record["phases"])
    assert total + record["other_s"] == pytest.approx(record["wall_s"], abs=1e-5)


def test_evaluations_compile_nothing_with_compile_on(tmp_path, corpus, monkeypatch):
    """With compile=True the steps run the compiled model and the evaluations the plain one, so
    no evaluation (of 3) compiles or recompiles anything. Dynamo's ``eager`` backend keeps the
    test fast: the frames it traces and guards are the same as inductor's."""
    dynamo = pytest.importorskip("torch._dynamo")
    from torch._dynamo.utils import counters

    import attnlab.train.loop as loop

    if not hasattr(torch, "compile"):
        pytest.skip("this PyTorch has no torch.compile")
    monkeypatch.setattr(loop.torch, "compile", functools.partial(torch.compile, backend="eager"))
    dynamo.reset()
    compiled: list[int] = []
    real_evaluate = loop.evaluate

    def watched(*args, **kwargs):
        before = sum(counters["frames"].values()), sum(counters["recompiles"].values())
        result = real_evaluate(*args, **kwargs)
        after = sum(counters["frames"].values()), sum(counters["recompiles"].values())
        compiled.append(after != before)
        return result

    monkeypatch.setattr(loop, "evaluate", watched)
    cfg = RunConfig(
        ModelConfig(kind="decoder_lm", d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=8),
        TrainConfig(task="lm", data=corpus, context_len=8, batch_size=4, steps=3, warmup_steps=1,
                    eval_every=1, eval_batches=2, save_every=0, progress=False, compile=True),
    )  # fmt: skip
    try:
        result = train(cfg, run_dir=tmp_path / "run")
        frames = counters["frames"]["ok"]
    except Exception as err:  # a machine where dynamo cannot trace at all
        if "dynamo" in type(err).__module__ or "Backend" in type(err).__name__:
            pytest.skip(f"torch.compile does not work here: {err}")
        raise
    finally:
        dynamo.reset()
    assert compiled == [False, False, False]
    assert frames >= 1  # the steps did run compiled
    assert result.phases.counts["evaluation"] == 3


def test_a_drawing_process_draws_loss_png_without_matplotlib_in_the_training_process(tmp_path):
    """CUDA runs draw loss.png in a separate process: the training process never imports
    matplotlib, and the file is complete when close() returns."""
    script = f"""
import sys
from attnlab.train.report import LossPlotter
plotter = LossPlotter({str(tmp_path / "loss.png")!r}, "t", separate_process=True)
plotter.request([{{"step": 1, "train_loss": 2.0}}, {{"step": 2, "train_loss": 1.5,
                 "val_loss": 1.6, "val_accuracy": 0.5}}])
plotter.close()
print("MATPLOTLIB", "matplotlib" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "MATPLOTLIB False" in done.stdout
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_dead_drawing_process_leaves_the_plot_to_the_thread(tmp_path):
    from attnlab.train.report import LossPlotter

    plotter = LossPlotter(tmp_path / "loss.png", "t", separate_process=True)
    if plotter._drawer is not None:  # killed before it draws anything
        plotter._drawer.kill()
        plotter._drawer.wait()
    plotter.request([{"step": 1, "train_loss": 2.0}, {"step": 2, "train_loss": 1.5}])
    plotter.close()
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plotter._drawer is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_compiled_cuda_run_breaks_its_time_down_and_never_imports_matplotlib(tmp_path, corpus):
    """On CUDA (bf16, compiled) the breakdown is complete, loss.png is drawn by the drawing
    process (matplotlib never enters the training process) and nothing compiles in evaluations."""
    argv = ["train", "--text", corpus, "--steps", "6", "--eval-every", "2", "--out",
            str(tmp_path / "run"), "--compile", "--dtype", "bf16",
            *[a if a != "cpu" else "cuda" for a in LM]]  # fmt: skip
    script = f"""
import json, sys
from torch._dynamo.utils import counters
import attnlab.train.loop as loop
evaluate, changed = loop.evaluate, []
def watched(*args, **kwargs):
    before = sum(counters["frames"].values())
    result = evaluate(*args, **kwargs)
    changed.append(sum(counters["frames"].values()) != before)
    return result
loop.evaluate = watched
from attnlab.cli import main
code = main({argv!r})
print("SEEN " + json.dumps({{"matplotlib": "matplotlib" in sys.modules, "compiled": changed}}))
sys.exit(code)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.split("SEEN ", 1)[1])
    assert seen == {"matplotlib": False, "compiled": [False, False, False]}
    record = json.loads((tmp_path / "run" / TIMING_FILE).read_text())
    total = sum(p["seconds"] for p in record["phases"])
    assert total + record["other_s"] == pytest.approx(record["wall_s"], abs=1e-5)
    assert _phases(record)["evaluation"]["count"] == 3
    assert (tmp_path / "run" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
