"""The explorer's request fields, read strictly: one readable sentence per bad value.

A whole number must be a JSON integer (``1``, not ``1.0``, ``0.9``, ``true`` or ``"1"``), a number
must be finite, text must be a string a browser can send (no lone surrogates), and every value lies
in its range. The page, the widget and the JSON API share these checks (session.py,
predictions.py); the stream's query string is turned into the same typed values first
(:func:`from_query`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from attnlab.errors import ExploreError

# Stream fields that are whole numbers / numbers (query strings arrive as text).
WHOLE = ("max_new_tokens", "top_k", "beams", "seed", "layer", "head")
NUMBER = ("temperature", "top_p", "pace_ms")
_INT = re.compile(r"[+-]?\d{1,30}")


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters (an error never echoes a megabyte back)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "…" + text[-4:]


def whole(name: str, value: Any, lo: int, hi: int) -> int:
    """``value`` as an int in [lo, hi]; a float, bool or string is refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ExploreError(f"{name} must be a whole number, got {shown(value)}.")
    if not lo <= value <= hi:
        raise ExploreError(f"{name} must be between {lo} and {hi}, got {shown(value)}.")
    return value


def number(name: str, value: Any, lo: float, hi: float) -> float:
    """``value`` as a finite float in [lo, hi]; a bool or string is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ExploreError(f"{name} must be a number, got {shown(value)}.")
    if isinstance(value, int) and abs(value) > 1e300:
        raise ExploreError(f"{name} must be between {lo} and {hi}, got {shown(value)}.")
    value = float(value)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise ExploreError(f"{name} must be between {lo} and {hi}, got {shown(value)}.")
    return value


def text(name: str, value: Any, default: str | None = None) -> str | None:
    """``value`` as text (``None`` -> ``default``); lone surrogates are refused."""
    if value is None:
        return default
    if not isinstance(value, str):
        raise ExploreError(f"{name} must be text, got {type(value).__name__}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = f"{ord(value[err.start]):#06x}"
        message = f"{name} holds a lone surrogate ({bad}), which is not a character; remove it."
    else:
        return value
    raise ExploreError(message)


def temperature(value: Any) -> float:
    """0 (greedy) or a temperature large enough that z / tau stays finite."""
    t = number("temperature", value, 0.0, 100.0)
    if 0 < t < 1e-3:
        raise ExploreError(f"temperature must be 0 (greedy) or at least 0.001, got {t:g}.")
    return t


def from_query(params: dict[str, str]) -> dict[str, Any]:
    """A stream request's query string as typed values (whole numbers, numbers, JSON lists)."""
    out: dict[str, Any] = {}
    for key, raw in params.items():
        if key in WHOLE:
            if not _INT.fullmatch(raw.strip()):
                raise ExploreError(f"{key} must be a whole number, got {shown(raw)}.")
            out[key] = int(raw)
        elif key in NUMBER:
            try:
                out[key] = float(raw)
            except ValueError:
                raise ExploreError(f"{key} must be a number, got {shown(raw)}.") from None
        elif key == "ablate":
            try:
                out[key] = json.loads(raw) if raw else None
            except (ValueError, RecursionError):
                raise ExploreError("ablate must be a JSON list of heads.") from None
        else:
            out[key] = raw
    return out
