"""The benchmark harness: interleaving, medians, ratios, targets, memory probe, JSON and report.

No timing assertions: numbers from a shared machine are not testable; the *machinery* is.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnlab.bench import harness, memory
from attnlab.bench.lm_train import (
    TINY_SHAPES,
    build_lm,
    flops_per_token,
    make_batches,
    non_embedding_params,
)
from attnlab.bench.recipe import compare, time_to_reach
from attnlab.bench.report import status_text
from attnlab.bench.runner import BenchSettings, to_json
from attnlab.bench.seq2seq_train import PAD, TINY_SHAPE
from attnlab.bench.seq2seq_train import make_batches as seq2seq_batches
from attnlab.cli import main
from attnlab.errors import UserError


class FakeClock:
    """Advances by the duration the current workload declares: deterministic 'timing'."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_interleave_runs_rounds_a_b_a_b_after_warmup():
    clock, log = FakeClock(), []

    def make(cost: float, units: float):
        def work(r: int) -> float:
            clock.now += cost
            return units

        return work

    timings = harness.interleave(
        {"A": make(0.1, 10.0), "B": make(0.3, 30.0)},
        rounds=3,
        warmup=2,
        min_round_s=0.25,
        clock=clock,
        log=log,
    )
    # warm-ups first, then A's repeats, B's repeats, A's, B's ...; repeats = ceil(0.25 / cost)
    assert timings["A"].repeats == 3 and timings["B"].repeats == 1
    # A is cheap (0.1 < 0.25 / 2): one extra warm-up call before calibrating
    assert log[:5] == [("A", -1)] * 3 + [("B", -1)] * 2
    assert timings["A"].warmup_seconds == pytest.approx([0.1] * 3)
    rounds = log[5:]
    assert rounds == [("A", 0)] * 3 + [("B", 0)] + [("A", 1)] * 3 + [("B", 1)] + [("A", 2)] * 3 + [
        ("B", 2)
    ]
    assert timings["A"].rates == pytest.approx([100.0] * 3)
    assert timings["B"].seconds == pytest.approx([0.3] * 3)
    assert timings["A"].median_seconds_per_call == pytest.approx(0.1)


def test_median_is_robust_to_one_slow_round():
    t = harness.Timing("x", repeats=1, seconds=[1.0, 1.0, 10.0, 1.0, 2.0], units=[5.0] * 5)
    assert t.median_rate == pytest.approx(5.0)
    d = t.to_dict("tokens")
    assert d["tokens_per_s"] == pytest.approx(5.0)
    assert d["tokens_per_s_rounds"][2] == pytest.approx(0.5)
    assert d["rel_spread"] == pytest.approx((5.0 - 0.5) / 5.0)


def test_interleave_rejects_empty_and_zero_rounds():
    with pytest.raises(ValueError, match="rounds"):
        harness.interleave({"a": lambda r: 1.0}, rounds=0)
    with pytest.raises(ValueError, match="no workloads"):
        harness.interleave({}, rounds=1)


def test_ratio_and_targets():
    assert harness.ratio(6.0, 2.0) == 3.0
    assert math.isnan(harness.ratio(1.0, 0.0)) and math.isnan(harness.ratio(None, 1.0))
    hi = harness.target_entry("t", "d", 1.1, 2.2)
    assert hi["met"] is False and hi["margin"] == pytest.approx(0.5)
    assert status_text(hi) == "NOT met (at 50% of target)"
    ok = harness.target_entry("t", "d", 3.3, 2.2)
    assert ok["met"] and status_text(ok) == "met (+50%)"
    lo = harness.target_entry("m", "d", 0.2, 0.05, higher_is_better=False)
    assert lo["met"] is False and status_text(lo) == "NOT met (4.0x over the limit)"
    lo_ok = harness.target_entry("m", "d", 0.01, 0.05, higher_is_better=False)
    assert lo_ok["met"] and lo_ok["margin"] == pytest.approx(5.0)
    missing = harness.target_entry("x", "d", float("nan"), 2.0)
    assert missing["met"] is None and missing["value"] is None
    assert status_text(missing) == "not measured"


