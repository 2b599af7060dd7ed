"""Checks of scalar arguments shared by the library's entry points (numpy/stdlib only)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["positive_int"]


def positive_int(value: Any, name: str) -> int:
    """``value`` as an int >= 1; numpy integers too. ValueError naming ``name`` for 0, -1,
    2.5, "4" and True (which int() would take as 2, 4 and 1)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)
