"""The verdict rules of six experiments on hand-made numbers with known answers: every word a rule
can give (held, did not hold, mixed, no effect resolved), one boundary at its threshold each, and
the deciding numbers in the reason. Pure functions only: nothing trains, times or writes.

A difference counts only with the seed (or round) ranges apart, touching ranges being inside the
spread (``kit.seeds.resolved``); a claim with several checks reads "mixed" when some held and the
others did not, an unresolved check counting as one that did not hold."""

from __future__ import annotations

import math

import pytest

from attnlab.lab.experiments import (
    complexity,
    concat_positions,
    extrapolation,
    order,
    parallelism,
    relative_offset,
)
from attnlab.lab.kit.verdict import verdict_of, verdict_of_directions

# extrapolation ------------------------------------------------------------------------------------
LEARNED = [0.1, 0.125, 0.25]  # learned positions beyond N; max 0.25 (exact in binary)
ABOVE = [0.375, 0.5, 0.625]  # resolved above LEARNED
INSIDE = [0.125, 0.25, 0.5]  # overlaps LEARNED
BELOW = [0.0, 0.03125, 0.0625]  # resolved below LEARNED
TOUCHING = [0.25, 0.5, 0.75]  # min == max(LEARNED): ranges touch, inside the spread


def _extrapolation(sinusoidal: list[float], rotary: list[float]) -> tuple[str, str]:
    """``extrapolation._verdict`` with the other arms present as in ``write_up``: the two modern
    schemes far below learned and the reference arm 'none', none of which may sway the word."""
    outside = {"learned": LEARNED, "sinusoidal": sinusoidal, "rotary": rotary,
               extrapolation.ROTARY_LARGE: [0.0] * 3, "alibi": [0.0] * 3,
               "none": [0.99] * 3}  # fmt: skip
    val = {a: [1.0, 1.0, 1.0] for a in outside}
    return extrapolation._verdict(outside, val, 16, [4, 8, 12, 16, 20, 24, 28, 32])


@pytest.mark.parametrize(
    ("sinusoidal", "rotary", "word"),
    [
        (ABOVE, ABOVE, "held"),  # both beat learned with the ranges apart
        (BELOW, BELOW, "did not hold"),  # both resolved against the claim
        (INSIDE, INSIDE, "no effect resolved"),  # both inside the seed spread
        (ABOVE, BELOW, "mixed"),  # one check held, the other resolved against
        (INSIDE, ABOVE, "mixed"),  # one held, the other unresolved
        (BELOW, INSIDE, "did not hold"),  # none held: one against, one unresolved
        (TOUCHING, ABOVE, "mixed"),  # boundary: touching ranges are not resolved
        (TOUCHING, TOUCHING, "no effect resolved"),
    ],
)
def test_extrapolation_verdict_words(sinusoidal, rotary, word):
    got, reason = _extrapolation(sinusoidal, rotary)
    assert got == word, reason
    assert "n > N = 16" in reason and "learned 0.158 (0.1-0.25)" in reason
    assert "none" not in reason  # the reference arm is reported elsewhere, not judged
    unresolved = [a for a, v in (("sinusoidal", sinusoidal), ("rotary", rotary)) if v in
                  (INSIDE, TOUCHING)]  # fmt: skip
    assert ("only inside the seed spread" in reason) == bool(unresolved)
    if unresolved:
        assert f" {', '.join(unresolved)} differs from learned only inside" in reason


def test_extrapolation_reason_names_each_arm_beyond_n():
    _, reason = _extrapolation(ABOVE, TOUCHING)
    assert "sinusoidal 0.5 (0.375-0.625)" in reason and "rotary 0.5 (0.25-0.75)" in reason
    assert "on validation copies of the training lengths: learned 1 (1-1)" in reason


# complexity ---------------------------------------------------------------------------------------
NS = [16, 32, 64, 128, 256, 512, 1024, 2048]
BEYOND = 1e6  # a crossover past the longest n: attention cheaper everywhere measured


