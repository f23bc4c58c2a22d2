"""A verdict word from checks that each read one of three ways (docs/lab.md, the verdict words):

* "above": resolved as the claim says (seed ranges apart, in the claimed direction);
* "below": resolved otherwise (the other way, or short of the claim's margin);
* "inside": inside the seed spread.

held: every check above; mixed: some above, others not; did not hold: none above and some
below; no effect resolved: every check inside. (Beside ``verdict.verdict_of``, which reads
checks as plain booleans; it belongs in ``verdict.py`` once that module may change without
staling the translation run.)
"""

from __future__ import annotations

from collections.abc import Iterable


def verdict_of_directions(states: Iterable[str]) -> str:
    """The verdict word of checks read as "above", "below" or "inside" (module docstring)."""
    seen = set(states)
    if not seen <= {"above", "below", "inside"}:
        raise ValueError(f"each check reads 'above', 'below' or 'inside', got {sorted(seen)}")
    if seen == {"above"}:
        return "held"
    if "above" in seen:
        return "mixed"
    return "did not hold" if "below" in seen else "no effect resolved"
