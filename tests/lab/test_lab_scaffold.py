"""The experiments' shared scaffolding: verdict fields, seeds and jobs, charts over seeds, the
evaluation loss."""

from __future__ import annotations

import time
from collections.abc import Generator
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.collections import PolyCollection

from attnlab.config import ModelConfig
from attnlab.lab.kit.charts import curves_chart, seeds_chart
from attnlab.lab.kit.fit import (
    FitConfig,
    accuracy,
    block_grad_norms,
    classification_loss,
    eval_loss,
    fit,
    fit_classifier,
    lm_loss,
)
from attnlab.lab.kit.seeds import run_arms, run_jobs, run_plans, start_seeds
from attnlab.lab.kit.tasks import TaskData, counting
from attnlab.lab.kit.verdict import Competence, outcome
from attnlab.models import build_model


def _square(job: int) -> int:
    return job * job


def _echo(job: tuple) -> tuple:
    return job


def _fail_first(job: tuple) -> int:
    n, marks = job
    if n == 0:
        raise ValueError("job 0 failed")
    time.sleep(0.5)
    (Path(marks) / str(n)).touch()
    return n


def _wait_or_mark(job: tuple) -> str:
    """("wait", dir): waits (up to 60 s) for the file "go" in dir; ("mark", dir, name): makes it."""
    if job[0] == "mark":
        (Path(job[1]) / job[2]).touch()
        return job[2]
    for _ in range(600):
        if (Path(job[1]) / "go").exists():
            return "released"
        time.sleep(0.1)
    return "timed out"


def _plan(steps: list) -> Generator:
    for jobs in steps:  # noqa: UP028 (yield from a list cannot take the results sent)
        yield jobs


def test_run_plans_moves_each_plan_on_while_another_still_runs(tmp_path, monkeypatch):
    """A plan's next jobs start as soon as its own are done: plan b's third job releases plan
    a's only job, which would wait forever (here: time out) if b waited for a's job first,
    as rounds of jobs across plans did."""
    monkeypatch.delenv("ATTNLAB_LAB_WORKERS", raising=False)
    d = str(tmp_path)
    a = _plan([[("wait", d)]])
    b = _plan([[("mark", d, "1")], [("mark", d, "2")], [("mark", d, "go")]])
    assert run_plans(_wait_or_mark, [a, b], workers=2)[("wait", d)] == "released"


def test_run_plans_sends_each_plan_its_results_and_runs_a_shared_job_once(monkeypatch):
    monkeypatch.setenv("ATTNLAB_LAB_WORKERS", "1")  # in this process
    calls: list[int] = []

    def square(job: int) -> int:
        calls.append(job)
        return job * job

    sent: list[dict] = []

    def plan(first: int) -> Generator:
        done = yield [first, 3]
        sent.append(done)
        done = yield [done[first] + 1]  # the next job depends on a result
        sent.append(done)

    assert run_plans(square, [plan(1), plan(2)]) == {1: 1, 2: 4, 3: 9, 5: 25}
    assert sorted(calls) == [1, 2, 3, 5]  # 3 asked for twice, run once; 2 done already
    assert sorted(map(sorted, (d.items() for d in sent))) == sorted(
        map(sorted, ({1: 1, 3: 9}.items(), {2: 4, 3: 9}.items(), {2: 4}.items(), {5: 25}.items()))
    )


def test_outcome_reads_the_checks_then_gates():
    ok = [Competence("arm", "accuracy", 0.9, [0.95])]
    assert outcome([True, True], "r", ok, [0], quick=True)["verdict"] == "held"
    assert outcome([True, False], "r", ok, [0], quick=True)["verdict"] == "mixed"
    assert outcome([False, False], "r", ok, [0], quick=True)["verdict"] == "did not hold"
    fields = outcome([True], "because", ok, [0], quick=False)  # one seed is not enough
    assert fields["verdict"] == "inconclusive" and fields["seeds"] == [0]
    assert fields["competence"] == ok and "because" in fields["verdict_reason"]
    missed = [Competence("arm", "accuracy", 0.9, [0.5])]
    assert outcome([True], "r", missed, [0, 1, 2], quick=False)["verdict"] == "inconclusive"