def _complexity(cross: dict[int, list[float]], flop_factor: float = 1.0) -> dict:
    """Measured numbers whose wall-time curves cross at ``cross[d][round]`` (attention n^2 / c
    against recurrence n: equal at n = c, exactly when c is in NS; NEVER: not within NS) and
    whose FLOP curves cross at d / flop_factor (4 n^2 d flop_factor vs 4 n d^2)."""
    widths, rounds = list(cross), [0, 1, 2]
    flops = {}
    for d in widths:
        flops[("self-attention", d)] = [4 * n * n * d * flop_factor for n in NS]
        flops[("recurrent", d)] = [4 * n * d * d for n in NS]
    ms: dict[tuple, dict[int, list[float]]] = {}
    for d in widths:
        for r, c in zip(rounds, cross[d]):
            ms.setdefault(("self-attention", d), {})[r] = [n * n / c for n in NS]
            ms.setdefault(("recurrent", d), {})[r] = [float(n) for n in NS]
    return {"rounds": rounds, "widths": widths, "ns": NS, "flops": flops, "ms": ms,
            "logical_cores": 2, "gpu": None}  # fmt: skip


def test_complexity_crossover_is_where_the_curves_meet():
    """The helper above builds what it says: n* = c, 0 when attention starts above, inf when it
    never gets there."""
    at = [[n * n / c for n in NS] for c in (16, 64, 200, 8, BEYOND)]
    found = [complexity.crossover(NS, a, [float(n) for n in NS]) for a in at]
    assert found[0] == 16.0 and found[1] == pytest.approx(64) and found[2] == pytest.approx(200)
    assert found[3] == 0.0 and found[4] == math.inf


@pytest.mark.parametrize(
    ("cross", "flop_factor", "word", "near"),
    [
        # FLOPs cross at n = d and every round's wall time within a factor 4 of d
        ({64: [64, 96, 128], 256: [256, 200, 512]}, 1.0, "held", "d = 64 yes, d = 256 yes"),
        # the committed report's shape: d = 64 crosses 16x too late, d = 256 near
        ({64: [1024] * 3, 256: [900, 880, 870]}, 1.0, "mixed", "d = 64 no, d = 256 yes"),
        # FLOPs cross at d / 2 and the wall times never cross: no check holds
        ({64: [BEYOND] * 3, 256: [BEYOND] * 3}, 2.0, "did not hold", "d = 64 no, d = 256 no"),
        # the FLOP check alone fails
        ({64: [64] * 3, 256: [256] * 3}, 2.0, "mixed", "d = 64 yes, d = 256 yes"),
        # "on every round": one round of three outside the factor makes that width's check fail
        ({64: [64, 64, 300], 256: [256] * 3}, 1.0, "mixed", "d = 64 no, d = 256 yes"),
        # boundary: a crossover at exactly d / 4 = 16 is within the factor (inclusive) ...
        ({64: [16, 64, 64], 256: [256] * 3}, 1.0, "held", "d = 64 yes"),
        # ... attention already dearer at n = 16 (crossover 0: below d / 4) is not
        ({64: [8, 64, 64], 256: [256] * 3}, 1.0, "mixed", "d = 64 no"),
    ],
)
def test_complexity_verdict_words(cross, flop_factor, word, near):
    got, reason = complexity.verdict(_complexity(cross, flop_factor))
    assert got == word, reason
    assert reason.startswith("CPU only (2 logical cores") and near in reason
    exact = "64 for d = 64, 256 for d = 256"
    if flop_factor != 1:
        exact = "32 for d = 64, 128 for d = 256"
    assert f"Counted FLOPs cross at n = {exact} (predicted n = d)" in reason


def test_complexity_reason_gives_each_rounds_crossover():
    _, reason = complexity.verdict(_complexity({64: [16, 64, 64], 256: [256] * 3}))
    assert "crosses at n = 48 (16-64) for d = 64, at n = 256 (256-256) for d = 256" in reason
    assert "over 3 rounds" in reason and "within a factor 4 of d" in reason


