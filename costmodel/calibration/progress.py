"""A one-line progress display for long measurements, written to a stream the caller owns.

On a terminal the line is redrawn in place at most every 0.2 s; otherwise (logs, CI) a
line is written every 10% of the work. `rich`/`tqdm` are not needed.
"""

from __future__ import annotations

import time
from typing import TextIO

from costmodel.calibration.plan import SweepPoint

__all__ = ["ProgressLine"]


class ProgressLine:
    def __init__(self, stream: TextIO, label: str):
        self.stream = stream
        self.label = label
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._last = 0.0
        self._last_decile = -1
        self._again = False

    def __call__(self, done: int, total: int, point: SweepPoint, elapsed_s: float, *,
                 again: bool = False) -> None:
        now = time.monotonic()
        if again != self._again:  # a pass of its own: the sweep's last decile (10) hid a
            self._again, self._last_decile = again, -1  # retake pass of one measurement
        left = elapsed_s / done * (total - done) if done else float("nan")
        label = f"{self.label} again" if again else self.label
        text = (f"{label} [{done:4d}/{total}] {point.describe():42.42s} "
                f"{elapsed_s:6.1f} s, ~{left:4.0f} s left")
        if self.tty:
            if now - self._last >= 0.2 or done == total:
                self.stream.write("\r" + text)
                if done == total:
                    self.stream.write("\n")
                self.stream.flush()
                self._last = now
        else:
            decile = done * 10 // total
            if decile != self._last_decile:
                self._last_decile = decile
                self.stream.write(text + "\n")
                self.stream.flush()
