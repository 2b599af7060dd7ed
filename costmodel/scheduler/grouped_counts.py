"""How many micro-batches per rank for whole groups (a prompt's responses on one rank).

`place_grouped` places whole groups for a given ``m`` (`groups.place_groups`), which can
fail either way (a rank short of samples asks for fewer, one whose samples do not pack for
more), so the count is bisected; when the first guess works, fewer are tried as
`counts.pack_and_assign` tries them for single samples, kept if the step is no slower.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from costmodel.scheduler.bounds import round_up
from costmodel.scheduler.counts import fewer_if_no_worse, fewest_that_packs, next_m
from costmodel.scheduler.groups import place_groups
from costmodel.scheduler.pack import search_pack

__all__ = ["Grouped", "heavy_groups_apart", "place_grouped"]

# Grouped placements of a cost without a fixed part take fewer micro-batches where their
# makespan before the group search is within this of the mean (see `_fewer_placed`).
_FEWER_SLACK = 0.01
# Counts tried again tightly: enough to walk down from a count one sample short to the
# fewest that fit in the tight cases found (m of 2-6), few enough to bound the time.
_LAST_TRIES = 8
# Samples the tight retries may pack in all: a few dozen packings of ranks of thousands of
# samples, so that an input no heuristic places is refused in well under a second.
_REPAIR_SAMPLES = 1 << 17


@dataclass(frozen=True)
class Grouped:
    """Grouped samples and the constraints every placement try shares."""

    lens: np.ndarray
    q: np.ndarray
    groups: np.ndarray
    dp: int
    align: int
    cap: int
    short: int
    # What `place_groups` spread for the counts tried so far, reused where it holds for
    # another: shared by the copies `dataclasses.replace` makes with another ``short``
    # (each spread says for which token budgets it holds).
    spreads: list = dataclasses.field(default_factory=list, compare=False, repr=False)

    def place(
        self, m: int, tight: int = 0, by_count: bool = False
    ) -> np.ndarray | str:
        return place_groups(self.lens, self.q, self.groups, self.dp, m, self.cap, self.short,
                            tight=tight, by_count=by_count, spreads=self.spreads)


def place_grouped(
    g: Grouped, m_range: tuple[int, int, int], bin_costs, exact: bool = False
) -> tuple[np.ndarray, int]:
    """Place whole groups for the fewest micro-batches per rank that work.

    ``m_range``: (lowest possible, where to start, highest possible). A failure says which
    way to go: a rank with too few samples for ``m`` micro-batches asks for fewer, a rank
    whose samples do not pack asks for more. Each try narrows the range, so the search ends.
    When the first try places, fewer are tried as in `pack_and_assign`, kept while the
    makespan of ``bin_costs(bins, k)`` (`bin_costs_of`) is no higher (`_fewer_placed`).
    ``exact``: the lowest is a count the caller asked for (ranks agreeing on one): it is
    tried first, with the tight packer too, so a count a schedule came out with is found
    again when asked for.
    """
    lo, m, hi = m_range
    if exact:
        # By cost, then, where the samples do not pack, by tokens (what packing needs): a
        # count nearly full (592 tokens in 4 micro-batches of 149) packs from some spreads
        # and not from others.
        by_tokens = dataclasses.replace(g, q=g.lens.astype(np.int64), spreads=[])
        for placing in (g, by_tokens):
            placed = placing.place(lo)
            if isinstance(placed, str) and placed == "tokens":
                placed = placing.place(lo, tight=_REPAIR_SAMPLES)
            if not isinstance(placed, str):
                return placed, lo
    dp, align, cap = g.dp, g.align, g.cap
    # Whole groups balance less finely than samples, and balancing cost moves tokens
    # around: leave each rank room for 1% more tokens plus half a group.
    n_groups = int(g.groups.max()) + 1
    tokens = int(np.minimum(g.lens, cap).sum())
    need = tokens * 1.01 + dp * tokens / (2 * n_groups)
    m = max(m, min(round_up(math.ceil(need / (dp * (cap - g.short + 1))), align), hi))
    failed: list[tuple[int, str]] = []  # (m, why) of every try so far
    shrunk = False
    roomier = dataclasses.replace(g, short=max(g.short, _median_fitting(g.lens, cap)))

    def place(k: int) -> np.ndarray | str:
        placed = g.place(k)
        if (isinstance(placed, str) and placed == "tokens" and roomier.short > g.short
                and len(failed) >= _ROOMIER_AFTER):
            # Ranks filled to the brim (the greedy gives the least loaded ranks all the
            # token room they have) may pack with room for a median sample left in each
            # micro-batch, the rest going to the other ranks: 5 of 8 ranks each holding a
            # sample far over a share filled the other 3 so at every count, and the count
            # grew 2.7x (80 tries, 6 s). Not at once: where the next count places, the
            # full room balances better (up to 19% in random batches with heavy groups).
            placed = roomier.place(k)
        return placed

    tokens_failed = 0
    while True:
        placed = place(m)
        if not isinstance(placed, str):
            if not failed:
                return _fewer_placed(g, placed, m, lo, bin_costs)
            # Counts grown past after failures by tokens: bisect back for the fewest that
            # places, kept where no worse (`_grouped_no_worse`).
            fewest, k = fewest_that_packs(lambda c: _or_none(place(c)), lo, m, align, placed)
            if k < m and _grouped_no_worse(dp, bin_costs(fewest, dp * k), k,
                                           bin_costs(placed, dp * m), m):
                return fewest, k
            return placed, m
        failed.append((m, placed))
        if placed == "samples":
            hi, shrunk = m - align, True
        else:
            lo = m + align
        if lo > hi:
            return _place_grouped_tight(g, m_range, failed)
        if placed == "samples" or shrunk:
            m = lo + (hi - lo) // (2 * align) * align  # bisect what is left
        else:
            # Growing one count a try, RL groups with many responses cut at the maximum
            # length (over half the cap each) took 26-36 placements (1.3 s at dp 512);
            # the step doubles after _GROW_AFTER failures and the gap is bisected after.
            tokens_failed += 1
            step = next_m(m, 0, dp, align, cap) - m
            m = min(m + step * 2 ** max(0, tokens_failed - _GROW_AFTER), hi)


def heavy_groups_apart(g: Grouped, m: int, m_max: int) -> tuple[np.ndarray, int] | None:
    """Another start for grouped samples with groups costing a share or more (nothing
    beside them can help): a placement at enough micro-batches per rank that the other
    ranks hold everything else, the heavy ranks little beside their groups; None where no
    group is that heavy, or that count is not above ``m`` (the one placed) or not allowed.

    At the fewest count, the other ranks' token room runs out and the rest spills onto the
    heavy ranks: 5 of 8 ranks each holding a sample of 1M tokens at cap 65,536 carried 126
    full micro-batches beside it (1.22x the lower bound), where 335 micro-batches per rank
    leave them one short sample each (1.015x). The caller searches from both and keeps the
    better.
    """
    dp, cap = g.dp, g.cap
    group_q = np.bincount(g.groups, weights=g.q)
    heavy = group_q * dp >= group_q.sum()
    d = int(heavy.sum())
    if d == 0 or d >= dp:
        return None
    rest_tokens = int(np.minimum(g.lens[~heavy[g.groups]], cap).sum())
    m_apart = round_up(-(-rest_tokens // ((dp - d) * (cap - g.short + 1))), g.align)
    if not m < m_apart <= m_max:
        return None
    placed = g.place(m_apart)
    return None if isinstance(placed, str) else (placed, m_apart)


# Counts that failed before one is also tried with room for a median sample.
_ROOMIER_AFTER = 3
# Counts failed for tokens, one step apart, before the step doubles each failure.
_GROW_AFTER = 3


def _median_fitting(lens: np.ndarray, cap: int) -> int:
    """The median length of the samples within the cap (0 if none)."""
    fitting = lens[lens <= cap]
    # under the cap, as start_m's room: room for a whole cap would leave a budget of m tokens
    return min(int(np.median(fitting)), cap - 1) if fitting.size else 0


def _or_none(placed: np.ndarray | str) -> np.ndarray | None:
    """A placement, or None for the reason one failed."""
    return None if isinstance(placed, str) else placed


def _fewer_placed(g: Grouped, placed: np.ndarray, m: int, m_floor: int, bin_costs):
    """`fewer_if_no_worse` for whole groups: the first count tried placed them. Scored by
    the makespan (`_grouped_no_worse`)."""

    def place(k: int) -> np.ndarray | None:
        return _or_none(g.place(k))

    def costs(bins: np.ndarray, k: int) -> np.ndarray:
        return bin_costs(bins, g.dp * k)

    def no_worse(fewer_q: np.ndarray, k: int, q_now: np.ndarray, m_now: int) -> bool:
        return _grouped_no_worse(g.dp, fewer_q, k, q_now, m_now)

    bins, _, m = fewer_if_no_worse(place, costs, (placed, costs(placed, m), m), m_floor,
                                     g.align, no_worse)
    return bins, m


def _grouped_no_worse(dp: int, fewer_q: np.ndarray, k: int, q_now: np.ndarray, m_now: int) -> bool:
    """Whether whole groups placed at ``k`` micro-batches per rank (costs ``fewer_q``, ids
    rank * k + slot) are no worse than at ``m_now`` (``q_now``): placed groups are final
    (no local search moves single samples), and fewer micro-batches per rank leave whole
    groups less room to balance, so a lower total can still be a slower step."""
    fewer = int(fewer_q.reshape(dp, k).sum(axis=1).max())
    if fewer <= int(q_now.reshape(dp, m_now).sum(axis=1).max()):
        return True
    # A cost without a fixed part (tokens, FLOPs) totals the same at every count, so
    # its makespans differ only by how finely whole groups balance; fewer micro-batches
    # within 1% of the mean are taken then (each costs a GPU a fixed time that such a
    # cost does not see; the group search closes most of that 1%). Pairs of RL samples
    # at cap 4,096 kept 29-34% more micro-batches than placed, for placements 0.2-0.9%
    # more even; with the fewest, the group search ended within 0.013% of the bound.
    # (Taking the fewest on every tie cost 2% once: 52 -> 50 per rank, groups of 8.)
    total = int(q_now.sum())
    return int(fewer_q.sum()) == total and fewer * dp <= total * (1 + _FEWER_SLACK)


def _place_grouped_tight(
    g: Grouped, m_range: tuple[int, int, int], failed: list[tuple[int, str]]
) -> tuple[np.ndarray, int]:
    """The last resort of `place_grouped`, or the ValueError that says what to change.

    Placement is a heuristic: a failure at one m does not prove the others fail (a rank one
    sample short at m + 1 may pack at m; a rank that did not pack may after a swap of
    groups). So every count below the fewest that left a rank short of samples is tried
    again, most room first, with the tight packer and group swaps, under one budget for
    all; then, under a second budget, those counts and that fewest one again, placing
    groups by count alone where the token budget left a rank short. Rarely reached: tight
    inputs only (a few samples per micro-batch).
    """
    short_at = min([x for x, why in failed if why == "samples"], default=m_range[2] + 1)
    retried = list(range(m_range[0], short_at, g.align))[::-1][:_LAST_TRIES]
    by_count = ([short_at] if short_at <= m_range[2] else []) + retried[: _LAST_TRIES - 1]
    # Each pass its own budget: the first one's is what it had before the second came in.
    for counts, count_only in ((retried, False), (by_count, True)):
        for m in counts:
            placed = g.place(m, tight=_REPAIR_SAMPLES // len(counts), by_count=count_only)
            if not isinstance(placed, str):
                return placed, m
    # A handful of samples: an exact search (bounded), the fewest counts first. Group by
    # group, most tokens first, a group's samples together and longest first: where a
    # group's first sample goes decides the rank of the rest, so dead ends show early.
    group_tokens = np.bincount(g.groups, weights=np.minimum(g.lens, g.cap))[g.groups]
    order = np.lexsort((np.arange(g.lens.size), -g.lens, g.groups, -group_tokens))
    fitting = [m for m in range(m_range[0], m_range[2] + 1, g.align) if g.dp * m <= g.lens.size]
    for m in fitting[:_LAST_TRIES]:
        bins = search_pack(g.lens, g.dp * m, g.cap, order, g.groups, m)
        if bins is not None:
            return bins, m
    again = f", then {retried} with a tighter packer and swaps of groups" if retried else ""
    raise ValueError(
        f"could not pack {g.lens.size} samples in {int(g.groups.max()) + 1} groups into {g.dp} "
        f"ranks × m micro-batches of at most {g.cap} tokens (tried m = {[x for x, _ in failed]}"
        f"{again}); a group stays on one rank and every rank needs m samples: raise "
        f"max_tokens_per_microbatch, lower dp_size or align, or use smaller groups"
    )