@pytest.mark.parametrize(
    ("gpu_cross", "word", "faster"),
    [
        # the GPU's curves cross far beyond d: attention faster at every n < d (the claim)
        ({64: [BEYOND] * 3, 256: [BEYOND] * 3}, "held", "d = 64 yes, d = 256 yes"),
        # attention dearer than the recurrence below d = 256 on one round: that check fails
        ({64: [BEYOND] * 3, 256: [BEYOND, BEYOND, 100]}, "mixed", "d = 64 yes, d = 256 no"),
    ],
)
def test_complexity_gpu_check_joins_the_verdict(gpu_cross, word, faster):
    m = _complexity({64: [64] * 3, 256: [256] * 3})  # the CPU checks all hold
    m["ms_gpu"], m["gpu"] = _complexity(gpu_cross)["ms"], "NVIDIA H200"
    got, reason = complexity.verdict(m)
    assert got == word, reason
    assert reason.startswith("GPU: NVIDIA H200, and the CPU (2 logical cores")
    assert f"at every n < d on every round: {faster}." in reason


# concat_positions ---------------------------------------------------------------------------------
SLOW = [800.0, 900.0, 1000.0]  # steps to 0.99
FAST = [500.0, 600.0, 700.0]  # resolved below SLOW
LIKE_SLOW = [700.0, 900.0, 1100.0]  # overlaps SLOW
TOUCH_SLOW = [600.0, 700.0, 800.0]  # max == min(SLOW): touching, inside the spread
NEVER = [math.inf] * 3  # never reached 0.99


def _concat(copy: tuple[list, list], permute: tuple[list, list], unit: float = 0.5) -> dict:
    """Measured numbers with steps to 0.99 per seed for (added, concatenated) on each task; the
    reference arm ends at ``unit`` on every seed."""
    steps = {"copy": copy, "permute": permute}
    seeds, lr = [0, 1, 2], 3e-3
    sweep = {}
    for t in concat_positions.TASKS:
        add, cat = steps[t]
        for arm, s in (("added", add), ("concatenated", cat), ("concatenated, unit", NEVER)):
            final = unit if arm == "concatenated, unit" else 1.0
            sweep[(arm, t, lr)] = [{"steps": x, "final": final} for x in s]
    chosen = {(a, t): lr for a in concat_positions.ARMS for t in concat_positions.TASKS}
    return {"seeds": seeds, "quick": False, "chosen": chosen, "sweep": sweep}


@pytest.mark.parametrize(
    ("copy", "permute", "word"),
    [
        ((SLOW, FAST), (SLOW, FAST), "held"),  # concatenated faster on both, ranges apart
        ((FAST, SLOW), (FAST, SLOW), "did not hold"),  # added faster on both
        ((SLOW, LIKE_SLOW), (SLOW, LIKE_SLOW), "no effect resolved"),  # inside on both
        ((SLOW, FAST), (FAST, SLOW), "mixed"),  # one task each way
        ((SLOW, FAST), (SLOW, LIKE_SLOW), "mixed"),  # held on one, unresolved on the other
        ((FAST, SLOW), (SLOW, LIKE_SLOW), "did not hold"),  # against on one, unresolved
        ((NEVER, FAST), (NEVER, SLOW), "held"),  # added never reaches 0.99: concatenated faster
        ((SLOW, TOUCH_SLOW), (SLOW, LIKE_SLOW), "no effect resolved"),  # boundary: touching
        ((SLOW, FAST), (SLOW, TOUCH_SLOW), "mixed"),
    ],
)
def test_concat_positions_verdict_words(copy, permute, word):
    got, reason = concat_positions.verdict(_concat(copy, permute))
    assert got == word, reason
    for t, (add, cat) in (("copy", copy), ("permute", permute)):
        apart = max(cat) < min(add) or max(add) < min(cat)
        faster = "concatenated" if max(cat) < min(add) else "added"
        said = f"{t}: {faster} is faster" if apart else f"{t}: steps to 0.99 added"
        assert said in reason
    assert "lr 0.003 vs 0.003" in reason and "checked every 100 steps" in reason


def test_concat_positions_reason_numbers_and_reference_arm():
    _, reason = concat_positions.verdict(_concat((SLOW, TOUCH_SLOW), (SLOW, FAST)))
    assert "copy: steps to 0.99 added 900 (800-1e+03), concatenated 700 (600-800)" in reason
    assert "(lr 0.003 vs 0.003; inside the seed spread)" in reason
    assert "permute: concatenated is faster" in reason and "seed ranges apart" in reason
    assert "reach 0.5 (0.5-0.5) (copy)" in reason and "does not make raw sinusoids" in reason
    _, reason = concat_positions.verdict(_concat((SLOW, FAST), (SLOW, FAST), unit=0.99))
    assert "the learned map alone makes raw sinusoids usable" in reason  # 0.99 is the bar