def test_loglog_slope_recovers_power_laws():
    ns = [256, 512, 1024, 2048]
    assert harness.loglog_slope(ns, [3e-9 * n**2 for n in ns]) == pytest.approx(2.0)
    assert harness.loglog_slope(ns, [7.0 * n for n in ns]) == pytest.approx(1.0)
    assert harness.loglog_slope([5], [1.0]) is None


def test_measure_case_sees_a_torch_allocation():
    size = 16 * 2**20  # 16 Mi floats = 64 MiB, far above malloc's mmap threshold

    def make_step():
        return lambda: float(torch.ones(size).sum())

    result = memory.measure_case(make_step)
    assert result["status"] == "ok"
    assert 60 * 2**20 <= result["step_extra_bytes"] <= 200 * 2**20


def test_memory_child_runs_cases_and_reports_failures():
    shape = {k: getattr(TINY_SHAPES["small"], k) for k in TINY_SHAPES["small"].__dataclass_fields__}
    cases = [
        {"module": "lm_train", "contender": "torch_nn", "shape": shape, "threads": 1},
        {"module": "lm_train", "contender": "nope", "shape": shape, "threads": 1},
    ]
    ok, bad = memory.run_cases(cases)
    assert ok["status"] == "ok" and ok["peak_bytes"] >= ok["step_extra_bytes"] > 0
    assert bad["status"] == "error" and "unknown LM contender 'nope'" in bad["reason"]
    with pytest.raises(ValueError, match="memory case module"):
        memory.run_cases([{"module": "os"}])


def test_contenders_share_architecture_and_flop_count():
    shape = TINY_SHAPES["small"]
    counts = {
        name: non_embedding_params(build_lm(name, shape)[0])
        for name in ("attnlab", "hf_gpt2_sdpa", "torch_nn")
    }
    d, L = shape.d_model, shape.n_layers
    expected = L * (12 * d * d + 13 * d) + 2 * d  # blocks + final LayerNorm; head tied
    assert set(counts.values()) == {expected}
    assert flops_per_token(expected, shape) == 6 * expected + 12 * L * d * shape.context
    ids, targets = make_batches(shape, 2)[1]
    assert ids.shape == (shape.batch, shape.context) and torch.equal(ids[:, 1:], targets[:, :-1])


def test_flop_formulas_match_torch_flop_counter_and_contenders_do_equal_work():
    """6N + 12LDT (LM) and step_flops (seq2seq), term by term, against FlopCounterMode on one
    forward+backward. The counter sees the dense layers (and the head) exactly but not PyTorch's
    fused CPU attention kernel, so the attention term 12 L D T per token is checked on the
    explicit form softmax(Q K^T) V, and each model's count against its dense layers alone."""
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from attnlab.bench.lm_train import LMShape
    from attnlab.bench.seq2seq_train import Seq2SeqShape, build_seq2seq, step_flops

    def counted(forward, inputs, targets, vocab):
        with FlopCounterMode(display=False) as counter:
            logits = forward(*inputs)
            F.cross_entropy(
                logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=PAD
            ).backward()
        return counter.get_total_flops()

    # the attention term: per query position and layer, Q K^T and A V forward (4 D T), twice that
    # backward, for any split into heads
    b, h, t, dh = 2, 4, 24, 8
    q, k, v = (torch.randn(b, h, t, dh, requires_grad=True) for _ in range(3))
    with FlopCounterMode(display=False) as counter:
        (torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v).sum().backward()
    assert counter.get_total_flops() == b * t * 12 * (h * dh) * t

    shape = LMShape("t", 2, 2, 64, 32, 2)
    ids, targets = make_batches(shape, 1)[0]
    L, d, T, V = shape.n_layers, shape.d_model, shape.context, shape.vocab
    dense = ids.numel() * (6 * L * 12 * d * d + 6 * d * V)  # W_q, W_k, W_v, W_O, FFN 4d; head
    lm = {}
    for name in ("attnlab", "hf_gpt2_sdpa", "torch_nn"):
        model, forward = build_lm(name, shape)
        lm[name] = counted(forward, (ids,), targets, V)
        assert lm[name] == dense  # every contender: the same dense work, exactly
        n = non_embedding_params(model)  # 12 L d^2 weights, biases and norms (test above)
        assert flops_per_token(n, shape) == 6 * n + 12 * L * d * T
    s2s_shape = Seq2SeqShape(
        d_model=64,
        n_heads=4,
        n_layers=2,
        d_ff=128,
        vocab=500,
        batch=4,
        max_len=32,
        median_len=10.0,
        min_len=4,
        max_sentence=20,
    )
    batch = seq2seq_batches(s2s_shape, 1)[0]
    s2s = {
        name: counted(
            build_seq2seq(name, s2s_shape)[1],
            (batch.src, batch.tgt_in),
            batch.tgt_out,
            s2s_shape.vocab,
        )
        for name in ("attnlab", "torch_nn")
    }
    # attnlab's plain form does the same dense work of the padded batch as nn.Transformer (its
    # suite step saves the head and loss on padding with real_only; the fast form also packs).
    (B, S), T = batch.src.shape, batch.tgt_in.size(1)
    L, D, Fd, V = s2s_shape.n_layers, s2s_shape.d_model, s2s_shape.d_ff, s2s_shape.vocab
    dense = B * S * 6 * L * (4 * D * D + 2 * D * Fd) + B * T * (
        6 * L * (8 * D * D + 2 * D * Fd) + 6 * D * V
    )
    attention = B * S * 12 * L * D * S + B * T * 12 * L * D * (T + S)  # enc self; dec self, cross
    assert s2s["attnlab"] == s2s["torch_nn"] == dense
    assert step_flops(s2s_shape, batch) == dense + attention


