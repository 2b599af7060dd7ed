"""SIGINT and SIGTERM as KeyboardInterrupt, so that a run stopped by Ctrl-C, `timeout` or a
job scheduler unwinds: partial results are saved and half-written files removed."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["signals_interrupt"]


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise KeyboardInterrupt("signal SIGTERM").

    Needed for SIGINT too: a shell starts background jobs with SIGINT ignored, which Python
    inherits. Outside the main thread (where handlers cannot be set) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
