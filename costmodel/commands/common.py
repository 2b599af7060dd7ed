"""Argument parsing shared by several commands."""

from __future__ import annotations

import argparse
import math


def comma_ints(text: str, flag: str) -> list[int]:
    """'512,4096' (or '512 4096') -> [512, 4096]; a clear error for junk, empty or < 1."""
    try:
        values = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"{flag} must be comma-separated positive integers, got {text!r}")
    return values


def add_settle_argument(parser, default: float | str = 10.0) -> None:
    """--settle-s: seconds of heavy GPU work before measuring (costmodel.calibration.device.settle_gpu)."""
    parser.add_argument(
        "--settle-s", type=seconds, default=default if isinstance(default, float) else None,
        help="seconds of large matrix products before measuring, so that clocks are at the "
        f"level a training run settles to (default {default}; 0: none)",
    )


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds >= 0 (``inf`` would wait forever)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type: `seconds`, and more than 0 (a budget of nothing measures nothing)."""
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text!r}")
    return value


def count(text: str) -> int:
    """argparse type: an integer >= 1 (a parallel size, a number of things); the error names
    the flag, where the library's own check would name its argument."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value

