"""Where a run's wall time goes: seconds per named phase (imports, data, model, first step, ...).

A phase is timed on the thread that runs it, as *self time*: a phase opened inside another
(``data`` inside ``setup``) is taken out of the outer one, so the phases never overlap and

    wall time = sum of the phases + what no phase covered ("other")

holds exactly for the span the outermost phases cover. The training loop times its own phases
(:data:`RUN_PHASES`); ``attnlab train`` adds the process's imports, its config and the attention
heatmaps, ends with two lines (the issue-37 form, then the breakdown; e.g.) and writes the whole
table to ``run_dir/timing.json``::

    time: 21.8 s of training (10.9 ms per step after the first), 4.1 s of setup and evaluation
      (25.9 s since the command started)
    setup and evaluation: imports 1.9 s, data 0.4 s, model 0.3 s, first step 0.9 s,
      evaluation 8 x 0.10 s, checkpoints 0.20 s, ... , other 0.10 s

"Training" is the optimizer steps after the first; the first step (which compiles under
``torch.compile``) counts with setup and evaluation.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnlab.checkpoint.atomic import atomic_write_text

TIMING_FILE = "timing.json"
TRAINING = "training"  # the steps after the first: the one phase that is not overhead
# The loop's phases, in the order a run meets them (attnlab.train.loop).
RUN_PHASES = (
    "setup",  # run directory, resume point, settings checks, lock
    "data",  # tokenizer, corpus preparation, windows / pairs
    "model",  # build (or the checkpoint's), pretrained weights, DDP / torch.compile wrappers
    "device",  # the memory check and the move to the device (on CUDA: the context's start-up)
    "optimizers",  # their construction (torch.optim's first use imports torch._dynamo), resume
    "logs",  # config.toml, metrics.jsonl, TensorBoard / W&B, the loss-plot worker
    "first step",  # with torch.compile: the compilation (or the cache's load)
    TRAINING,
    "evaluation",
    "metrics log",  # metrics.jsonl / metrics.csv lines
    "checkpoints",
    "finish",  # the best checkpoint's pointer, TensorBoard / W&B closed
    "loss plot",  # (inside finish) waiting for the last loss.png
)


class PhaseTimes:
    """Seconds and counts of named phases, in the order first met (see module docstring)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self._inner: list[float] = []  # per open phase: the seconds of the phases inside it

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name`` (its self time: phases opened inside it excluded)."""
        began = time.perf_counter()
        self.seconds.setdefault(name, 0.0)  # listed in the order the phases start
        self.counts.setdefault(name, 0)
        self._inner.append(0.0)
        try:
            yield
        finally:
            took = time.perf_counter() - began
            self._record(name, took - self._inner.pop(), 1)
            if self._inner:  # not the enclosing phase's own time
                self._inner[-1] += took

    def add(self, name: str, seconds: float, count: int = 1) -> None:
        """Add ``seconds`` to phase ``name`` (a phase timed elsewhere, e.g. the imports)."""
        self._record(name, seconds, count)
        if self._inner:  # timed inside an open phase: not that phase's own time
            self._inner[-1] += seconds

    def _record(self, name: str, seconds: float, count: int) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.counts[name] = self.counts.get(name, 0) + count

    def update(self, other: PhaseTimes) -> None:
        """Add every phase of ``other`` (in its order), e.g. a call's phases to the command's."""
        for name, seconds in other.seconds.items():
            self.add(name, seconds, other.counts[name])

    def total(self) -> float:
        return sum(self.seconds.values())

    def overhead(self) -> float:
        """Seconds of every phase but the training steps."""
        return self.total() - self.seconds.get(TRAINING, 0.0)

    def to_dict(self, wall_s: float | None = None) -> dict[str, Any]:
        """``{"phases": [{"name", "seconds", "count"}, ...], "wall_s", "other_s"}`` (JSON)."""
        record: dict[str, Any] = {
            "phases": [
                {"name": k, "seconds": round(v, 6), "count": self.counts[k]}
                for k, v in self.seconds.items()
            ]
        }
        if wall_s is not None:
            record["wall_s"] = round(wall_s, 6)
            record["other_s"] = round(wall_s - self.total(), 6)
        return record


def format_phases(times: PhaseTimes, wall_s: float | None = None) -> str:
    """``imports 1.9 s, data 0.4 s, evaluation 8 x 0.10 s, ..., other 0.1 s``: every phase but
    the training steps; ``other`` (the wall time no phase covered) when ``wall_s`` is given."""
    parts = []
    for name, seconds in times.seconds.items():
        if name == TRAINING:
            continue
        n = times.counts[name]
        if n > 1 and name in ("evaluation", "checkpoints"):
            parts.append(f"{name} {n} x {seconds / n:.2f} s")
        else:
            parts.append(f"{name} {seconds:.2f} s")
    if wall_s is not None:
        parts.append(f"other {wall_s - times.total():.2f} s")
    return ", ".join(parts)


def time_summary(times: PhaseTimes, steps: int, wall_s: float | None) -> str:
    """The run summary's time line (issue form "N s of training, M s of setup and evaluation")
    and the breakdown line under it. ``steps``: optimizer steps of this call; ``wall_s``:
    seconds since the process started (None where unknown: the phases' sum stands in)."""
    training = times.seconds.get(TRAINING, 0.0)
    text = f"time: {training:.1f} s of training"
    if steps > 1:
        text += f" ({1e3 * training / (steps - 1):.1f} ms per step after the first)"
    total = times.total() if wall_s is None else wall_s
    text += f", {total - training:.1f} s of setup and evaluation"
    if wall_s is not None:
        text += f" ({wall_s:.1f} s since the command started)"
    return text + "\nsetup and evaluation: " + format_phases(times, wall_s)


def write_timing(run_dir: str | Path, times: PhaseTimes, wall_s: float | None) -> Path:
    """``run_dir/timing.json``: the phases of this call (see :meth:`PhaseTimes.to_dict`)."""
    return atomic_write_text(
        Path(run_dir) / TIMING_FILE, json.dumps(times.to_dict(wall_s), indent=1) + "\n"
    )
