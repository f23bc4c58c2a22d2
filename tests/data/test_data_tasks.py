"""Generated tasks: correctness of every target, determinism from the seed, date formats."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.data import (
    CLASSIFICATION_TASKS,
    DATE_FORMATS,
    TASKS,
    AdditionTask,
    BalancedParensTask,
    DateTask,
    MajorityTask,
    ReverseTask,
    SortTask,
    make_task,
    render_date,
)
from attnlab.data.dates import ordinal

seeds = st.integers(min_value=0, max_value=2**32 - 1)


@pytest.mark.parametrize("name", sorted(TASKS) + sorted(CLASSIFICATION_TASKS))
def test_every_task_is_deterministic_from_its_seed(name):
    task = make_task(name)
    assert task.make_pairs(50, seed=3) == task.make_pairs(50, seed=3)
    assert task.make_pairs(50, seed=3) != task.make_pairs(50, seed=4)
    chars = set(task.characters())
    for src, tgt in task.make_pairs(200, seed=0):
        assert set(src) <= chars
        if name in TASKS:
            assert set(tgt) <= chars


@given(seeds)
@settings(max_examples=25)
def test_copy_reverse_sort_targets(seed):
    for src, tgt in make_task("copy", min_len=2, max_len=7).make_pairs(20, seed):
        assert tgt == src and 2 <= len(src) <= 7
    for src, tgt in ReverseTask(max_len=12, alphabet="01").make_pairs(20, seed):
        assert list(tgt) == list(reversed(src)) and set(src) <= {"0", "1"}
    task = SortTask(alphabet="zyx")  # sort follows the alphabet's order, not code points
    for src, tgt in task.make_pairs(20, seed):
        assert Counter(tgt) == Counter(src)
        assert [task.alphabet.index(c) for c in tgt] == sorted(task.alphabet.index(c) for c in src)


@given(seeds)
@settings(max_examples=25)
def test_addition_sums_are_right(seed):
    for src, tgt in AdditionTask(min_digits=2, max_digits=4).make_pairs(30, seed):
        a, b = src.split("+")
        assert int(a) + int(b) == int(tgt)
        assert 2 <= len(a) <= 4 and 2 <= len(b) <= 4 and not a.startswith("0")
    for src, tgt in AdditionTask(reverse_target=True).make_pairs(10, seed):
        a, b = src.split("+")
        assert int(tgt[::-1]) == int(a) + int(b)


def test_task_settings_are_validated():
    with pytest.raises(ValueError, match="unknown task 'translate'"):
        make_task("translate")
    with pytest.raises(ValueError, match="unknown ReverseTask key.*valid keys are: min_len"):
        make_task("reverse", length=3)
    with pytest.raises(ValueError, match="min_len <= max_len"):
        ReverseTask(min_len=5, max_len=2)
    with pytest.raises(ValueError, match="2\\+ distinct"):
        SortTask(alphabet="aa")
    with pytest.raises(ValueError, match="seed"):
        ReverseTask().make_pairs(3, seed=-1)


# Dates --------------------------------------------------------------------------------------
STRPTIME = {
    "weekday": "%A", "Weekday": "%A", "WEEKDAY": "%A", "wkd": "%a", "Wkd": "%a",
    "month": "%B", "Month": "%B", "MONTH": "%B", "mon": "%b", "Mon": "%b",
    "d": "%d", "dd": "%d", "dth": "%d", "m": "%m", "mm": "%m", "yy": "%y", "yyyy": "%Y",
}  # fmt: skip


def parse_back(text: str, template: str) -> dt.date:
    """An independent parser: the template as a strptime pattern, plus our two conventions."""
    pattern = template.format(**STRPTIME)
    if "{dth}" in template:
        text = re.sub(r"\b(\d{1,2})(st|nd|rd|th)\b", r"\1", text)
    parsed = time.strptime(text, pattern)
    year = parsed.tm_year
    if "{yy}" in template:  # ours: 50-99 -> 19xx, 00-49 -> 20xx (strptime pivots at 69)
        year = 1900 + year % 100 if year % 100 >= 50 else 2000 + year % 100
    date = dt.date(year, parsed.tm_mon, parsed.tm_mday)
    if "{weekday}" in template.lower() or "{wkd}" in template.lower():
        assert parsed.tm_wday == date.weekday(), f"wrong weekday in {text!r}"
    return date


@pytest.mark.parametrize("template", DATE_FORMATS)
def test_every_date_format_parses_back_to_the_iso_target(template):
    task = DateTask(formats=(template,))
    pairs = task.make_pairs(300, seed=1)
    for src, tgt in pairs:
        assert parse_back(src, template).isoformat() == tgt
        assert 1950 <= int(tgt[:4]) <= 2049


def test_date_formats_from_the_brief():
    d = dt.date(1998, 3, 3)
    expected = {
        "{weekday} {d} {month} {yyyy}": "tuesday 3 march 1998",
        "{dd}/{mm}/{yy}": "03/03/98",
        "{Month} {dth}, {yyyy}": "March 3rd, 1998",
        "{d} {Mon} {yyyy}": "3 Mar 1998",
        "{yyyy}.{mm}.{dd}": "1998.03.03",
        "{mon} {d} {yy}": "mar 3 98",
    }
    for template, text in expected.items():
        assert template in DATE_FORMATS
        assert render_date(d, template) == text
    thursday = render_date(dt.date(1998, 3, 5), "{WEEKDAY}, {MONTH} {d}, {yyyy}")
    assert thursday == "THURSDAY, MARCH 5, 1998"
    assert len(DATE_FORMATS) >= 10 and len(set(DATE_FORMATS)) == len(DATE_FORMATS)


def test_date_task_uses_every_format_and_spans_the_years():
    pairs = DateTask().make_pairs(4000, seed=0)
    years = [int(t[:4]) for _, t in pairs]
    assert min(years) < 1955 and max(years) > 2044
    used = {
        f
        for f in DATE_FORMATS
        if any(s == render_date(dt.date.fromisoformat(t), f) for s, t in pairs)
    }
    assert used == set(DATE_FORMATS)


def test_ordinals():
    got = [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 31)]
    assert got == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "23rd",
        "31st",
    ]


def test_date_task_validation():
    with pytest.raises(ValueError, match="ambiguous outside 1950-2049"):
        DateTask(min_year=1900)
    DateTask(min_year=1900, formats=("{yyyy}-{mm}-{dd}",))  # fine without two-digit years
    with pytest.raises(ValueError, match="bad date template"):
        DateTask(formats=("{day}",))


# Classification -----------------------------------------------------------------------------
def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}[ch]
        if depth < 0:
            return False
    return depth == 0


@given(seeds)
@settings(max_examples=20)
def test_parens_labels_are_right_and_counts_never_tell(seed):
    pairs = BalancedParensTask(max_pairs=6).make_pairs(40, seed)
    for text, label in pairs:
        assert label == ("balanced" if _balanced(text) else "unbalanced")
        assert text.count("(") == text.count(")") and 2 <= len(text) <= 12


def test_parens_has_both_classes():
    labels = Counter(label for _, label in BalancedParensTask().make_pairs(400, seed=0))
    assert set(labels) == set(BalancedParensTask.labels)
    assert min(labels.values()) > 150


@given(seeds)
@settings(max_examples=20)
def test_majority_label_is_the_unique_most_common_symbol(seed):
    task = MajorityTask(alphabet="xyz")
    for text, label in task.make_pairs(30, seed):
        (top, n), *rest = Counter(text).most_common()
        assert label == top and all(m < n for _, m in rest)
        assert label in task.labels