# parallelism --------------------------------------------------------------------------------------
JITTER = (1.0, 1.25, 1.5)  # per round; every product below is exact in binary


def _timings(spec: dict[str, tuple]) -> dict:
    """Measured step times: ``spec[model] = (ms at T = 32, ms at T = 512, speed-up of a second
    thread per round)`` at one thread, times the round's jitter; B = 16 the same as B = 1."""
    lengths, batches, threads, rounds = [32, 512], [1, 16], [1, 2], [0, 1, 2]
    ms = {}
    for name in parallelism.MODELS:
        short, long, gain = spec.get(name, spec[parallelism.FUSED])
        for b in batches:
            for th in threads:
                for t in lengths:
                    base = short if t == 32 else long
                    ms[(name, b, th, t)] = [
                        base * j / (g if th == 2 else 1) for j, g in zip(JITTER, gain)
                    ]
    return {"lengths": lengths, "batches": batches, "threads": threads, "rounds": rounds,
            "ms": ms, "logical_cores": 2, "gpu": None}  # fmt: skip


ONE, TWO, HALF = (1.0,) * 3, (2.0,) * 3, (0.5,) * 3
FLAT = (16.0, 256.0)  # ms at T = 32, 512: tokens/s 2000 / jitter at both lengths
TF, FUSED = parallelism.TF, parallelism.FUSED


@pytest.mark.parametrize(
    ("spec", "word", "held"),
    [
        # Transformer tokens/s 4x up from T = 32 to 512, above the flat RNN; 2 threads 2x vs 1x
        ({TF: (16.0, 64.0, TWO), FUSED: (*FLAT, ONE)}, "held", [True] * 4),
        # everything the other way: Transformer throughput falls, the RNN gains from threads
        ({TF: (16.0, 1024.0, ONE), FUSED: (*FLAT, TWO)}, "did not hold", [False] * 4),
        # the committed report's shape: the RNN's throughput grows more (8x vs 4x)
        ({TF: (16.0, 64.0, TWO), FUSED: (128.0, 256.0, ONE)}, "mixed", [True, True, False, True]),
        # every model the same: no difference resolved
        ({FUSED: (*FLAT, ONE)}, "no effect resolved", [False] * 4),
        # one check resolved against the claim, the others unresolved
        ({TF: (*FLAT, ONE), FUSED: (*FLAT, TWO)}, "did not hold", [False] * 4),
        # boundary: thread speed-ups 1-2 vs 0.5-1 touch at 1: still unresolved ...
        (
            {TF: (*FLAT, (1.0, 2.0, 2.0)), FUSED: (*FLAT, (0.5, 0.5, 1.0))},
            "no effect resolved",
            [False] * 4,
        ),
        # ... and apart (1-2 vs 0.5), the one resolved check held
        ({TF: (*FLAT, (1.0, 2.0, 2.0)), FUSED: (*FLAT, HALF)}, "mixed", [False] * 3 + [True]),
    ],
)
def test_parallelism_verdict_words(spec, word, held):
    got, reason, checks = parallelism.verdict(_timings(spec))
    assert got == word, reason
    assert list(checks.values()) == held
    assert reason.startswith("CPU only (2 logical cores, no GPU used; the claim is about a GPU)")
    for name, ok in checks.items():
        assert f"{name}: {'yes' if ok else 'no'}" in reason


def test_parallelism_reason_gives_the_deciding_numbers():
    _, reason, _ = parallelism.verdict(_timings({TF: (16.0, 64.0, TWO), FUSED: (*FLAT, ONE)}))
    assert "B = 1, T 32 -> 512, tokens/s" in reason and "over 3 rounds" in reason
    assert (
        "CPU with 1 thread: fused RNN 1.64e+03 (1.33e+03-2e+03) -> 1.64e+03 (1.33e+03-2e+03), "
        "Transformer 1.64e+03 (1.33e+03-2e+03) -> 6.58e+03 (5.33e+03-8e+03)"
    ) in reason
    assert "a second CPU thread: fused RNN 1 (1-1)x, Transformer 2 (2-2)x" in reason