def test_seq2seq_batches_are_padded_and_reproducible():
    a, b = seq2seq_batches(TINY_SHAPE, 3), seq2seq_batches(TINY_SHAPE, 3)
    for x, y in zip(a, b):
        assert torch.equal(x.src, y.src) and torch.equal(x.tgt_out, y.tgt_out)
        assert x.tokens == int((x.tgt_out != PAD).sum())
        assert (x.src != PAD).sum(1).min() >= TINY_SHAPE.min_len
        # teacher forcing: tgt_in is tgt_out shifted right behind BOS on real positions
        real = x.tgt_in != PAD
        assert torch.equal(real, x.tgt_out != PAD)
        assert torch.equal(x.tgt_in[:, 1:][real[:, 1:]], x.tgt_out[:, :-1][real[:, 1:]])


def test_recipe_time_to_baseline_loss():
    base = [
        {"step": s, "val_loss": v, "elapsed_s": t}
        for s, v, t in [(500, 2.0, 50.0), (1000, 1.7, 100.0), (2000, 1.5, 200.0)]
    ]
    fast = [
        {"step": s, "val_loss": v, "elapsed_s": t}
        for s, v, t in [(200, 1.8, 30.0), (400, 1.49, 70.0), (600, 1.4, 100.0)]
    ]
    out = compare(base, fast)
    assert out["target_val_loss"] == 1.5
    assert out["fast"] == {"reached": True, "seconds": 70.0, "step": 400, "val_loss": 1.49}
    assert out["time_ratio_fast_vs_baseline"] == pytest.approx(70.0 / 200.0)
    never = time_to_reach(fast, 1.0)
    assert never["reached"] is False and never["best_val_loss"] == 1.4
    assert compare(base, fast[:1])["time_ratio_fast_vs_baseline"] is None


