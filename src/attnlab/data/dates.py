"""Date normalisation: a human-readable date in one of many formats -> ISO 8601 "1998-03-03".

The classic toy task for attention (the "neural machine translation of dates" exercise): the
model must find the day, month and year wherever each format puts them, so the alignment
between source and target characters moves around from format to format.

A format is a template with these fields (English names, never the system locale):

    {weekday} tuesday   {Weekday} Tuesday   {WEEKDAY} TUESDAY   {wkd} tue   {Wkd} Tue
    {month}   march     {Month}   March     {MONTH}   MARCH     {mon} mar   {Mon} Mar
    {d} 3    {dd} 03    {dth} 3rd    {m} 3    {mm} 03    {yy} 98    {yyyy} 1998

Two-digit years: 50-99 mean 1950-1999 and 00-49 mean 2000-2049, so with the default year range
1950-2049 every "{yy}" is unambiguous. Numeric formats are year-first (ISO order,
"yyyy-mm-dd") or day-first ("dd/mm/yy", European), never month-first, so "03/04/98" always means
3 April. Weekdays are always the true weekday.
"""

from __future__ import annotations

import datetime as dt
import string
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

MONTHS = (
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
)  # fmt: skip
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

DATE_FORMATS = (
    "{weekday} {d} {month} {yyyy}",  # tuesday 3 march 1998
    "{dd}/{mm}/{yy}",  # 03/03/98
    "{Month} {dth}, {yyyy}",  # March 3rd, 1998
    "{d} {Mon} {yyyy}",  # 3 Mar 1998
    "{yyyy}.{mm}.{dd}",  # 1998.03.03
    "{mon} {d} {yy}",  # mar 3 98
    "{WEEKDAY}, {MONTH} {d}, {yyyy}",  # TUESDAY, MARCH 3, 1998
    "{yyyy}-{mm}-{dd}",  # 1998-03-03 (already ISO)
    "{dd}.{mm}.{yyyy}",  # 03.03.1998
    "{Wkd}, {d} {Mon} {yyyy}",  # Tue, 3 Mar 1998
    "{dth} of {Month} {yyyy}",  # 3rd of March 1998
    "{yyyy}{mm}{dd}",  # 19980303
    "{Weekday}, {Month} {d}, {yyyy}",  # Tuesday, March 3, 1998
    "{d}-{mon}-{yyyy}",  # 3-mar-1998
    "{dd} {month} {yy}",  # 03 march 98
    "{d}/{m}/{yyyy}",  # 3/3/1998
)


def ordinal(n: int) -> str:
    """1 -> '1st', 2 -> '2nd', 3 -> '3rd', 11 -> '11th', 22 -> '22nd'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def date_fields(date: dt.date) -> dict[str, str]:
    """Every template field for ``date``."""
    month, weekday = MONTHS[date.month - 1], WEEKDAYS[date.weekday()]
    return {
        "weekday": weekday,
        "Weekday": weekday.title(),
        "WEEKDAY": weekday.upper(),
        "wkd": weekday[:3],
        "Wkd": weekday[:3].title(),
        "month": month,
        "Month": month.title(),
        "MONTH": month.upper(),
        "mon": month[:3],
        "Mon": month[:3].title(),
        "d": str(date.day),
        "dd": f"{date.day:02d}",
        "dth": ordinal(date.day),
        "m": str(date.month),
        "mm": f"{date.month:02d}",
        "yy": f"{date.year % 100:02d}",
        "yyyy": f"{date.year:04d}",
    }


def render_date(date: dt.date, template: str) -> str:
    """``render_date(date(1998, 3, 3), "{Month} {dth}, {yyyy}") == "March 3rd, 1998"``."""
    try:
        return template.format(**date_fields(date))
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(
            f"bad date template {template!r} ({err}); use fields among {sorted(date_fields(date))}"
        ) from None


@dataclass(frozen=True)
class DateTask:
    """Pairs (date in a random format, ISO date) for dates uniform in [min_year, max_year]."""

    name: ClassVar[str] = "dates"
    min_year: int = 1950
    max_year: int = 2049
    formats: tuple[str, ...] = DATE_FORMATS

    def __post_init__(self) -> None:
        if not 1 <= self.min_year <= self.max_year <= 9999:
            raise ValueError(
                f"need 1 <= min_year <= max_year <= 9999, got {self.min_year}..{self.max_year}"
            )
        if not self.formats:
            raise ValueError("formats is empty; give at least one template, e.g. DATE_FORMATS")
        for template in self.formats:
            render_date(dt.date(2000, 1, 1), template)  # raises on unknown fields
        two_digit = [f for f in self.formats if "{yy}" in f]
        if two_digit and (self.min_year < 1950 or self.max_year > 2049):
            raise ValueError(
                f"two-digit-year formats {two_digit} are ambiguous outside 1950-2049; "
                f"narrow the year range or drop those formats"
            )

    def make_pairs(self, n: int, seed: int = 0) -> list[tuple[str, str]]:
        """``n`` (source, target) pairs, a pure function of (self, n, seed)."""
        rng = np.random.default_rng([seed])
        first = dt.date(self.min_year, 1, 1).toordinal()
        last = dt.date(self.max_year, 12, 31).toordinal()
        days = rng.integers(first, last + 1, size=n)
        which = rng.integers(0, len(self.formats), size=n)
        pairs = []
        for day, k in zip(days.tolist(), which.tolist()):
            date = dt.date.fromordinal(day)
            pairs.append((render_date(date, self.formats[k]), date.isoformat()))
        return pairs

    def characters(self) -> str:
        """Every character a source or target can contain, sorted (for a CharTokenizer)."""
        chars = set(string.digits + "-")
        start = dt.date(2000, 1, 1).toordinal()
        for day in range(start, start + 366):  # every month, weekday and day of the month
            for template in self.formats:
                chars.update(render_date(dt.date.fromordinal(day), template))
        return "".join(sorted(chars))
