"""The decode-step diagnostic (benchmarks/decode_breakdown.py) on a toy model.

Its timings mean nothing here; what is tested is that the four ways of running the compiled step
run, and that replaying the recorded arguments without dynamo gives the full path's logits (the
premise of comparing their times).
"""

import importlib.util
from pathlib import Path

from attnlab.bench.generation import build_pair
from attnlab.bench.lm_train import TINY_SHAPES

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "decode_breakdown.py"


def load_script():
    spec = importlib.util.spec_from_file_location("decode_breakdown", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_breakdown_times_every_layer_and_replays_the_same_logits():
    script = load_script()
    shape = TINY_SHAPES["small"]
    result = script.breakdown(shape, prompt=8, new=12, rounds=1)  # raises if logits differ
    assert set(result["ms_per_step"]) == set(script.KINDS)
    assert all(ms > 0 for ms in result["ms_per_step"].values())
    # what dynamo collects on every call: each parameter, the token, and per layer the cache's
    # k and v buffers and its fill length
    _, model = build_pair(shape, 20)
    n_params = len(list(model.parameters()))
    assert result["graph_inputs"] == n_params + 1 + 3 * shape.n_layers
