"""The lab's tests run each experiment's jobs in the test's own process.

A quick run hands its jobs to a pool of spawned processes (:func:`attnlab.lab.kit.seeds.run_plans`),
each of which imports torch and attnlab again (3-5 s of CPU per worker, for jobs that often take
less) on two cores that pytest-xdist's two workers already fill. So here every lab test runs with
``ATTNLAB_LAB_WORKERS=1`` (the pool's own tests in test_lab_scaffold.py lift it), and what the pool
needs is still checked on every job that would have gone to it: the function, each job and each
result go through pickle, as they would between processes, and the job runs on the unpickled copy
of its tuple.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import pytest

from attnlab.lab.kit import gating, seeds


class ThroughPickle:
    """``fn`` with its job and its result sent through pickle, as a spawned worker would."""

    def __init__(self, fn: Any) -> None:
        pickle.dumps(fn)  # a worker imports the function by name: a local one fails here
        self.fn = fn

    def __call__(self, job: Any) -> Any:
        result = self.fn(pickle.loads(pickle.dumps(job)))
        return pickle.loads(pickle.dumps(result))


@pytest.fixture(autouse=True, scope="module")
def _lab_jobs_in_process():
    # per module (autouse first), so that module-scoped fixtures running an experiment have it too
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNLAB_LAB_WORKERS", "1")
        pooled = seeds.run_plans

        def run_plans(fn, plans, workers=2, cost=None):
            # a pool the cap keeps in-process checks pickling; a real pool (the pool's own tests
            # lift the cap) pickles the function itself, which a class from conftest cannot be
            in_process = os.environ.get("ATTNLAB_LAB_WORKERS") == "1"
            checked = ThroughPickle(fn) if workers > 1 and in_process else fn
            return pooled(checked, plans, workers, cost)

        patch.setattr(seeds, "run_plans", run_plans)  # run_jobs and run_arms call it here
        patch.setattr(gating, "run_plans", run_plans)  # the gate imported it by name
        yield
