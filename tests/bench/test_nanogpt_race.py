"""The nanoGPT side-by-side script (benchmarks/nanogpt_race.py), checked on the CPU.

CI has no nanoGPT checkout (and no network), so a stand-in ``train.py`` prints evaluation lines in
nanoGPT's format; what is tested is the harness: warm-up then interleaved rounds, evaluation lines
time-stamped as they arrive, the time to the target loss, attnlab's own training / setup split
read from its summary line, and the report. The figures in benchmarks/cuda/ come from a GPU.
"""

import json
import subprocess
import sys

from bench_scripts import BENCHMARKS, load_script

SCRIPT = BENCHMARKS / "nanogpt_race.py"
STUB = """\
import sys, time
steps = int([a for a in sys.argv if a.startswith("--max_iters=")][-1].split("=")[1])
for step, loss in ((0, 4.2), (steps // 2, 1.6), (steps, 1.44)):
    time.sleep(0.05)
    print(f"step {step}: train loss {loss:.4f}, val loss {loss:.4f}", flush=True)
"""


def test_time_to_target_and_the_ratio_to_nanogpts_wall_time():
    race = load_script("nanogpt_race")
    curve = [{"step": 0, "val_loss": 4.0, "seconds": 1.0},
             {"step": 250, "val_loss": 1.449, "seconds": 9.0},
             {"step": 500, "val_loss": 1.43, "seconds": 12.0}]  # fmt: skip
    assert race.first_at_or_below(curve, 1.45)["seconds"] == 9.0
    assert race.first_at_or_below(curve, 1.0) is None
    runs = {
        "nanogpt": [{"wall_s": 40.0, "curve": curve, "tail": []}] * 2,
        "attnlab_gpu_char_1250": [
            {"wall_s": 15.0, "curve": curve, "tail": ["time: 10.0 s of training (8.0 ms per "
             "step after the first), 5.0 s of setup and evaluation (...)"]}] * 2,
    }  # fmt: skip
    summary = race.summarise(runs, 1.45)
    assert summary["ratios"] == {"attnlab_gpu_char_1250_time_to_target_vs_nanogpt_wall": 9 / 40}
    row = summary["contenders"]["attnlab_gpu_char_1250"]
    assert row["training_s"] == [10.0, 10.0] and row["setup_and_evaluation_s"] == [5.0, 5.0]
    assert race.ATTNLAB_EVAL.search("step 250: train_loss 1.5  val_loss 1.449  val_ppl 4.3")
    assert "phases_s" not in row  # no timing.json: the two totals alone


def test_the_phase_table_of_attnlab_runs_adds_the_exit():
    race = load_script("nanogpt_race")
    tail = ["time: 10.0 s of training (8.0 ms per step after the first), 5.0 s of setup and "
            "evaluation (15.0 s since the command started)"]  # fmt: skip
    timing = {"phases": [{"name": "imports", "seconds": 2.0, "count": 1},
                         {"name": "training", "seconds": 10.0, "count": 9}],
              "wall_s": 15.0, "other_s": 3.0}  # fmt: skip
    rounds = [{"wall_s": 16.5, "tail": tail, "timing": timing, "curve": []},
              {"wall_s": 16.0, "tail": tail, "curve": []}]  # fmt: skip
    assert race.phase_table(rounds) == {
        "imports": [2.0, None], "training": [10.0, None], "other": [3.0, None], "exit": [1.5, 1.0]
    }  # fmt: skip
    row = race.summarise({"attnlab_same": rounds}, 1.45)["contenders"]["attnlab_same"]
    assert row["exit_s"] == [1.5, 1.0] and row["phases_s"]["exit"] == [1.5, 1.0]
    assert "| exit | 1.50 / 1.00 |" in race.markdown(
        {"summary": {"contenders": {"attnlab_same": row}, "ratios": {}}, "target": 1.45,
         "command": "c", "machine": "m", "date": "d", "rounds": 2}
    )  # fmt: skip


def test_a_tiny_race_runs_both_sides_and_writes_the_report(tmp_path):
    nano = tmp_path / "nanogpt"
    (nano / "config").mkdir(parents=True)
    (nano / "config" / "train_shakespeare_char.py").write_text("")
    (nano / "train.py").write_text(STUB)
    data = nano / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    text = tmp_path / "input.txt"
    text.write_text("First Citizen: we are accounted poor citizens. " * 400)
    (data / "input.txt").write_text(text.read_text())
    (data / "train.bin").write_bytes(b"")  # prepared: nothing to download
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--nanogpt", str(nano), "--text", str(text), "--tiny",
         "--rounds", "1", "--only", "nanogpt,attnlab_same", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / "nanogpt.json").read_text())
    rows = result["summary"]["contenders"]
    assert set(rows) == {"nanogpt", "attnlab_same"}
    assert rows["nanogpt"]["final_val_loss"] == [1.44]
    assert rows["nanogpt"]["step_at_target"] == [40]
    assert len(result["runs"]["attnlab_same"][0]["curve"]) >= 2  # evaluations at 20 and 40
    assert rows["attnlab_same"]["training_s"][0] > 0
    phases = rows["attnlab_same"]["phases_s"]  # the run's timing.json, and its exit
    assert {"imports", "data", "first step", "training", "evaluation", "other", "exit"} <= set(
        phases
    )
    assert phases["exit"][0] > 0
    assert "nanoGPT's shakespeare-char run vs attnlab" in (out / "NANOGPT.md").read_text()
