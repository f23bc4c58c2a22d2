"""Graceful stops: Ctrl-C (SIGINT) or SIGTERM finish the current step, save, and exit.

Inside :class:`GracefulStop` the first signal only sets ``signum``; the training loop checks it
after every optimizer step, saves a checkpoint and returns, and the CLI exits with the shell's
convention 128 + signal number (130 for Ctrl-C, 143 for SIGTERM). A second Ctrl-C while stopping
raises ``KeyboardInterrupt`` at once; the atomic checkpoint writes keep the previous checkpoint
intact even then. Handlers can only be installed from the main thread; elsewhere (e.g. a
notebook worker thread) the block runs without them.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

EXIT_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + signal number


class GracefulStop:
    """Context manager recording the first SIGINT/SIGTERM instead of dying mid-step."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """The shell's code for the signal received; SIGTERM's 143 when the stop came from
        another rank (this one received nothing)."""
        return 143 if self.signum is None else EXIT_CODES.get(self.signum, 143)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signum = signum

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in EXIT_CODES:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
