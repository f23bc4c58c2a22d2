"""What a run writes besides checkpoints: metrics.jsonl (and the same as metrics.csv), loss.png,
TensorBoard, a progress bar (or a plain progress line when stderr is not a terminal).

``metrics.jsonl`` has one JSON object per line, e.g.::

    {"step": 100, "train_loss": 0.84, "lr": 0.003, "tokens_per_s": 51234.0, "elapsed_s": 12.1}
    {"step": 250, "train_loss": 0.31, ..., "val_loss": 0.29, "val_ppl": 1.34,
     "val_exact_match": 0.71}

``step`` counts optimizer steps done. ``train_loss`` is the mean per-target loss of the steps
since the previous line. On resume, lines past the checkpoint's step are dropped first, so the
file always describes one consistent history. ``metrics.csv`` holds the same records for
spreadsheets and pandas: one column per key in order of first appearance, empty cells where a
line lacks a key (training lines have no ``val_*``). The plot is drawn with matplotlib (Agg) by
:mod:`attnlab.train.loss_figure`, because ``train`` does not depend on ``attnlab.viz``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from attnlab.checkpoint.atomic import atomic_write_bytes, atomic_write_text, storage_errors
from attnlab.errors import ConfigError, DataError
from attnlab.train import loss_figure
from attnlab.train.loss_figure import loss_figure_png

PLOT_SHARE = 0.05  # at most this share of a run's wall time goes to redrawing loss.png

METRICS_FILE, CSV_FILE, PLOT_FILE = "metrics.jsonl", "metrics.csv", "loss.png"


def read_metrics(path: str | os.PathLike, *, strict: bool = False) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file, in file order: the one reader of the format
    :class:`MetricsLog` writes. Bytes that are not UTF-8 read as U+FFFD; a last line without its
    newline (a record being written, or torn by a crash) is skipped. Any other line that is not
    a JSON object is skipped too (a resumed run's own log: its good records are kept), or with
    ``strict`` (a file a user hands to a command) a DataError naming the line, and then records
    without a ``step`` are kept as well."""
    p = Path(path)
    if not p.is_file():
        if strict:
            raise DataError(f"no metrics file at {str(p)!r}")
        return []
    lines = p.read_text(encoding="utf-8", errors="replace").split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            if number == len(lines) or not strict:  # torn last line, or a log being resumed
                continue
            msg = getattr(err, "msg", str(err))
            raise DataError(f"{str(p)!r} line {number} is not valid JSON ({msg})") from None
        if not isinstance(record, dict):
            if strict:
                raise DataError(f"{str(p)!r} line {number} is not a JSON object: {line[:60]!r}")
            continue
        if strict or "step" in record:
            records.append(record)
    return records


class MetricsLog:
    """Append-only metrics.jsonl and its metrics.csv twin (:class:`CsvLog`, beside it);
    ``keep_until`` truncates a resumed run's files to its step."""

    def __init__(self, path: str | os.PathLike, keep_until: int | None = None):
        self.path = Path(path)
        if keep_until is None:
            old: list[dict[str, Any]] = []
        else:
            old = [r for r in read_metrics(self.path) if r["step"] <= keep_until]
        text = "".join(json.dumps(r) + "\n" for r in old)
        atomic_write_text(self.path, text)
        self.records = old
        self.csv = CsvLog(self.path.with_name(CSV_FILE), old)

    def append(self, record: dict[str, Any]) -> None:
        clean = {k: _jsonable(v) for k, v in record.items()}
        with storage_errors(self.path), open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(clean) + "\n")
        self.records.append(clean)
        self.csv.append(clean, self.records)


class CsvLog:
    """metrics.csv: rows appended under a header of every key seen so far; a record with a new
    key (the first evaluation's ``val_*``) rewrites the file once with the wider header."""

    def __init__(self, path: Path, records: list[dict[str, Any]]):
        self.path = path
        self.columns: list[str] = []
        self.rewrite(records)

    def rewrite(self, records: list[dict[str, Any]]) -> None:
        self.columns = list(dict.fromkeys(k for r in records for k in r)) or ["step"]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, self.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        atomic_write_text(self.path, buf.getvalue())

    def append(self, record: dict[str, Any], records: list[dict[str, Any]]) -> None:
        if any(k not in self.columns for k in record):
            self.rewrite(records)
            return
        with storage_errors(self.path), open(self.path, "a", encoding="utf-8") as f:
            csv.DictWriter(f, self.columns, lineterminator="\n").writerow(record)


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


