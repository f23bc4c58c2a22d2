"""kit/gating: the sweep's choice (ties, bracketing, grid extension up to its limit) and the
doubling runs, on a fake training function (no model is trained)."""

from __future__ import annotations

import math

from attnlab.lab.kit.gating import Sweep, choose, gate_arms


def _fake(job):
    """A loss with its optimum at lr = arm's best rate, lower after more steps (scale)."""
    best, lr, scale, seed, quick, data = job
    if best == "flat":
        return {"metric": 3.3 + 0.001 * seed}
    return {"metric": abs(math.log10(lr / best)) + 1.0 / scale, "seed": seed}


SWEEP = Sweep(grid=(1e-3, 3e-3, 1e-2), tolerance=0.01, metric="loss", max_extensions=2)


def test_choice_ties_go_to_the_middle_and_edges_are_not_bracketed():
    assert choose({1.0: 3.3, 2.0: 3.3005, 3.0: 3.2999}, tie=0.01) == 2.0
    assert choose({1.0: 1.0, 2.0: 2.0, 3.0: 3.0}, tie=0.01) == 1.0
    assert choose({1.0: math.inf, 2.0: math.inf}, tie=0.01) == 1.0  # diverged: go lower


def test_gate_arms_extends_an_edge_choice_up_to_its_limit_and_doubles_the_first_seed():
    out = gate_arms(_fake, [3e-3, 3e-2, 1.0, "flat"], SWEEP, [0, 1, 2], False, None, workers=1)
    inner = out[3e-3]
    assert inner.chosen == 3e-3 and inner.bracketed and sorted(inner.scores) == list(SWEEP.grid)
    assert [r["seed"] for r in inner.runs] == [0, 1, 2] and inner.doubling_seeds == [0]
    doubling = inner.doubling(SWEEP, steps=100)
    assert doubling.at_steps == [1.0] and doubling.at_double == [0.5] and not doubling.converged
    edge = out[3e-2]  # the best rate lies one step beyond the grid: found and bracketed
    assert edge.chosen == 3e-2 and edge.bracketed and len(edge.scores) == 5
    far = out[1.0]  # beyond the extension limit: still at the edge, reported unbracketed
    assert len(far.scores) == 5 and not far.bracketed
    assert not far.learning_rate(SWEEP).bracketed
    flat = out["flat"]  # the same loss at every rate: a converged failure, bracketed
    assert flat.chosen == 3e-3 and flat.bracketed and flat.doubling(SWEEP, 100).converged


def _falling_job(job):
    """A toy run whose loss falls as 1/steps for arm "slow" and is flat for arm "flat"."""
    arm, lr, steps, seed = job
    return abs(math.log(lr / 3e-3)) + (1.0 / steps if arm == "slow" else 0.5)


def test_train_gated_doubles_the_steps_until_the_doubling_settles_or_the_cap():
    from attnlab.lab.kit.gating import train_gated

    def gated(max_doublings):
        return train_gated(
            _falling_job, ["slow", "flat"], lambda a, lr, n, s: (a, lr, n, s), lambda r: r,
            grid=[1e-3, 3e-3, 1e-2], steps=10, seeds=[0, 1], higher_is_better=False, workers=1,
            chosen_on="toy", settled=lambda at, twice: abs(at - twice) <= 0.01,
            max_doublings=max_doublings,
        )  # fmt: skip

    runs = gated(5)
    # 1/S - 1/2S: 0.05, 0.025, 0.0125 (S = 10, 20, 40) too large, 0.00625 at S = 80 settles
    assert runs.steps_of("slow") == 80 and runs.steps_of("flat") == 10
    assert runs.per["slow"] == [_falling_job(("slow", 3e-3, 80, s)) for s in (0, 1)]
    assert sorted(runs.ladder["slow"]) == [10, 20, 40, 80, 160]
    doubling = runs.doubling("slow", lambda r: r, 0.01, "toy loss")
    assert doubling.steps == 80 and doubling.converged
    capped = gated(2)  # the cap: S at most 10 * 2**2 = 40, still falling there
    assert capped.steps_of("slow") == 40
    assert not capped.doubling("slow", lambda r: r, 0.01, "toy loss").converged
    assert capped.doubling("flat", lambda r: r, 0.01, "toy loss").converged
