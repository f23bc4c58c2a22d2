"""Every script in examples/ runs as a user would run it (a fresh process, no arguments, no
network) and prints what its docstring promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXPECTED = {  # script -> a line its output must contain
    "attention_by_hand.py": "row sums:",
    "train_tiny_lm.py": "greedy continuation of 'the ':",
    "look_inside.py": "patching layer 0 changes the last logits by",
    "pretrained_model.py": "attnlab vs transformers GPT-2: max |logit difference|",
}


def test_every_example_is_listed():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs(script, tmp_path):
    if script == "pretrained_model.py":
        pytest.importorskip("transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "error::UserWarning"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert EXPECTED[script] in done.stdout
    assert "Traceback" not in done.stderr
