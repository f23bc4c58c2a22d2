"""The translation precision probe (benchmarks/translation_dtype.py), checked on the CPU.

The probe trains the full-size recipes on Multi30k; here it runs on the experiment's quick recipes
and generated sentence pairs for a few steps, so what is tested is that it still drives today's
experiment and training API and that each row carries the figures its report prints.
"""

import dataclasses
import math
import subprocess
import sys

from attnlab.lab.experiments import translation
from bench_scripts import BENCHMARKS, load_script

SCRIPT = BENCHMARKS / "translation_dtype.py"


def test_the_probe_measures_a_step_and_an_evaluation(monkeypatch, tmp_path):
    probe = load_script("translation_dtype")
    quick_recipes, quick_config = translation.recipes, translation.train_config
    longer = {  # the quick models, with a schedule longer than the probe's 20 steps
        name: dataclasses.replace(r, train={**r.train, "steps": 40})
        for name, r in quick_recipes(True).items()
    }
    monkeypatch.setattr(translation, "recipes", lambda quick: longer)
    monkeypatch.setattr(
        translation, "train_config", lambda quick, *a, **kw: quick_config(True, *a, **kw)
    )
    translation.prepare_data(True, 0, None, tmp_path)
    row = probe.probe("lstm", "fp32", 20, tmp_path)
    assert row["arm"] == "lstm" and row["dtype"] == "fp32" and row["steps"] == 20
    step_keys = [k for k in row if k.startswith("CPU s/step (steps ")]
    assert step_keys == ["CPU s/step (steps 10-20)"]  # logged every 10 steps
    assert row[step_keys[0]] > 0 and row["wall s/step"] > 0 and row["eval wall s"] > 0
    assert math.isfinite(row["train loss (last 20 steps)"]) and math.isfinite(row["val loss"])


def test_the_probe_needs_its_data_named_and_two_logged_steps(tmp_path):
    for args, named in (([], "--data"), (["--data", str(tmp_path), "--steps", "15"], "--steps")):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and named in done.stderr.splitlines()[-1]