def test_settings_validate_with_clear_messages():
    with pytest.raises(ValueError, match="unknown benchmark suite.*bogus.*choose from"):
        BenchSettings(suites=("lm", "bogus"))
    with pytest.raises(ValueError, match="give it as text"):
        BenchSettings(suites=("recipe",))
    with pytest.raises(ValueError, match="threads must be >= 1"):
        BenchSettings(threads=0)
    quick = BenchSettings.for_mode(quick=True, rounds=4)
    assert quick.rounds == 4 and quick.new_tokens == 100 and "recipe" not in quick.suites
    assert to_json({"x": float("nan"), "y": (1, float("inf"))}) == (
        '{\n "x": null,\n "y": [\n  1,\n  null\n ]\n}\n'
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--suite", "lm,nope"], "unknown benchmark suite"),
        (["--suite", "recipe"], "give it as text (e.g. text="),
        (["--suite", "recipe"], "(on the command line: --text)"),
        (["--suite", "recipe", "--text", "/no/such/file.txt"], "is not a file"),
        (["--threads", "0"], "threads must be >= 1, got 0 (on the command line: --threads)"),
        (["--suite", "lm", "--text", __file__], "--text has no effect here"),
        (["--suite", "matmul", "--notes", __file__], "only with --report FILE"),
    ],
)
def test_cli_bad_input_is_one_paragraph(argv, message, capsys):
    assert main(["bench", "--tiny", *argv]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "Traceback" not in err


def test_cli_from_json_rerenders_without_measuring(tmp_path, capsys):
    saved = tmp_path / "saved.json"
    assert main(["bench", "--tiny", "--threads", "1", "--quiet", "--suite", "matmul",
                 "--json", str(saved)]) == 0  # fmt: skip
    notes = tmp_path / "notes.md"
    notes.write_text("The matmul peak bounds everything.")
    report = tmp_path / "RESULTS.md"
    capsys.readouterr()
    assert main(["bench", "--from-json", str(saved), "--report", str(report),
                 "--notes", str(notes)]) == 0  # fmt: skip
    text = report.read_text()
    assert "## Analysis" in text and "The matmul peak bounds everything." in text
    assert json.loads(saved.read_text())["command"] in text
    assert main(["bench", "--from-json", str(saved), "--suite", "lm"]) == 2
    assert "measures nothing" in capsys.readouterr().err
    notes.write_text("{}")
    assert main(["bench", "--from-json", str(notes)]) == 2
    assert "schema_version" in capsys.readouterr().err


def test_cli_refuses_a_directory_as_json_output(tmp_path, capsys):
    assert main(["bench", "--tiny", "--suite", "matmul", "--json", str(tmp_path)]) == 2
    assert "is a directory" in " ".join(capsys.readouterr().err.split())


def test_cli_never_replaces_a_users_file_and_replaces_its_own(tmp_path, capsys):
    saved = tmp_path / "saved.json"
    assert main(["bench", "--tiny", "--threads", "1", "--quiet", "--suite", "matmul",
                 "--json", str(saved)]) == 0  # fmt: skip
    precious, thesis = tmp_path / "precious.json", tmp_path / "README.md"
    precious.write_text("my precious notes")
    thesis.write_text("# My thesis notes\n")
    for flag, path in (("--json", precious), ("--report", thesis)):
        assert main(["bench", "--from-json", str(saved), flag, str(path)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"{flag} {str(path)!r} already exists and is not an attnlab bench" in err
    assert precious.read_text() == "my precious notes"
    assert thesis.read_text() == "# My thesis notes\n"
    # its own files are rewritten: a result over a result, a report over a report
    report = tmp_path / "RESULTS.md"
    again = ["bench", "--from-json", str(saved), "--json", str(saved), "--report", str(report)]
    assert main(again) == 0 and main(again) == 0
    assert report.read_text().startswith("# attnlab benchmark results")


def test_tiny_run_writes_json_report_and_plots(tmp_path, capsys):
    out_json, report = tmp_path / "r.json", tmp_path / "bench" / "RESULTS.md"
    argv = [
        "bench",
        "--tiny",
        "--threads",
        "1",
        "--quiet",
        "--suite",
        "matmul,lm,seq2seq,generate,attention",
        "--json",
        str(out_json),
        "--report",
        str(report),
    ]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "| target | measured | wanted | status |" in stdout
    data = json.loads(out_json.read_text())
    assert data["schema_version"] == 1 and data["mode"] == "tiny"
    assert data["command"].startswith("attnlab bench --tiny --suite matmul,lm")
    for key in ("cpu_model", "logical_cores", "threads", "torch", "load_average_start"):
        assert key in data["machine"]
    assert data["machine"]["threads"] == 1
    suites = data["suites"]
    assert all(suites[s]["status"] == "ok" for s in suites), suites
    assert suites["matmul"]["peak_gflops"] > 0
    for shape in suites["lm"]["shapes"]:
        rows = {c["name"]: c for c in shape["contenders"]}
        assert set(rows) == {"attnlab", "hf_gpt2_sdpa", "torch_nn"}
        # the peak a shape divides by is the larger of the run's and its own same-rounds matmul
        used = shape["peak_gflops_used"]
        assert used >= suites["matmul"]["peak_gflops"]
        for c in rows.values():
            assert len(c["tokens_per_s_rounds"]) == 2 and c["tokens_per_s"] > 0
            assert c["fraction_of_peak"] == pytest.approx(c["achieved_gflops"] / used)
        assert shape["ratios"]["attnlab_vs_hf_gpt2_sdpa"] == pytest.approx(
            rows["attnlab"]["tokens_per_s"] / rows["hf_gpt2_sdpa"]["tokens_per_s"]
        )
    s2s = {c["name"]: c["tokens_per_s"] for c in suites["seq2seq"]["contenders"]}
    assert suites["seq2seq"]["ratios"]["attnlab_vs_torch_nn"] == pytest.approx(
        s2s["attnlab"] / s2s["torch_nn"]
    )
    assert len(suites["generate"]["runs"]) == 4  # two models x two contexts
    for row in suites["generate"]["runs"]:
        assert row["n_positions"] == row["context"] + row["new_tokens"]
        assert row["tokens_agree"] == 1.0  # same weights, greedy: same tokens
    att = suites["attention"]
    assert [r["n"] for r in att["lengths"]] == [32, 64, 128]
    for r in att["lengths"]:
        for path in ("explicit", "fused"):
            assert r[path]["status"] == "ok" and r[path]["extra_bytes"] > 0
    assert {"time_exponent", "memory_exponent"} <= set(att["fits"]["explicit"])
    ids = [t["id"] for t in data["targets"]]
    assert ids[:3] == ["lm_small_vs_gpt2", "lm_medium_vs_gpt2", "lm_medium_fraction_of_peak"]
    assert {"seq2seq_vs_torch", "attention_fused_memory_fraction"} <= set(ids)
    for t in data["targets"]:
        assert {"value", "target", "met", "margin", "higher_is_better"} <= set(t)
    text = report.read_text()
    assert data["command"] in text and "## Machine" in text and "## Targets" in text
    assert (report.parent / "throughput.png").stat().st_size > 0
    assert "![attention_scaling](attention_scaling.png)" in text


def test_recipe_suite_trains_both_presets_with_the_real_loop(tmp_path, monkeypatch):
    """The harness around attnlab.train.train, with two tiny stand-in presets (the real ones
    train for minutes)."""
    from attnlab.bench.runner import run_bench
    from attnlab.train import presets

    text = tmp_path / "text.txt"
    text.write_text("To be, or not to be, that is the question. " * 120)

    def preset(lr: float) -> dict:
        model = dict(kind="decoder_lm", d_model=16, n_heads=2, n_layers=1, max_len=16)
        train = dict(task="lm", data="unused", steps=20, lr=lr, warmup_steps=2, eval_every=10,
                     eval_batches=1, batch_size=4, context_len=16, val_fraction=0.1,
                     save_every=0, threads=1)  # fmt: skip
        return {"model": model, "train": train}

    tables = {"baseline-char": preset(1e-3), "fast-char": preset(1e-2)}
    monkeypatch.setattr(presets, "RUN_PRESETS", {**presets.RUN_PRESETS, **tables})
    settings = BenchSettings.for_mode(
        tiny=True, suites=("recipe",), text=str(text), threads=1, rounds=3
    )
    suite = run_bench(settings)["suites"]["recipe"]
    assert suite["status"] == "ok", suite
    rounds = suite["rounds"]
    assert [r["order"][0] for r in rounds] == ["baseline-char", "fast-char", "baseline-char"]
    seeds = [r["runs"]["fast-char"]["preset_seed"] for r in rounds]
    assert seeds == [seeds[0], seeds[0] + 1, seeds[0] + 2]  # each round its own seed
    for r in rounds:  # every round is its own comparison, against its own baseline
        base_evals = r["runs"]["baseline-char"]["evaluations"]
        assert [e["step"] for e in base_evals] == [10, 20]
        assert r["target_val_loss"] == base_evals[-1]["val_loss"]
        assert r["baseline"]["seconds"] == base_evals[-1]["elapsed_s"]
        if r["fast"]["reached"]:
            assert r["time_ratio_fast_vs_baseline"] == pytest.approx(
                r["fast"]["seconds"] / r["baseline"]["seconds"]
            )
    assert suite["comparable"] is True
    target = suite["targets"][0]
    assert target["id"] == "recipe_fast_vs_baseline" and target["higher_is_better"] is False
    ratios = suite["ratio_rounds"]
    if all(v is not None for v in ratios):  # the median round's numbers are on top
        assert target["value"] == sorted(ratios)[1]
        assert (suite["ratio_min"], suite["ratio_max"]) == (min(ratios), max(ratios))
        assert target["value"] == pytest.approx(
            suite["fast"]["seconds"] / suite["baseline"]["seconds"]
        )
    else:
        assert target["value"] is None and "never reached" in target["note"]
    from attnlab.bench.tables import _recipe

    table = "\n".join(_recipe(suite))
    assert table.count("baseline-char then fast-char") == 2 and "median (min-max) over 3" in table


def test_recipe_presets_read_the_same_validation_windows():
    """fast-char may batch differently from baseline-char, but its evaluations read the same
    windows (the first eval_batches x batch_size of the split); a different count is flagged."""
    from attnlab.bench.recipe import _train_api, configure, protocol, protocol_differences

    _, preset = _train_api()  # the suite's own preset resolution
    base, fast = (protocol(configure(preset(n), "t.txt")) for n in ("baseline-char", "fast-char"))
    assert protocol_differences(base, fast) == []
    assert protocol_differences(base, {**fast, "val_windows": fast["val_windows"] + 1}) == [
        "val_windows"
    ]


def test_seq2seq_bench_losses_agree_between_real_only_and_padded_heads():
    """attnlab's timed step (logits at real targets only) computes the padded step's loss."""
    from attnlab.bench.seq2seq_train import TINY_SHAPE, build_seq2seq, contender_loss, padded_loss

    batch = seq2seq_batches(TINY_SHAPE, 1)[0]
    model, forward = build_seq2seq("attnlab", TINY_SHAPE)
    assert not bool((batch.tgt_out != PAD).all())  # the batch really has padding
    fast = contender_loss("attnlab", model, forward)(batch)
    assert torch.allclose(fast, padded_loss(forward)(batch), rtol=1e-5)


def test_suite_in_a_child_process_returns_its_result_and_the_peak_it_measured():
    """fresh_process_per_suite: the lm suite runs in a child, which also measures the matmul
    peak it needs; both come back to the parent as plain results."""
    from attnlab.bench.runner import run_bench

    settings = BenchSettings.for_mode(
        tiny=True, suites=("lm",), threads=1, fresh_process_per_suite=True
    )
    result = run_bench(settings)
    assert set(result["suites"]) == {"matmul", "lm"}
    assert result["suites"]["matmul"]["status"] == "ok"
    lm = result["suites"]["lm"]
    assert lm["status"] == "ok", lm
    assert [t["id"] for t in result["targets"]][:2] == ["lm_small_vs_gpt2", "lm_medium_vs_gpt2"]
    assert result["settings"]["fresh_process_per_suite"] is True


def test_suite_child_reports_user_errors_and_its_own_death(tmp_path, monkeypatch):
    from attnlab.bench import runner

    short = tmp_path / "short.txt"
    short.write_text("ab")
    settings = BenchSettings.for_mode(
        tiny=True, suites=("recipe",), threads=1, text=str(short), fresh_process_per_suite=True
    )
    with pytest.raises(UserError, match="context_len"):  # the user's input, said in the parent
        runner.run_bench(settings)
    monkeypatch.setattr(runner, "_CHILD_CODE", "raise SystemExit(3)")
    suite = runner.run_bench(settings)["suites"]["recipe"]
    assert suite["status"] == "error" and "exit code 3" in suite["error"]


def test_settings_survive_the_json_round_trip_to_a_child():
    settings = BenchSettings.for_mode(quick=True, threads=2, contexts=(8, 16))
    again = BenchSettings.from_dict(json.loads(json.dumps(settings.to_dict())))
    assert again == settings