def plot_loss(
    records: Iterable[dict[str, Any]], path: str | os.PathLike, title: str | None = None
) -> Path:
    """Loss curves (train, validation) and the task metric, written atomically as a PNG."""
    return atomic_write_bytes(path, loss_figure_png(records, title))


class LossPlotter:
    """Draws loss.png off the training loop's path: a worker thread renders the newest records.

    A run asks for a plot after every evaluation; drawing it (matplotlib's import included) takes
    ~0.1-1 s, which a GPU run would otherwise spend idle. ``request`` hands over a snapshot of
    the records and returns at once; a request made while the worker is busy replaces any older
    one that has not started, so the worker never falls behind. ``close`` waits for the last plot
    (the file is complete when ``train`` returns) and re-raises a drawing error there. The
    records only grow, so a request with as many records as the last one is the same plot and is
    not drawn again (the end of a run that has just evaluated).

    Redrawing is also rationed: a new drawing starts only while the drawings so far have taken at
    most ``max_share`` (default ``PLOT_SHARE``, 5 %) of the plotter's lifetime, so a run that
    evaluates every second does not spend a tenth of its CPU redrawing (measured on 2 cores: ~0.12
    s of CPU per drawing, 1.4 s for matplotlib's import; fast-char evaluates every ~1 s). Requests
    that arrive meanwhile replace each other, and ``close`` always draws the newest one, so the
    finished run's loss.png is complete.

    With ``separate_process`` (CUDA runs) the worker hands the records to a drawing process
    (:mod:`attnlab.train.loss_figure` run as a script, started with the plotter) and writes the
    PNG it answers: matplotlib's import and every drawing then run on another core, without the
    interpreter lock that the thread's own drawing takes from the steps, which on a GPU are
    launched from Python. A drawing process that fails or cannot start leaves the drawing to the
    thread, so the plot is never lost. CPU runs draw in the thread: their cores are busy with the
    steps anyway, and a process per run would import matplotlib again each time.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        title: str | None = None,
        separate_process: bool = False,
        max_share: float = PLOT_SHARE,
    ):
        self.path, self.title = Path(path), title
        self.max_share = max_share
        self.drawings, self.drawing_s = 0, 0.0  # how many were drawn, and their wall time
        self._born = time.perf_counter()
        self._pending: list[dict[str, Any]] | None = None
        self._requested = -1  # how many records the last request had
        self._error: BaseException | None = None
        self._wake = threading.Condition()
        self._closing = False
        self._drawer = _start_drawer() if separate_process else None
        self._thread = threading.Thread(target=self._work, name="attnlab-loss-plot", daemon=True)
        self._thread.start()

    def request(self, records: Iterable[dict[str, Any]]) -> None:
        snapshot = [dict(r) for r in records]
        if len(snapshot) == self._requested:
            return
        self._requested = len(snapshot)
        with self._wake:
            self._pending = snapshot
            self._wake.notify()

    def close(self) -> None:
        """Draw what is pending, stop the worker; raise its error, if drawing failed."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def discard(self) -> None:
        """Stop the worker without drawing what is pending (the run failed)."""
        with self._wake:
            self._pending = None
            self._closing = True
            self._wake.notify()
        self._thread.join()

    def _work(self) -> None:
        try:
            while True:
                with self._wake:
                    while not self._closing and (self._pending is None or self._wait_s() > 0):
                        self._wake.wait(None if self._pending is None else self._wait_s())
                    records, self._pending = self._pending, None
                    if records is None:  # closing, nothing left to draw
                        return
                began = time.perf_counter()
                try:
                    atomic_write_bytes(self.path, self._draw(records))
                except BaseException as err:  # reported by close(), on the training thread
                    self._error = err
                self.drawings += 1
                self.drawing_s += time.perf_counter() - began
        finally:
            _stop_drawer(self._drawer)

    def _wait_s(self) -> float:
        """Seconds until drawing again keeps drawing_s <= max_share x the plotter's lifetime."""
        return self._born + self.drawing_s / self.max_share - time.perf_counter()

    def _draw(self, records: list[dict[str, Any]]) -> bytes:
        """The PNG of ``records``: from the drawing process if there is one, else drawn here."""
        drawer = self._drawer
        if drawer is not None and drawer.stdin is not None and drawer.stdout is not None:
            asked = json.dumps({"records": records, "title": self.title}) + "\n"
            try:
                drawer.stdin.write(asked.encode())
                drawer.stdin.flush()
                status, _, size = drawer.stdout.readline().partition(b" ")
                body = drawer.stdout.read(int(size))
            except (OSError, ValueError):  # it died: the thread draws from now on
                _stop_drawer(drawer)
                self._drawer = None
            else:
                if status == b"ok" and len(body) == int(size):
                    return body
        return loss_figure_png(records, self.title)  # also raises the drawing's own error


