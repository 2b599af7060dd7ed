"""exp, log, power and geomspace whose bits do not depend on numpy's CPU dispatch.

Every rank builds its schedule on its own, so every rank must price every sample the same,
to the last bit: a cost one unit apart after quantisation can flip a choice of the search,
and then ranks run different micro-batches (samples dropped or run twice). numpy picks its
exp, log and power kernels when it is imported, by the CPU's features (AVX-512, AVX2 or
the baseline): on the AMD EPYC dev machine (numpy 2.4.6), its AVX-512 and baseline kernels
disagree in the last bit on 4.7% of np.exp and 5.2% of np.power results, and on 1,418 of
the 131,072 attention-table entries of ``h200/qwen3-8b`` (5,638 of the H100 estimate's,
which also differed after the scheduler's rounding). Ranks on nodes of two CPU
generations in one job (AVX-512 and not) would price samples apart.

Python's ``math`` calls the C library's scalar functions, which numpy's dispatch does not
touch: the same bits wherever the same C library build runs on CPUs alike in FMA support
(glibc picks FMA builds of them where the CPU has FMA, as every x86-64 server CPU since
2013 does; ranks of one job share a container image). ~0.1 µs a value: used where curves
are built and tabulated, once per cost model, not in the scheduler's loops.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["exp", "geomspace", "log", "power"]


def _each(fn, values: ArrayLike) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    return np.fromiter(map(fn, x.ravel().tolist()), dtype=np.float64, count=x.size).reshape(x.shape)


def exp(values: ArrayLike) -> np.ndarray:
    """e ** x of each value."""
    return _each(math.exp, values)


def log(values: ArrayLike) -> np.ndarray:
    """Natural log of each (positive) value."""
    return _each(math.log, values)


def power(base: ArrayLike, exponent: float) -> np.ndarray:
    """Each (non-negative) base to one real exponent."""
    p = float(exponent)
    return _each(lambda b: math.pow(b, p), base)


def geomspace(start: float, stop: float, num: int) -> np.ndarray:
    """``num`` points from ``start`` to ``stop`` (both exact) at a constant ratio."""
    if num < 2:
        return np.array([float(start)][:num])
    lo, hi = math.log(start), math.log(stop)
    step = (hi - lo) / (num - 1)
    out = exp(lo + step * np.arange(num, dtype=np.float64))
    out[0], out[-1] = start, stop
    return out
