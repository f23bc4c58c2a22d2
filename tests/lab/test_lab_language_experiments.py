"""Experiments long_range, extrapolation, sampling, char_lm and translation (quick forms).

Each quick run must write its report and figures; directions are asserted only where they are
deterministic (untrained learned position rows, teacher-forced == greedy exact match, greedy
decoding's determinism, BLEU of identical texts, resuming a finished run trains nothing).
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer, ReverseTask
from attnlab.errors import DataError, UserError
from attnlab.lab import run_experiment
from attnlab.lab.experiments import char_lm, long_range, sampling, translation
from attnlab.lab.kit import char_models, copy_task
from attnlab.lab.kit.corpus import generated_text, text_windows, unigram_bigram, windows
from attnlab.lab.kit.fit import FitConfig, fit
from attnlab.lab.kit.seq2seq import masked_seq2seq_loss, pair_batch, teacher_forced_hits
from attnlab.lab.kit.verdict import VERDICTS
from attnlab.models import build_model
from attnlab.train import greedy_decode


def _check_written(path, figures):
    assert path.name == "README.md" and path.is_file()
    data = json.loads((path.parent / "report.json").read_text())
    assert data["quick"] is True and data["verdict"] in VERDICTS
    for fig in figures:
        assert (path.parent / fig).is_file(), fig
    return data


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("lab_more")


# long_range (its quick report: tests/lab/test_lab_long_range.py) ---------------------------
@pytest.mark.parametrize("name", ["transformer", "bahdanau", "lstm"])
def test_teacher_forced_exact_match_equals_greedy_decoding(name):
    tok = CharTokenizer(long_range.ALPHABET)
    pairs = ReverseTask(min_len=3, max_len=7, alphabet=long_range.ALPHABET).make_pairs(40, seed=1)
    torch.manual_seed(0)
    model = build_model(long_range.model_config(name, tok.vocab_size, 16, quick=True))
    batch = pair_batch(pairs, tok)
    # Make some rows right: train a little so the comparison is not all-False.
    fit(
        model,
        tuple(batch),
        masked_seq2seq_loss,
        FitConfig(steps=30, batch_size=40, lr=1e-2, warmup_steps=1),
    )
    _, hits = teacher_forced_hits(model, batch)
    outputs = greedy_decode(
        model, batch.src, batch.src_mask, bos_id=tok.bos_id, eos_id=tok.eos_id, max_new_tokens=12
    )
    greedy = torch.tensor([out == tok.encode(t) for out, (_, t) in zip(outputs, pairs)])
    assert torch.equal(hits, greedy)


# copy task (extrapolation's quick report: tests/lab/test_lab_extrapolation.py) ---------
def test_copy_examples_layout():
    ids, targets = copy_task.copy_examples(3, [1, 2, 3], 8, np.random.default_rng(0))
    row = ids[2].tolist()  # <bos> a b c | a b c <eos>
    assert row[0] == copy_task.BOS and row[4] == copy_task.SEP and row[8] == 2
    assert row[1:4] == row[5:8] and len(set(row[1:4])) == 3
    assert targets[2].tolist() == [-100] * 4 + row[5:9]  # predicts the copy and <eos> only
    a = int(ids[0, 1])
    assert ids[0].tolist() == [1, a, 3, a, 2] + [0] * 4  # n = 1, right-padded to n = 3
    assert (targets[0] != -100).sum() == 2


# char_lm and sampling ------------------------------------------------------------------------
def _check_the_lm_is_gated(report):
    assert report.arms == [char_models.ARM] and report.thresholds
    assert all(t.source for t in report.thresholds)
    (c,) = report.competence
    assert c.arm == char_models.ARM and c.gated and not c.higher_is_better
    assert len(c.lr.grid) >= 3 and "validation loss" in c.lr.chosen_on
    assert c.doubling.tolerance == char_models.TOLERANCE and c.doubling.steps == 40


def test_char_lm_quick_report_and_resume(out, monkeypatch):
    measured = []
    measure = char_lm.measure
    monkeypatch.setattr(char_lm, "measure", lambda *a: measured.append(measure(*a)) or measured[-1])
    report, path = run_experiment("char_lm", quick=True, out_dir=out / "char_lm")
    _check_written(path, ["loss.png"])
    _check_the_lm_is_gated(report)
    base = report.metrics["baselines"]
    assert base["bigram"] < base["unigram"]  # context helps even for counts
    assert len(report.table("samples").rows) == 2 * len(char_lm.PROMPTS)
    # A finished run is reloaded, not retrained: the sampling experiment reuses it this way.
    lr = report.competence[0].lr.chosen
    result, _, _ = char_models.train_char_lm(True, 0, None, out / "char_lm", lr)
    assert result.start_step == result.step == report.metrics["steps"]
    # write_up renders the measured numbers again without training
    monkeypatch.setattr(char_models, "train_job", None)
    again = char_lm.write_up(measured[0], out / "char_lm_again", quick=True)
    assert again.verdict_reason == report.verdict_reason
    assert (out / "char_lm_again" / "loss.png").is_file()


def test_the_data_folder_is_an_argument_and_a_missing_dataset_names_the_fix(tmp_path):
    from attnlab.lab.kit.datasets import MULTI30K, SHAKESPEARE, dataset

    with pytest.raises(UserError, match="has no tinyshakespeare.txt: give data as a folder"):
        char_lm.run(True, tmp_path, 0, data=tmp_path / "nope")
    assert dataset(None, SHAKESPEARE) is None  # no folder given: generated data
    text = tmp_path / "play.txt"
    text.write_text("KING:\nHello.\n", encoding="utf-8")
    assert dataset(text, SHAKESPEARE) == text  # any text file stands for the text
    (tmp_path / "m30k").mkdir()
    (tmp_path / "m30k" / "train.de").write_text("", encoding="utf-8")
    assert dataset(tmp_path / "m30k", MULTI30K) == tmp_path / "m30k"
    with pytest.raises(UserError, match="full translation experiment trains on Multi30k"):
        translation.prepare_data(False, 0, None, tmp_path / "work")


def test_count_baselines_and_generated_text():
    text = "ab" * 200
    base = char_models.count_baselines(text[:300], text[300:])
    assert base["bigram"] < 0.05 < base["unigram"]  # 'a' always follows 'b' and vice versa
    assert generated_text(5, 1) == generated_text(5, 1)
    assert generated_text(5, 1).count(":\n") == 5


def test_corpus_windows_and_splits():
    assert windows(torch.arange(10), 2).tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    train, val, chars, source = text_windows(True, 16)
    assert train.size(1) == val.size(1) == 17 and source == "a generated play-like text"
    assert int(train.max()) < len(chars) and len(train) > 8 * len(val) > 0
    uni, bi = unigram_bigram(train, val, len(chars))
    assert 0 < bi < uni  # the previous character helps


def test_sampling_quick_report_greedy_is_deterministic(out):
    # The char_lm test's folder: its gated models (sweep, seeds, doubling) are reloaded by run
    # directory, not trained again, as in a full run (run alone, this test trains them itself).
    report, path = run_experiment("sampling", quick=True, out_dir=out / "char_lm")
    _check_written(path, ["quality_diversity.png"])
    by = {r["strategy"]: r for r in report.metrics["rows"]}
    assert by["greedy"]["unchanged"] == 1.0  # argmax does not depend on the seed
    assert by["sampling tau=1"]["unchanged"] < 1.0
    assert set(sampling.STRATEGIES) < set(by)
    _check_the_lm_is_gated(report)


def test_diversity_metrics_on_known_texts():
    assert sampling.distinct_n(["a b a b"], 1) == 0.5
    assert sampling.distinct_n(["a b", "c d"], 2) == 1.0
    assert sampling.repetition("x y z w x y z w x y z w") == pytest.approx(1 - 4 / 9)
    assert sampling.repetition("one two three four five") == 0.0
    assert sampling.real_word_rate(["the kng"], {"the", "king"}) == 0.5


# translation ---------------------------------------------------------------------------------
def test_translation_quick_report_and_resume(out, monkeypatch):
    measured = []
    measure = translation.measure
    monkeypatch.setattr(
        translation, "measure", lambda *a: measured.append(measure(*a)) or measured[-1]
    )
    report, path = run_experiment("translation", quick=True, out_dir=out / "translation")
    _check_written(
        path,
        ["loss.png", "val_bleu.png", "bleu_by_length.png", "cross_attention.png", "alignment.png"],
    )
    rows = report.table("test scores per model (mean (min-max) over seeds)").rows
    quick_steps = translation.STEPS[True]
    assert [r["steps"] for r in rows] == [quick_steps] * 3  # every arm at the matched budget
    assert report.metrics["steps"] == quick_steps
    labels = [r.label for r in translation.recipes(True).values()]
    assert report.arms == labels and [c.arm for c in report.competence] == labels
    for c in report.competence:  # every arm, the plain LSTM too: a swept rate and a doubling
        assert c.gated and len(c.lr.grid) >= 3 and c.doubling.steps == quick_steps
        assert c.doubling.tolerance == translation.TOLERANCE and c.doubling.seeds == [0]
    assert report.thresholds and all(t.source for t in report.thresholds)
    if any(not c.passed for c in report.competence):
        assert report.verdict == "inconclusive"
    _check_seeds_and_curves(report)
    # Bahdanau et al. Fig. 2: BLEU by source length for the three models, from the same runs
    by = report.metrics["bleu_by_length"]
    assert set(by) == {"transformer", "bahdanau", "lstm"}
    buckets = list(by["transformer"])
    assert buckets and all(list(b) == buckets for b in by.values())
    assert all(0 <= v[0] <= 100 for b in by.values() for v in b.values())
    table = report.table(
        "lower-cased test BLEU (beam 5) by source length, mean (min-max) over seeds"
    )
    assert [r["source length (words)"] for r in table.rows] == buckets
    work = out / "translation" / "work" / "seed0"
    chosen = {  # each arm's chosen rate, from the test-score table
        name: float(next(r for r in rows if r["model"] == recipe.label)["lr"])
        for name, recipe in translation.recipes(True).items()
    }
    sweep = report.table(
        f"learning-rate sweep (seed 0, {quick_steps} steps each): validation BLEU (greedy, "
        "40 sentences) at the last evaluation"
    ).rows
    for name, recipe in translation.recipes(True).items():
        points = [r for r in sweep if r["model"] == recipe.label]
        assert [r["chosen"] for r in points].count(True) == 1
        for r in points:  # each sweep point trained in its own directory
            run_dir = work / translation.run_name(name, float(r["lr"]), True)
            assert (run_dir / "metrics.jsonl").is_file()
        doubled = translation.run_name(name, chosen[name], True, 2 * quick_steps)
        assert (work / doubled / "metrics.jsonl").is_file()
    assert translation.run_name("lstm", 3e-3, True) == "lstm"  # the recipe's rate
    assert translation.run_name("lstm", 9e-3, True) == "lstm-lr0.009"
    assert translation.run_name("lstm", 3e-3, True, 120) == "lstm-steps120"
    assert translation.run_name("lstm", 1e-3, False, 5000) == "lstm-lr0.001-steps5000"
    recipe = translation.recipes(True)["lstm"]
    cfg = translation.train_config(True, 0, work / "data", **recipe.train)
    assert cfg.steps == quick_steps and cfg.dtype == "fp32"
    result = translation.train_one(recipe, cfg, work / "lstm")
    assert result.start_step == result.step == quick_steps  # finished: reloaded, nothing retrained
    # write_up renders the measured numbers again without training
    monkeypatch.setattr(translation, "train_one", None)
    again = translation.write_up(measured[0], out / "translation_again", quick=True)
    assert again.verdict_reason == report.verdict_reason
    assert (out / "translation_again" / "bleu_by_length.png").is_file()
    # a later piece on a fresh machine (the work directory gone) reloads every finished job
    # from the results kept beside the report and trains nothing
    kept = sorted(p.stem for p in (out / "translation" / translation.JOBS_DIR).glob("*.json"))
    for name, lr in chosen.items():  # each arm's chosen run and its doubling
        for steps in (None, 2 * quick_steps):
            assert f"seed0-{translation.run_name(name, lr, True, steps)}" in kept
    shutil.rmtree(out / "translation" / "work")
    fresh, _ = run_experiment("translation", quick=True, out_dir=out / "translation")
    assert fresh.verdict_reason == report.verdict_reason and fresh.per_seed == report.per_seed
    assert not (out / "translation" / "work" / "seed0" / "transformer").exists()


def _check_seeds_and_curves(report):
    assert report.seeds == [0] and set(report.per_seed) == {"transformer", "bahdanau", "lstm"}
    for name, num in report.per_seed.items():
        assert len(num["lc BLEU beam 5"]) == 1 and 0 <= num["lc BLEU beam 5"][0] <= 100
        steps, _ = report.metrics["val_bleu"][name][0]
        every, last = translation.EVAL_EVERY[True], translation.STEPS[True]
        assert steps == list(range(every, last + 1, every))  # the curve, every EVAL_EVERY steps


def test_translation_full_recipes_are_matched_and_recurrent_arms_fp32():
    full = translation.recipes(False)
    assert {r.train["steps"] for r in full.values()} == {2500}
    assert full["bahdanau"].train["dtype"] == full["lstm"].train["dtype"] == "fp32"
    cfg = translation.train_config(False, 1, translation.WORK_DIR, **full["lstm"].train)
    assert cfg.eval_every == 250 and cfg.eval_batches * cfg.batch_size == 256
    assert cfg.save_every == cfg.eval_every and cfg.seed == 1


@pytest.mark.parametrize("native_bf16", [False, True])
def test_translation_runs_of_another_precision_never_mix(monkeypatch, tmp_path, native_bf16):
    """The Transformer trains in bf16 only where the CPU has it natively: its runs (directory and
    kept result) carry the precision in their name, so a piece on a CPU of the other kind trains
    its own runs instead of resuming or reusing those of the other precision."""
    monkeypatch.setattr(translation, "cpu_has_native_bf16", lambda: native_bf16)
    tag = "-bf16" if native_bf16 else ""
    assert translation.recipes(False)["transformer"].train["dtype"] == ("bf16" if tag else "fp32")
    assert translation.run_name("transformer", 1e-3, False) == f"transformer{tag}"
    assert translation.run_name("transformer", 3e-3, False, 5000) == (
        f"transformer-lr0.003{tag}-steps5000"
    )
    assert translation.run_name("lstm", 3e-3, False) == "lstm"  # fp32 on every CPU
    assert translation.run_name("transformer", 2e-3, True) == "transformer"  # quick: fp32
    job = ("transformer", 1e-3, 2500, tmp_path, None, 1, False, tmp_path / "kept")
    assert translation.run_dir_of(job) == tmp_path / "seed1" / f"transformer{tag}"


def test_bleu_scores_of_identical_and_recased_text():
    refs = ["A dog runs in the park.", "Two men sit on a bench."]
    assert translation.bleu_scores(refs, refs) == pytest.approx(
        {"bleu": 100.0, "chrf": 100.0, "lc_bleu": 100.0}
    )
    lower = [r.lower() for r in refs]
    scores = translation.bleu_scores(lower, refs)
    assert scores["lc_bleu"] == pytest.approx(100.0) and scores["bleu"] < 100.0


def test_synthetic_pairs_agree_in_gender_and_translate_consistently():
    pairs = translation.synthetic_pairs(200, np.random.default_rng(0))
    for de, en in pairs:
        assert de[0].isupper() and en[0].isupper() and de.endswith(".") and en.endswith(".")
        if de.startswith("Eine "):
            assert any(f" {n} " in de for n, _, g in translation.NOUNS if g == "f")
        if en.startswith("The "):
            assert de.split()[0] in ("Der", "Die", "Das")


def test_translation_names_missing_files(tmp_path):
    (tmp_path / "train.de").write_text("Hallo\n")
    with pytest.raises(DataError, match="train.en.*test_2016_flickr.de"):
        translation.prepare_data(False, 0, tmp_path, tmp_path / "work", write=False)


def test_model_configs_are_valid():
    for name in long_range.MODELS:
        assert isinstance(long_range.model_config(name, 20, 10, quick=False), ModelConfig)
    for recipe in translation.recipes(False).values():
        ModelConfig(**recipe.model)


def test_translation_bleu_by_source_length():
    sources = ["a b c", "a b c d e f g h i", "w " * 20]
    assert translation.length_buckets(sources, False) == ["1-7", "8-10", "18+"]
    refs = ["A dog runs.", "Two men sit on a bench in the park.", "A cat sleeps."]
    hyps = [refs[0], refs[1], "nothing alike at all"]
    by = translation.bleu_by_length(sources, hyps, refs, False)
    assert list(by) == ["1-7", "8-10", "18+"]  # empty buckets are left out
    assert by["1-7"] == pytest.approx(100.0) and by["8-10"] == pytest.approx(100.0)
    assert by["18+"] == pytest.approx(0.0)  # no n-gram in common


def test_translation_gate_never_chooses_a_diverged_rate(tmp_path, monkeypatch):
    def fake_job(job):  # the recipe's rate learns; any other rate diverges
        name, lr, steps, *_ = job
        if lr == translation.recipes(True)[name].train["lr"]:
            return {"curves": {"val_bleu": ([20, 40, 60], [1.0, 2.0, 3.0])}, "diverged": ""}
        diverged = "the training loss became nan"
        return {"curves": {"val_bleu": ([20, 40], [5.0, 9.0])}, "diverged": diverged}

    monkeypatch.setattr(translation, "job_result", fake_job)
    runs = translation.gated_runs(True, tmp_path, None, [0], tmp_path / "kept")
    for name, recipe in translation.recipes(True).items():
        assert runs.lr[name].chosen == recipe.train["lr"] and runs.lr[name].bracketed
        assert runs.sweeps[name][recipe.train["lr"] * 3] == -math.inf
    last = {"curves": {"val_bleu": ([20], [4.0])}, "diverged": ""}
    assert translation.val_bleu_last(last) == 4.0
    # a run that diverged at the chosen rate has no test scores: one error naming it
    runs.per["lstm"][0] = {"curves": {"val_bleu": ([], [])}, "diverged": "the loss became nan"}
    with pytest.raises(UserError, match="lstm diverged on seed 0 at its chosen learning rate"):
        translation.chosen_runs(runs)


def test_translation_runs_say_where_they_are_at_each_validation(capsys):
    on_event = translation.progress("seed0/transformer", 2500)
    on_event("resumed", {"path": "x", "step": 500})
    on_event("record", {"step": 510, "train_loss": 3.0, "elapsed_s": 1000.0})  # not a validation
    on_event("record", {"step": 750, "val_bleu": 12.345, "elapsed_s": 3000.0})
    assert capsys.readouterr().err.splitlines() == [
        "translation: seed0/transformer: continues from its checkpoint at step 500/2500",
        "translation: seed0/transformer: step 750/2500, validation BLEU (greedy) 12.3, 4.00 s/step"
        " so far, ~1.9 h to go for this run",
    ]