def _start_drawer() -> subprocess.Popen[bytes] | None:
    """The drawing process (see LossPlotter), or None where none can start. Isolated (-I): its
    own module alone, not the training's sys.path; its own session, so that a Ctrl-C meant for
    the training (which finishes the step and saves) does not kill it mid-plot."""
    if not sys.executable:
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-I", str(Path(loss_figure.__file__))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return None


def _stop_drawer(drawer: subprocess.Popen[bytes] | None) -> None:
    """End the drawing process: its stdin closed, it exits (killed if it does not, in 5 s)."""
    if drawer is None:
        return
    with contextlib.suppress(OSError):
        if drawer.stdin is not None:
            drawer.stdin.close()
    try:
        drawer.wait(timeout=5)
    except subprocess.TimeoutExpired:
        drawer.kill()
        drawer.wait()
    if drawer.stdout is not None:
        drawer.stdout.close()


class WandbLog:
    """Scalars to Weights & Biases (needs ``wandb``): one W&B run per attnlab run, named after the
    run directory, its files in ``run_dir/wandb``, the run config as its config; a resumed run
    continues the same W&B run (its id is kept in ``run_dir/wandb/run_id``)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], resumed: bool):
        try:
            import wandb  # optional extra: train --wandb
        except ImportError:
            raise ConfigError(
                "wandb=true needs the wandb package, which is not installed; install it "
                "(pip install 'attnlab[wandb]') or turn wandb off"
            ) from None
        folder = run_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / "run_id"
        run_id = id_file.read_text().strip() if resumed and id_file.is_file() else None
        run_id = run_id or uuid.uuid4().hex[:12]
        atomic_write_text(id_file, run_id)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "attnlab"),
            name=run_dir.name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=config,
        )

    def log(self, record: dict[str, Any]) -> None:
        values = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        self.run.log(values, step=record["step"])

    def close(self) -> None:
        self.run.finish()


class Boards:
    """The optional metric sinks of a run (TensorBoard, Weights & Biases) behind one log/close."""

    def __init__(self, sinks: list[Any]):
        self.sinks = sinks

    def log(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_boards(run_dir: Path, run_config: Any, resumed: bool = False) -> Boards | None:
    """The sinks ``run_config.train`` asks for (``tensorboard``, ``wandb``), or None."""
    cfg = run_config.train
    sinks: list[Any] = []
    if cfg.tensorboard:
        sinks.append(TensorBoard(run_dir / "tensorboard"))
    if cfg.wandb:
        config = {"model": run_config.model.to_dict(), "train": cfg.to_dict()}
        sinks.append(WandbLog(run_dir, config, resumed))
    return Boards(sinks) if sinks else None


class TensorBoard:
    """Scalars to TensorBoard event files in ``run_dir/tensorboard`` (needs ``tensorboard``)."""

    def __init__(self, log_dir: str | os.PathLike):
        try:
            from torch.utils.tensorboard import SummaryWriter  # optional extra
        except ImportError:
            raise ConfigError(
                "tensorboard=true needs the tensorboard package, which is not installed; "
                "install it (pip install 'attnlab[tensorboard]') or turn tensorboard off"
            ) from None
        self.writer = SummaryWriter(str(log_dir))

    def log(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, record["step"])

    def close(self) -> None:
        self.writer.close()


def progress_bar(total: int, initial: int, enabled: bool, log_every: int = 1) -> Any:
    """A tqdm bar on stderr showing the step, loss, tokens/s and ETA in a terminal; elsewhere (a
    log file, a batch job) :class:`ProgressLines`, a line on each of about 20 logged steps. The
    loss shown is the one logged (every ``log_every`` steps), set before the step's update."""
    if enabled and not sys.stderr.isatty():
        return ProgressLines(total, initial, log_every=log_every)
    show = enabled and sys.stderr.isatty()
    size = shutil.get_terminal_size((100, 24))  # some ptys report 0 x 0, which hides the bar
    return tqdm(
        total=total,
        initial=initial,
        disable=not show,
        unit="step",
        ncols=size.columns,
        nrows=size.lines,
        smoothing=0.1,
        file=sys.stderr,
    )