def test_parallelism_gpu_checks_join_the_verdict():
    """With GPU timings (flat for the Transformer, 16x longer for the RNN at 16x the length),
    the three GPU checks hold and are named in the reason beside the CPU's."""
    m = _timings({TF: (16.0, 64.0, TWO), FUSED: (*FLAT, ONE)})  # every CPU check holds
    gpu = _timings({TF: (1.0, 1.0, ONE), FUSED: (1.0, 16.0, ONE)})["ms"]
    m["ms"] |= {(n, b, parallelism.GPU, t): v for (n, b, th, t), v in gpu.items() if th == 1}
    m["gpu"] = "NVIDIA H200"
    word, reason, checks = parallelism.verdict(m)
    assert word == "held" and len(checks) == 7, reason
    assert [k for k in checks if k.startswith("GPU: ")] == [
        "GPU: Transformer tokens/s above the fused RNN's at B = 1, T = 512",
        "GPU: Transformer throughput at B = 1 grows from T = 32 to 512",
        "GPU: that growth (tokens/s at T = 512 over T = 32) larger for the Transformer than "
        "for the fused RNN",
    ]
    assert reason.startswith("GPU: NVIDIA H200, and the CPU (2 logical cores)")
    assert (
        "; GPU: fused RNN 2.63e+04 (2.13e+04-3.2e+04) -> 2.63e+04 (2.13e+04-3.2e+04), "
        "Transformer 2.63e+04 (2.13e+04-3.2e+04) -> 4.21e+05 (3.41e+05-5.12e+05)"
    ) in reason
    m["ms"][(TF, 1, parallelism.GPU, 512)] = [1e4] * 3  # the Transformer far slower at T = 512
    word, _, checks = parallelism.verdict(m)
    assert (
        word == "mixed"
        and not checks["GPU: Transformer throughput at B = 1 grows from T = 32 to 512"]
    )


# order --------------------------------------------------------------------------------------------
def _order(none: list[float], gap: float, positions: dict[str, list[float]] | None = None) -> dict:
    """Swap-test accuracy per seed for 'none' (with its equivariance gap) and each position kind
    (1.0 on every seed unless given)."""
    positions = positions or {}
    per = {"none": [{"test": x, order.GAP: gap} for x in none]}
    for kind in order.KINDS[1:]:
        per[kind] = [{"test": x, order.GAP: 0.5} for x in positions.get(kind, [1.0] * 3)]
    return {"per": per}


@pytest.mark.parametrize(
    ("none", "gap", "positions", "word"),
    [
        ([0.5, 0.5, 0.5], 1e-15, {"learned": [0.95, 1.0, 1.0]}, "held"),
        ([0.5, 0.49, 0.5], 1e-15, {"rotary": [0.85, 0.95, 1.0]}, "mixed"),  # a kind < 0.9
        ([0.6, 0.55, 0.5], 1e-15, {}, "mixed"),  # a seed above the 1/2 bound
        ([0.6, 0.55, 0.5], 1e-3, {"concat": [0.5] * 3}, "did not hold"),  # no check holds
        # boundaries: 1/2 exactly and 0.9 exactly pass ...
        ([0.5, 0.5, 0.5], 1e-15, {"sinusoidal": [0.9, 1.0, 1.0]}, "held"),
        # ... a gap of exactly 1e-9 does not (< 1e-9, float64) ...
        ([0.5, 0.5, 0.5], 1e-9, {}, "mixed"),
        # ... nor an accuracy just above 1/2, nor one just below 0.9
        ([0.5, 0.5 + 1e-6, 0.5], 0.0, {}, "mixed"),
        ([0.5, 0.5, 0.5], 0.0, {"learned": [0.9 - 1e-6, 1.0, 1.0]}, "mixed"),
    ],
)
def test_order_verdict_words(none, gap, positions, word):
    got, reason, gap_none = order._verdict(_order(none, gap, positions))
    assert got == word, reason
    assert gap_none == gap and f"to {gap:.1e} (float64)" in reason


