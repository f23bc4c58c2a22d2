"""Shared fixtures: a fixed seed for every test, thread settings, tiny configs.

The tests mirror the source (tests/nn/ for attnlab.nn, tests/train/ for attnlab.train, ...); the
helpers they share (tiny_configs, hf_dirs, explore_models, oracle_params) live here at the top,
which is put on sys.path for every test module.
"""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import pytest
import torch

# Tests use tiny tensors, where threads cost more than they give; two xdist workers share two
# cores, so one intra-op thread each also avoids oversubscription.
torch.set_num_threads(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared helpers

# Tests never reach the network: a name that looks like a Hugging Face hub id (a relative path
# that does not exist, say) is looked up in the local cache only, here and in subprocesses.
os.environ["HF_HUB_OFFLINE"] = "1"

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


@pytest.fixture(autouse=True)
def _seed():
    # Training and benchmarks flush denormals process-wide; hypothesis refuses to run then.
    torch.set_flush_denormal(False)
    random.seed(0)
    np.random.seed(0)  # noqa: NPY002 - code under test may use the legacy global RNG
    torch.manual_seed(0)
    yield


@pytest.fixture
def tinyshakespeare() -> str:
    path = os.path.join(SHARED_DATA, "tinyshakespeare.txt")
    if not os.path.exists(path):
        pytest.skip("../shared/data/tinyshakespeare.txt not present")
    return path


@pytest.fixture
def replays(monkeypatch) -> list[int]:
    """A one-item counter of the compiled decode steps that ran as a ``fast.replay.Replay``."""
    from attnlab.fast import replay as steppers

    calls = [0]
    original = steppers.Replay.__call__

    def counted(self, ids):
        calls[0] += 1
        return original(self, ids)

    monkeypatch.setattr(steppers.Replay, "__call__", counted)
    return calls