def test_run_jobs_runs_each_job_on_one_thread(monkeypatch):
    monkeypatch.setenv("ATTNLAB_LAB_WORKERS", "1")  # in this process, whatever was asked
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert run_jobs(_square, [3, 1, 2], workers=2, cost=lambda j: j) == {3: 9, 1: 1, 2: 4}
        assert torch.get_num_threads() == 1
        assert start_seeds(5, quick=False) == [5, 6, 7] and start_seeds(5, quick=True) == [5]
        per = run_arms(_echo, ["a", ("b", 2)], [0, 1], quick=True)  # arm x seed, per arm
        assert per == {
            "a": [("a", 0, True), ("a", 1, True)],
            ("b", 2): [("b", 2, 0, True), ("b", 2, 1, True)],
        }
    finally:
        torch.set_num_threads(threads)


def test_run_jobs_starts_no_queued_job_after_a_failure(tmp_path, monkeypatch):
    """A failed (or interrupted) job stops the run: no job waiting for a worker starts after
    it, so an interrupted experiment saves its running arms and exits instead of training the
    rest."""
    monkeypatch.delenv("ATTNLAB_LAB_WORKERS", raising=False)
    with pytest.raises(ValueError, match="job 0 failed"):
        run_jobs(_fail_first, [(n, str(tmp_path)) for n in range(10)], workers=2)
    assert len(list(tmp_path.iterdir())) < 9  # a pre-filled pool queue would run all nine


def test_seeds_chart_draws_the_mean_and_a_band_only_over_several_seeds():
    fig = seeds_chart(
        {"a": ([1, 2], [[1.0, 3.0], [3.0, 5.0]]), "b": ([1, 2], [[0.0, 1.0]])},
        xlabel="x",
        ylabel="y",
        title="t",
        hline=0.5,
        vline=1.5,
    )
    ax = fig.axes[0]
    assert list(ax.lines[0].get_ydata()) == [2.0, 4.0]  # the mean over the two seeds of "a"
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 1  # "a" only
    assert [list(line.get_ydata()) for line in ax.lines[2:]] == [[0.5, 0.5], [0, 1]]  # guides
    smoothed = curves_chart({"run": [[4.0, 2.0, 0.0]]}, title="t", smooth=2).axes[0].lines[0]
    assert list(smoothed.get_ydata()) == [4.0, 3.0, 1.0]


def test_eval_loss_is_the_loss_without_gradients_in_eval_mode():
    torch.manual_seed(0)
    cfg = ModelConfig(kind="decoder_lm", vocab_size=7, d_model=16, max_len=8, dropout=0.1)
    model = build_model(cfg)
    windows = torch.randint(0, 7, (3, 9))
    value = eval_loss(model, (windows,), lm_loss)
    assert not model.training
    with torch.no_grad():
        assert abs(value - float(lm_loss(model, (windows,)))) < 1e-6


def test_majority_rate_is_the_share_of_the_most_common_label():
    data = TaskData(torch.zeros(4, 3, dtype=torch.long), torch.tensor([0, 1, 1, 2]), 5, 3)
    assert data.majority_rate() == 0.5


def test_fit_classifier_is_fit_then_test_accuracy():
    rng = np.random.default_rng(0)
    train, test = counting(64, 4, rng), counting(32, 4, rng)
    cfg = ModelConfig(kind="classifier", vocab_size=3, n_classes=5, d_model=16, max_len=8)
    fit_cfg = FitConfig(steps=3, batch_size=8)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(build_model(cfg))
    result, acc = fit_classifier(models[0], train, test, fit_cfg, seed=1)
    again = fit(models[1], (train.ids, train.labels), classification_loss, fit_cfg, seed=1)
    assert result.losses == again.losses
    assert acc == accuracy(models[1], test.ids, test.labels)


def test_block_grad_norms_are_the_norms_of_each_blocks_gradient():
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="decoder_lm", vocab_size=7, d_model=16, max_len=8))
    ids = torch.randint(0, 7, (3, 9))
    norms = block_grad_norms(model, ids)
    assert len(norms) == len(model.blocks) and model.training
    by_hand = torch.cat([p.grad.flatten() for p in model.blocks[1].parameters()]).norm()
    assert abs(norms[1] - float(by_hand)) < 1e-5 * float(by_hand)