class ProgressLines:
    """The progress bar's facts as a plain line on stderr, for logs: about 20 lines per run
    (every ``total // 20`` steps rounded up to a multiple of ``log_every``, so that each falls on
    a step whose loss was just logged; at least one a minute) and one at the end::

        step 500/2000 (25%)  loss 1.234  tok_s 51234  elapsed 1m05s  eta 3m15s

    A line between logged steps (the minute's, or the last) names the step its loss is from:
    ``loss 1.234  tok_s 51234  (at step 490)``. The caller sets the postfix of a step before
    calling ``update`` for it.
    """

    def __init__(
        self,
        total: int,
        initial: int,
        lines: int = 20,
        every_s: float = 60.0,
        log_every: int = 1,
    ):
        every = max(1, total // lines)
        self.total, self.step, self.every = total, initial, -(-every // log_every) * log_every
        self.every_s, self.initial = every_s, initial
        self.started = self.shown_at = time.perf_counter()
        self.postfix: dict[str, Any] = {}
        self.fresh, self.postfix_at = False, initial  # set since the last update; its step

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def set_postfix(self, refresh: bool = False, **values: Any) -> None:
        self.postfix, self.fresh = values, True

    def update(self, n: int = 1) -> None:
        self.step += n
        if self.fresh:
            self.postfix_at, self.fresh = self.step, False
        now = time.perf_counter()
        due = self.step % self.every == 0 or now - self.shown_at >= self.every_s
        if due or self.step == self.total:
            self.shown_at = now
            print(self.line(now - self.started), file=sys.stderr, flush=True)

    def line(self, elapsed: float) -> str:
        done = self.step - self.initial
        parts = [f"step {self.step}/{self.total} ({100 * self.step / max(self.total, 1):.0f}%)"]
        parts += [f"{k} {v}" for k, v in self.postfix.items()]
        if self.postfix and self.postfix_at != self.step:
            parts.append(f"(at step {self.postfix_at})")
        parts.append(f"elapsed {_duration(elapsed)}")
        if done > 0 and self.step < self.total:
            parts.append(f"eta {_duration(elapsed / done * (self.total - self.step))}")
        return "  ".join(parts)


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m{s:02d}s" if hours else f"{m}m{s:02d}s" if m else f"{s}s"


def format_metrics(metrics: dict[str, float]) -> str:
    """``val_loss 0.0123  val_ppl 1.01  val_exact_match 99.20%`` for humans."""
    parts = []
    for key, value in metrics.items():
        if key.endswith(("exact_match", "accuracy")):
            parts.append(f"{key} {100 * value:.2f}%")
        elif isinstance(value, float):
            parts.append(f"{key} {value:.4g}")
        else:
            parts.append(f"{key} {value}")
    return "  ".join(parts)
