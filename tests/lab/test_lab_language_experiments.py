"""Experiments long_range, extrapolation, sampling, char_lm and translation (quick forms).

Each quick run must write its report and figures; directions are asserted only where they are
deterministic (untrained learned position rows, teacher-forced == greedy exact match, greedy
decoding's determinism, BLEU of identical texts, resuming a finished run trains nothing).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer, ReverseTask
from attnlab.errors import DataError, UserError
from attnlab.lab import run_experiment
from attnlab.lab.experiments import char_lm, extrapolation, long_range, sampling, translation
from attnlab.lab.kit import char_models, copy_task
from attnlab.lab.kit.corpus import generated_text, text_windows, unigram_bigram, windows
from attnlab.lab.kit.report import VERDICTS
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


# long_range ----------------------------------------------------------------------------------
def test_long_range_quick_report(out):
    report, path = run_experiment("long_range", quick=True, out_dir=out / "long_range")
    _check_written(
        path,
        [
            "accuracy_vs_length.png",
            "exact_vs_length.png",
            "accuracy_per_position.png",
            "alignment_bahdanau.png",
            "cross_attention_transformer.png",
            "dates.png",
        ],
    )
    rows = report.table("reversal: exact match by length").rows
    assert [r["length"] for r in rows] == report.metrics["lengths"]
    token, exact = report.metrics["token_accuracy"], report.metrics["exact_match"]
    assert set(token) == set(exact) == set(long_range.MODELS)
    for name in long_range.MODELS:  # a whole target right implies each of its tokens right
        assert all(0.0 <= e <= t <= 1.0 for e, t in zip(exact[name], token[name]))


@pytest.mark.parametrize("name", ["transformer", "bahdanau", "lstm"])
def test_teacher_forced_exact_match_equals_greedy_decoding(name):
    tok = CharTokenizer(long_range.ALPHABET)
    pairs = ReverseTask(min_len=3, max_len=7, alphabet=long_range.ALPHABET).make_pairs(40, seed=1)
    torch.manual_seed(0)
    model = build_model(long_range.model_config(name, tok.vocab_size, 16, quick=True))
    batch = long_range.make_batch(pairs, tok)
    # Make some rows right: train a little so the comparison is not all-False.
    long_range.fit(
        model,
        tuple(batch),
        long_range.masked_seq2seq_loss,
        long_range.FitConfig(steps=30, batch_size=40, lr=1e-2, warmup_steps=1),
    )
    _, hits = long_range.score(model, batch)
    outputs = greedy_decode(
        model, batch.src, batch.src_mask, bos_id=tok.bos_id, eos_id=tok.eos_id, max_new_tokens=12
    )
    greedy = torch.tensor([out == tok.encode(t) for out, (_, t) in zip(outputs, pairs)])
    assert torch.equal(hits, greedy)


# extrapolation -------------------------------------------------------------------------------
def test_extrapolation_quick_report_and_untrained_rows(out):
    report, path = run_experiment("extrapolation", quick=True, out_dir=out / "extrapolation")
    _check_written(
        path, ["accuracy_vs_length.png", "attention_rotary.png", "attention_learned.png"]
    )
    # Learned rows past the longest training sequence never get a gradient: exactly unchanged.
    assert report.metrics["learned_rows_moved"] == {"learned": 0.0}
    arms = set(extrapolation.ARMS) | {"none"}
    assert set(report.metrics["token_accuracy"]) == arms
    assert {c.arm for c in report.competence} == arms and report.seeds == [0]
    scales = report.metrics["signal_rms"]  # the rescaled sinusoids sit at the token scale
    assert abs(scales["sinusoidal"]["positions"] / scales["sinusoidal"]["tokens"] - 1) < 0.1
    big = copy_task.build_arm(copy_task.ROTARY_LARGE, 12, 16, quick=True)
    assert big.embed.pos_enc.base == copy_task.LARGE_BASE
    assert scales["learned"]["positions"] < 0.05


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

    with pytest.raises(UserError, match="has no tinyshakespeare.txt.*--data"):
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
    report, path = run_experiment("sampling", quick=True, out_dir=out / "sampling")
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
def test_translation_quick_report_and_resume(out):
    report, path = run_experiment("translation", quick=True, out_dir=out / "translation")
    data = _check_written(
        path, ["loss.png", "val_bleu.png", "cross_attention.png", "alignment.png"]
    )
    rows = report.table("test scores per model (mean (min-max) over seeds)").rows
    budget, matched = report.metrics["steps"], report.metrics["matched_budget"]
    assert [r["steps"] for r in rows] == list(budget.values())
    # every arm trains the matched 60 steps; one still rising there (gain > 0.5 on a seed)
    # trains again 2x as long, and the report judges it at 120 (each arm to its plateau)
    for name, gains in ((n, m["val BLEU last gain"]) for n, m in matched.items()):
        assert budget[name] == 120 and max(gains) > translation.PLATEAU_BLEU
        assert matched[name]["val_bleu"][0][0] == [20, 40, 60]
    assert {n for n, s in budget.items() if s == 60} == set(budget) - set(matched)
    assert data["seeds"] == [0] and set(report.per_seed) == {"transformer", "bahdanau", "lstm"}
    for name, num in report.per_seed.items():
        assert len(num["lc BLEU beam 5"]) == 1 and 0 <= num["lc BLEU beam 5"][0] <= 100
        steps, bleu = report.metrics["val_bleu"][name][0]
        assert steps == list(range(20, budget[name] + 1, 20))  # the curve, every 20 steps
        assert num["val BLEU last gain"] == [pytest.approx(bleu[-1] - bleu[-2])]
    plateau = [c for c in report.competence if c.criterion.startswith("plateau")]
    assert len(plateau) == 3 and all(not c.higher_is_better for c in plateau)
    assert all(c.criterion.endswith(f"of {budget[n]} steps") for c, n in zip(plateau, budget))
    assert len(report.competence) == 6
    table = report.table(
        "validation BLEU (greedy, 40 sentences) per evaluation, mean (min-max) over seeds"
    ).rows
    assert [r["step"] for r in table] == list(range(20, max(budget.values()) + 1, 20))
    if matched:  # the longer arms' matched-budget numbers stay in the report
        longer = report.table("the arms trained 2x as long, at the matched budget").rows
        assert [r["steps"] for r in longer] == [60] * len(matched)
        assert [c for c in table[0] if c.endswith("steps")] == [
            f"{n}, {s} steps" for n in matched for s in (60, 120)
        ]
        assert sum("was still rising at the matched 60 steps" in f for f in report.findings) == len(
            matched
        )
    if any(not c.passed for c in report.competence):
        assert report.verdict == "inconclusive"
    work = out / "translation" / "work" / "seed0"
    sweep = report.table(
        "learning-rate sweep (seed 0, 60 steps each): validation BLEU (greedy, 40 sentences) at "
        "the last evaluation"
    ).rows
    for name, recipe in translation.recipes(True).items():
        points = [r for r in sweep if r["model"] == recipe.label]
        grid = [recipe.train["lr"] * f for f in translation.LR_GRID]
        lrs = [lr for lr in grid if f"{lr:g}" in {r["lr"] for r in points}]
        assert [r["lr"] for r in points] == [f"{lr:g}" for lr in lrs]  # in order, no repeats
        start = [recipe.train["lr"] * f for f in translation.LR_START]
        assert set(start) <= set(lrs) and len(lrs) in (2, 3)  # the start, then one beyond
        best = max(points, key=lambda r: r["val BLEU last"])
        assert [r["chosen"].startswith("yes") for r in points].count(True) == 1
        assert best["chosen"].startswith("yes")
        assert (best["chosen"] == "yes") == (points[0] is not best is not points[-1])
        assert next(r for r in rows if r["model"] == recipe.label)["lr"] == best["lr"]
        for lr in lrs:  # each sweep point trained in its own directory
            assert (work / translation.run_name(name, lr, True) / "metrics.jsonl").is_file()
    assert translation.run_name("lstm", 3e-3, True) == "lstm"  # the recipe's rate
    assert translation.run_name("lstm", 9e-3, True) == "lstm-lr0.009"
    assert translation.run_name("lstm", 9e-3, True, 60) == "lstm-lr0.009"  # the matched budget
    assert translation.run_name("lstm", 3e-3, True, 120) == "lstm-steps120"
    assert translation.run_name("lstm", 3e-3, False, 5000) == "lstm-lr0.003-steps5000"
    for (name, steps), row in zip(budget.items(), rows):  # each final run in its own directory
        run_dir = work / translation.run_name(name, float(row["lr"]), True, steps)
        assert (run_dir / "metrics.jsonl").is_file()
    recipe = translation.recipes(True)["lstm"]
    cfg = translation.train_config(True, 0, work / "data", **recipe.train)
    assert cfg.steps == 60 and cfg.dtype == "fp32"
    result = translation.train_one(recipe, cfg, work / "lstm")
    assert result.start_step == result.step == 60  # finished: reloaded, nothing retrained


def test_translation_full_recipes_are_matched_and_recurrent_arms_fp32():
    full = translation.recipes(False)
    assert {r.train["steps"] for r in full.values()} == {2500}
    assert full["bahdanau"].train["dtype"] == full["lstm"].train["dtype"] == "fp32"
    cfg = translation.train_config(False, 1, translation.WORK_DIR, **full["lstm"].train)
    assert cfg.eval_every == 250 and cfg.eval_batches * cfg.batch_size == 256
    assert cfg.save_every == cfg.eval_every and cfg.seed == 1


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
        translation.load_multi30k(tmp_path)


def test_model_configs_are_valid():
    for name in long_range.MODELS:
        assert isinstance(long_range.model_config(name, 20, 10, quick=False), ModelConfig)
    for recipe in translation.recipes(False).values():
        ModelConfig(**recipe.model)


def test_translation_findings_say_which_seeds_still_rise():
    def num(gains):
        return {
            "val BLEU last gain": gains,
            "val BLEU trend": [0.5, 0.25, 0.0],
            "lc BLEU beam 5": [20.0] * 3,
            "lc BLEU greedy": [19.0] * 3,
        }

    gains = {
        "transformer": [0.1, -0.2, 0.3],
        "bahdanau": [0.8, 1.2, 0.9],
        "lstm": [-0.2, 0.6, -0.3],
    }
    text = translation._findings(
        {n: num(g) for n, g in gains.items()}, translation.recipes(True), 250
    )
    assert "reached its plateau" in text[0]
    assert "has not plateaued: validation BLEU still rose" in text[1]
    assert "has not plateaued on every seed" in text[2] and "on 1 of 3 seeds" in text[2]
    assert "last 4 evaluations" in text[0] and "rises 0.25 (0-0.5) BLEU per 250 steps." in text[0]
    steep = {n: {**num(g), "val BLEU trend": [1.0, 0.8, 1.2]} for n, g in gains.items()}
    text = translation._findings(steep, translation.recipes(True), 250)
    assert "by this trend it was still climbing" in text[0]  # passes the criterion, still rising
    assert "still climbing" not in text[1] + text[2]  # the criterion already says so


def test_translation_trend_is_the_slope_of_the_last_evaluations():
    def job(ys):
        return {"curves": {"val_bleu": (list(range(len(ys))), ys)}}

    assert translation.trend(job([9.0, 1.0, 2.0, 3.0, 4.0])) == pytest.approx(1.0)
    assert translation.trend(job([5.0, 4.0, 6.0, 5.0])) == pytest.approx(0.2)
    assert math.isnan(translation.trend(job([1.0, 2.0])))


def test_translation_sweep_never_chooses_a_diverged_rate(tmp_path, monkeypatch):
    def fake_sweep_job(job):  # the recipe's rate learns; 3x it diverges after two evaluations
        name, lr, *_ = job
        if lr == translation.recipes(True)[name].train["lr"]:
            return {"val_bleu": ([20, 40, 60], [1.0, 2.0, 3.0]), "diverged": ""}
        return {"val_bleu": ([20, 40], [5.0, 9.0]), "diverged": "the training loss became nan"}

    monkeypatch.setattr(translation, "sweep_job", fake_sweep_job)
    arms = translation.recipes(True)
    chosen, rows = translation.sweep(arms, tmp_path, None, 0, quick=True)
    assert chosen == {n: r.train["lr"] for n, r in arms.items()}  # the others diverged
    nan = "the training loss became nan"
    assert [r["diverged"] for r in rows][:3] == [nan, "no", nan]  # 0.3x and 3x it
    assert [r["chosen"] for r in rows][:3] == ["", "yes", ""]


@pytest.mark.parametrize(
    "scores, expected",
    [
        ({1: 5.0, 3: 9.0}, 10),  # best at the top: go up
        ({1: 9.0, 3: 5.0}, 0.3),  # best at the bottom: go down
        ({1: 9.0, 3: 9.0}, 0.3),  # a tie goes to the lower rate, the bottom
        ({1: 5.0, 3: 9.0, 10: 7.0}, None),  # bracketed
        ({1: 5.0, 3: 9.0, 10: 12.0}, None),  # best at the grid's end: nothing beyond
        ({0.3: -math.inf, 1: 2.0, 3: -math.inf}, None),  # diverged neighbours bracket it
    ],
)
def test_translation_sweep_extends_until_the_best_rate_is_bracketed(scores, expected):
    assert translation.next_rate(scores, [0.3, 1, 3, 10]) == expected


def test_translation_findings_name_a_kept_rate_at_the_grid_end():
    rows = [
        {"model": "A", "lr": "0.001", "chosen": ""},
        {"model": "A", "lr": "0.003", "chosen": "yes"},
        {"model": "B", "lr": "0.003", "chosen": ""},
        {"model": "B", "lr": "0.01", "chosen": translation.AT_GRID_END},
    ]
    (text,) = translation.unbracketed(rows)
    assert text.startswith("The learning-rate sweep kept B's rate 0.01 at the end of its grid")
    assert translation.unbracketed(rows[:2]) == []
