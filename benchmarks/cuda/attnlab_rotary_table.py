"""``python -m attnlab_rotary_table ...``: attnlab's CLI, rotary cos/sin read from a float32 table.

A measurement of a candidate fix (issue 37), applied as a patch because ``attnlab.nn`` is frozen
while the translation experiment runs in pieces (its code hash covers it). Compiled, today's
``RotaryPositions.cos_sin`` lets inductor inline the float64 angles -> cos, sin into every
pointwise kernel that uses them, so each element of q and k recomputes float64 cos and sin
(benchmarks/cuda/profile_step.py: one fused kernel 21.8 ms of a 29.5 ms step). Here every rotary
module keeps cos and sin of positions 0..TABLE-1 in float32, made once from the float64 angles,
and a rotation gathers its rows.

    PYTHONPATH=src:benchmarks/cuda python -m attnlab_rotary_table train --preset gpu-char ...
"""

from __future__ import annotations

import sys

import torch

from attnlab.nn.positional import RotaryPositions

TABLE = 8192  # positions in the table (gpu-char's context is 256)


def make_tables(m: RotaryPositions) -> None:
    """cos, sin of positions 0..TABLE-1 in float32 on theta_i's device: (TABLE, Dh/2) each."""
    with torch.no_grad():
        pos = torch.arange(TABLE, dtype=torch.float64, device=m.frequencies.device)
        angles = pos[:, None] * m.frequencies  # (TABLE, Dh/2) float64
        m._table = (torch.cos(angles).float(), torch.sin(angles).float())


def cos_sin_from_table(self: RotaryPositions, positions: torch.Tensor, dtype: torch.dtype):
    """cos, sin of ``positions`` (T,) or (B, T): (T, Dh/2) or (B, 1, T, Dh/2) in ``dtype``."""
    table = getattr(self, "_table", None)
    if table is None or table[0].device != positions.device:
        make_tables(self)
        table = self._table
    cos, sin = table[0][positions], table[1][positions]
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
    return cos.to(dtype), sin.to(dtype)


def install() -> tuple:
    """Patch RotaryPositions: tables made at construction, moved by ``.to``, read by cos_sin.
    Returns what :func:`uninstall` puts back."""
    saved = RotaryPositions.__init__, RotaryPositions._apply, RotaryPositions.cos_sin
    init, apply = saved[:2]

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        make_tables(self)

    def _apply(self, fn, recurse: bool = True):
        out = apply(self, fn, recurse)
        make_tables(self)  # on theta_i's new device, before any compiled call reads it
        return out

    RotaryPositions.__init__, RotaryPositions._apply = __init__, _apply
    RotaryPositions.cos_sin = cos_sin_from_table
    return saved


def uninstall(saved: tuple) -> None:
    """Undo :func:`install`."""
    RotaryPositions.__init__, RotaryPositions._apply, RotaryPositions.cos_sin = saved


if __name__ == "__main__":
    install()
    from attnlab.cli import main

    sys.exit(main())
