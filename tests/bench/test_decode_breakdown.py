"""The decode-step diagnostic (benchmarks/decode_breakdown.py) on a toy model.

Its timings mean nothing here; what is tested is that the four ways of running the compiled step
run, and that replaying the recorded arguments without dynamo gives the full path's logits (the
premise of comparing their times; the script raises otherwise). It runs in a fresh process, as
the script requires.
"""

import re
import subprocess
import sys
from pathlib import Path

from attnlab.bench.generation import build_pair
from attnlab.bench.lm_train import TINY_SHAPES

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_breakdown.py"


def test_breakdown_times_every_layer_and_replays_the_same_logits():
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "small", "--tiny"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    rows = dict(re.findall(r"^  (full|no-guards|direct|call) +([0-9.]+) ms", run.stdout, re.M))
    assert set(rows) == {"full", "no-guards", "direct", "call"}
    assert all(float(ms) > 0 for ms in rows.values())
    # what dynamo collects on every call: each parameter, the token, and per layer the cache's
    # k and v buffers and its fill length
    shape = TINY_SHAPES["small"]
    _, model = build_pair(shape, 20)
    inputs = int(re.search(r"graph inputs per call: (\d+)", run.stdout).group(1))
    assert inputs == len(list(model.parameters())) + 1 + 3 * shape.n_layers