def test_order_reason_names_the_lowest_kind():
    _, reason, _ = order._verdict(_order([0.5, 0.5, 0.5], 0.0, {"rotary": [0.85, 0.95, 1.0]}))
    assert "test accuracy is 0.5 (0.5-0.5)" in reason
    assert "reaches >= 0.850 on every seed (lowest: rotary)" in reason


# relative_offset ----------------------------------------------------------------------------------
def _offsets(sinusoidal: list[float], learned: list[float], error: float = 1e-13,
             by_k: dict[int, list[float]] | None = None) -> dict:  # fmt: skip
    """Measured numbers: the worst unseen window per seed for each arm (the training window at
    1.0 and the other windows above the worst), per k for the sinusoids if ``by_k`` says, and
    the exact check's largest error."""
    arms = relative_offset.arm_names(False)
    per = {}
    for arm in arms:
        k = int(arm.split("k=")[1])
        worst = (by_k or {}).get(k, sinusoidal) if arm.startswith("sinusoidal") else learned
        per[arm] = [{"by_start": [1.0, min(1.0, w + 0.05), w, 1.0, w]} for w in worst]
    exact = [{"d": 64, "k": 1, "max error, n < 2000": error / 2, "max |M_k^T M_k - I|": error}]
    return {"arms": arms, "per": per, "exact": exact}


HIGH = [0.9375, 0.96875, 1.0]
CHANCE = [0.0625, 0.125, 0.15625]


@pytest.mark.parametrize(
    ("m", "checks", "word"),
    [
        (_offsets(HIGH, CHANCE), [True, True, True], "held"),
        # the committed report's shape: sinusoids at chance like learned, the identity exact
        (_offsets([0.125, 0.15625, 0.1875], CHANCE), [True, False, False], "mixed"),
        # sinusoids generalise, but so do learned positions: the contrast is not resolved
        (_offsets(HIGH, [0.9, 0.95, 0.97]), [True, True, False], "mixed"),
        (_offsets(CHANCE, HIGH, error=1e-6), [False, False, False], "did not hold"),
        # boundaries: 0.9 exactly passes the bar, just below does not; an error of exactly
        # 1e-10 fails the strict float64 bound
        (_offsets([0.9, 0.95, 1.0], CHANCE), [True, True, True], "held"),
        (_offsets([0.9 - 1e-9, 0.95, 1.0], CHANCE), [True, False, True], "mixed"),
        (_offsets(HIGH, CHANCE, error=1e-10), [False, True, True], "mixed"),
        # every k: k = 4 alone falls short, below the bar on one seed and touching learned
        (_offsets(HIGH, CHANCE, by_k={4: [0.15625, 0.5, 0.95]}), [True, False, False], "mixed"),
    ],
)
def test_relative_offset_verdict_words(m, checks, word):
    got, reason = relative_offset.verdict(m)
    assert got == checks, reason
    assert verdict_of(got) == word  # the word write_up's outcome() draws from the checks
    assert "(chance 0.062; bar 0.9)" in reason


def test_relative_offset_reason_gives_the_worst_unseen_window():
    _, reason = relative_offset.verdict(_offsets(HIGH, CHANCE, error=3e-13))
    assert "holds to 3.0e-13 in float64" in reason
    assert "k=1: 0.969 (0.938-1); k=2: 0.969 (0.938-1); k=4: 0.969 (0.938-1)" in reason
    assert "against learned positions k=1: 0.115 (0.0625-0.156)" in reason


@pytest.mark.parametrize(
    ("states", "word"),
    [
        (["above", "above"], "held"),
        (["above", "inside"], "mixed"),
        (["above", "below"], "mixed"),
        (["below", "below"], "did not hold"),
        (["below", "inside"], "did not hold"),  # no check held, one resolved against
        (["inside", "inside"], "no effect resolved"),
    ],
)
def test_verdict_of_directions_reads_each_check_once(states, word):
    """The one rule long_range, source_reversal and enc_dec_vs_dec_only judge by."""
    assert verdict_of_directions(states) == word


def test_verdict_of_directions_refuses_an_unknown_state():
    with pytest.raises(ValueError, match="'above', 'below' or 'inside'"):
        verdict_of_directions(["above", "sideways"])
