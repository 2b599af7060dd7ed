"""Which points of a calibration sweep to measure again.

A point's repeats run back to back, so its spread says nothing of what changes from one
point to the next (clocks, power, other work on the GPU). In the H200 sweep behind the
shipped profile (eager timing, 5 repeats a point), neighbouring token counts of the
training linear curve differ by up to 11% the wrong way (10,752 tokens: 25.5 ms; 11,008:
22.6 ms; spreads ~5%), and 88 of its 197 points lie more than 1% off the monotone fit.
Isotonic regression pools such a pair into a flat run and a jump: a step the GPU need not
have, and the scheduler fills micro-batches to the end of such a run, where the cost per
token looks lowest. Measured twice more, at other moments, such a point's median of three
is wrong only where two of its three measurements are; a real step (a new GEMM wave)
measures the same again, and is kept. The whole-layer probes are measured again too (see
`points_to_retake`), and the measurements not chosen for being off say how far one
measurement scatters between runs (`scatter_between_measurements`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from costmodel.calibration.fit import Record, token_knots
from costmodel.calibration.plan import SweepPoint

__all__ = ["RETAKE_OFF", "RETAKE_SHARE", "points_to_retake", "scatter_between_measurements"]

RETAKE_OFF = 0.01
"""A token-curve point this far from its curve's monotone fit is measured again. The fit
pools a slow point with the points after it that it rose above, so its own miss is a share
of how slow it was: on a 256-token grid at 10k tokens, a point measured 6% slow is 1.7% off
the fit that pooled it with the next one (and the fit 4.25% above the truth there); 4% slow
is 0.7% off, not seen, and moves the fit by less (3.25%)."""
RETAKE_SHARE = 0.4
"""Measuring again takes at most this share of the sweep's own time, and ends by the
sweep's deadline: in the H200 sweep, 197 points lie off by more than 1%, and a round of
them and the 16 probes would take about 16 s (each point's time x 7 calls, plus 0.02 s a
point) after the sweep's 61 s: the first round and the second's first points."""


def points_to_retake(points: Sequence[SweepPoint], records: Sequence[Record]) -> list[int]:
    """The indices of ``points`` (measured as ``records``, in order, one each) to measure
    again: every whole-layer probe, then the token-curve points whose time lies more than
    RETAKE_OFF from their curve's monotone fit, farthest first.

    The probes give the fixed cost per layer as a small difference of large times, so the
    noise between runs is all of it: in the H200 sweep the eight training probes put it at
    0.35-2.03 ms (fitted: 1.06 ms, the weighted mean), and a micro-batch's fixed cost decides
    how many the scheduler packs. They are few, and first.

    A curve's last point is also judged against the line through the fit at the two before
    it: no later point shows a slow last point as a fall, which is all the fit sees."""
    probes: list[int] = []
    curves: dict[tuple[str, str, bool], list[int]] = defaultdict(list)
    for i, (point, _) in enumerate(zip(points, records)):  # the points measured
        if point.kind == "layer":
            probes.append(i)
        elif point.kind in ("linear", "head"):
            curves[(point.mode, point.kind, point.moe)].append(i)
    off: dict[int, float] = {}
    for at in curves.values():
        if len({points[i].tokens for i in at}) < 2:
            continue
        tokens, measured, fitted = token_knots([records[i] for i in at], "retake", warn=False)
        miss = np.abs(measured / fitted - 1.0)
        if tokens.size >= 3:
            slope = (fitted[-2] - fitted[-3]) / (tokens[-2] - tokens[-3])
            line = fitted[-2] + slope * (tokens[-1] - tokens[-2])
            miss[-1] = max(miss[-1], measured[-1] / line - 1.0)
        by_tokens = dict(zip(tokens.astype(np.int64).tolist(), miss.tolist()))
        off.update((i, by_tokens[points[i].tokens]) for i in at
                   if by_tokens[points[i].tokens] > RETAKE_OFF)
    return probes + sorted(off, key=lambda i: (-off[i], i))


def scatter_between_measurements(unchosen: Sequence[Sequence[float]]) -> dict[str, float | int]:
    """How far two measurements of one point land apart: from the first two of each point's
    times that were not chosen for being off (ms: every retake, and a probe's first
    measurement, since all probes are measured again), the relative scatter σ of one
    measurement, a lognormal's: log(a / b) of two is N(0, 2σ²). A token point's first
    measurement is left out: chosen for being off, it would bias the estimate up. This is
    the noise that repeats within one measurement cannot show, and that the fine structure
    of a curve (its steps, the scheduler's cheapest fill) has to stand out of. {} where no
    point has two (the probes' pairs come first, in a round the time limit may cut)."""
    logs = [math.log(ms[0] / ms[1]) for ms in unchosen if len(ms) >= 2]
    if not logs:
        return {}
    return {"scatter": round(math.sqrt(sum(x * x for x in logs) / (2 * len(logs))), 5),
            "scatter_pairs": len(logs)}
