"""Bounds for `build_schedule`: how many micro-batches per rank the cap needs (and allows),
and `lower_bound`, the makespan no schedule can beat (reported next to each schedule)."""

from __future__ import annotations

import math

import numpy as np

from costmodel import portable
from costmodel.scheduler.costs import Cost
from costmodel.scheduler.sorting import longest_first, run_starts

__all__ = [
    "cheapest_fill",
    "cheapest_fill_below",
    "cost_per_token",
    "lower_bound",
    "microbatch_range",
    "min_microbatches",
    "min_microbatches_per_group",
    "round_up",
]


def min_microbatches(lengths: np.ndarray, cap: int) -> int:
    """A lower bound on the micro-batches needed for these samples under the cap."""
    return int(min_microbatches_per_group(lengths, np.zeros(lengths.size, dtype=np.int64), cap)[0])


def min_microbatches_per_group(lengths: np.ndarray, groups: np.ndarray, cap: int) -> np.ndarray:
    """For each group (dense ids), a lower bound on the micro-batches its samples need under
    the cap: one per sample over the cap, plus the most of the others' tokens over the cap,
    their samples over half the cap (one per micro-batch) and those over a third (two)."""
    k = int(groups.max()) + 1
    over = lengths > cap
    fits = np.where(over, 0, lengths)  # an oversized sample's tokens are its own micro-batch

    def per_group(weights: np.ndarray) -> np.ndarray:
        return np.bincount(groups, weights=weights, minlength=k).astype(np.int64)

    return per_group(over) + np.maximum.reduce([
        -(-per_group(fits) // cap),
        per_group(fits > cap // 2),
        -(-per_group(3 * fits > cap) // 2),
    ])


def microbatch_range(
    lens: np.ndarray, cap: int, dp: int, align: int, min_m: int, groups: np.ndarray | None
) -> tuple[int, int]:
    """(fewest, most) micro-batches per rank: at least what the cap needs (and each group
    on its rank), at most one sample each; ValueError saying what to change if none fit."""
    n = lens.size
    m_max = (n // dp) // align * align
    m_cap = round_up(-(-min_microbatches(lens, cap) // dp), align)
    m_lb = max(m_cap, round_up(min_m, align))
    if m_lb > m_max:
        if m_lb > m_cap:
            why = f"min_num_microbatches={min_m} asks for {m_lb}"
            fix = "lower min_num_microbatches, dp_size or align"
        else:
            why = f"the cap of {cap} tokens needs at least {m_lb}"
            fix = "raise max_tokens_per_microbatch, or lower dp_size or align"
        raise ValueError(
            f"cannot make {dp} ranks × m non-empty micro-batches from {n} samples: {why} "
            f"micro-batches per rank (a multiple of align={align}), but {n} samples fill at "
            f"most {m_max}; {fix}"
        )
    if groups is not None:
        m_lb = max(m_lb, _group_min_m(lens, groups, cap, align, m_max))
    return m_lb, m_max


def _group_min_m(lens: np.ndarray, groups: np.ndarray, cap: int, align: int, m_max: int) -> int:
    """The fewest micro-batches per rank the largest group allows (`min_microbatches` per group:
    a group shares one rank, so that rank needs at least that many); ValueError when some
    group alone needs more than any rank can run."""
    need = min_microbatches_per_group(lens, groups, cap)
    g = int(np.argmax(need))
    m = round_up(int(need[g]), align)
    if m > m_max:
        members = np.flatnonzero(groups == g)
        raise ValueError(
            f"the group of sample {int(members[0])} ({members.size} samples, "
            f"{int(lens[members].sum())} tokens) needs at least {int(need[g])} micro-batches of "
            f"at most {cap} tokens on its rank, but every rank must run the same number and "
            f"{lens.size} samples over the ranks allow at most {m_max}: raise "
            f"max_tokens_per_microbatch, lower dp_size or align, or split the group"
        )
    return m


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def lower_bound(
    cost: Cost,
    lengths: np.ndarray,
    cap: int,
    dp: int,
    *,
    order: np.ndarray | None = None,
    sample_costs: np.ndarray | None = None,
) -> float:
    """max(Σ cost of micro-batches filled to the cap / dp, costliest single sample).

    For a separable cost (a calibrated model) a true bound instead
    (`_separable_lower_bound`): its token curve need not be cheapest per token at the cap.
    "Filled to the cap": samples, longest first, laid end to end and cut every ``cap``
    tokens (a sample belongs to the micro-batch where it starts; longer than the cap, it is
    alone). That is the fewest micro-batches the tokens allow, each as full as it can be:
    what a schedule pays if splitting to balance wasted nothing. ``order`` (longest first)
    and, for an additive cost, ``sample_costs`` save recomputing them.

    True for token, FLOPs and other additive costs and for calibrated models. For a plain
    callable it is a reference, not a bound: a callable that charges less for more,
    emptier micro-batches (``lambda L: 1 + len(L) ** 2``, or convex in the tokens) can be
    beaten by a legal schedule (74 against 106 for ten 1-token and two 5-token samples at
    cap 10 under the first; 8 of the 1,200 digest schedules, all under the script's
    callable, end up to 1.5e-6 below it).
    """
    n = lengths.size
    if n == 0:
        return 0.0
    over = lengths > cap
    n_over = int(over.sum())
    fewest_bins = n_over + -(-int(lengths[~over].sum()) // cap)  # the cap's own bound
    if cost.separable:
        desc = lengths[order if order is not None else longest_first(lengths)]
        return _separable_lower_bound(cost, desc, cap, dp, fewest_bins)
    if cost.additive:
        s = cost.sample_costs(lengths) if sample_costs is None else sample_costs
        fixed = cost.fixed_cost()
        total = math.fsum(s.tolist()) + fixed * fewest_bins
        return max(total / dp, fixed + float(s.max()))
    if order is None:
        order = longest_first(lengths)
    lo = lengths[order]
    fits = lo[n_over:]  # longest first: the oversized ones lead
    starts = np.cumsum(fits) - fits
    bins = np.concatenate([np.arange(n_over), n_over + starts // cap])
    offsets = np.concatenate([[0], np.cumsum(np.bincount(bins))]).astype(np.int64)
    total = math.fsum(cost.evaluate(lo, offsets).tolist())
    return max(total / dp, _costliest_alone(cost, lo))


# The separable bound evaluates the token curve at every fill up to this many tokens, and
# past it on cells of a geometric grid this fine (a bound within about 1/4096 of exact,
# a little more where cell edges round down to whole tokens; ~40k evaluations up to the
# largest cap).
_EXACT_FILLS = 1 << 17
_CELL_RATIO = 1.0 + 2.0**-12


def _costliest_alone(cost: Cost, desc: np.ndarray) -> float:
    """The cost of the costliest sample alone in a micro-batch (``desc``: longest first)."""
    uniq = desc[run_starts(desc)]
    return float(cost.evaluate(uniq, np.arange(uniq.size + 1, dtype=np.int64)).max())


def _separable_lower_bound(
    cost: Cost, desc: np.ndarray, cap: int, dp: int, n_bins: int
) -> float:
    """A true lower bound for a separable cost (fixed + Σ sequence costs + token curve);
    ``desc``: the lengths, longest first; ``n_bins``: the fewest micro-batches the cap
    allows.

    Every schedule pays the sequences' own costs, and each over-cap sample's fixed and
    token cost alone. The micro-batches of the other tokens cost, each, its fixed cost plus
    the token curve at its fill, so together at least the larger of
    - the fewest such micro-batches' fixed costs, plus every token at the cheapest token
      cost per token the curve offers at any fill up to the cap (a calibrated GPU curve has
      steps: on an H200 it can be cheapest per token well below the cap, so the cap-filled
      reference is not a bound there);
    - every token at the cheapest (fixed cost + token curve) per token at any fill: each
      micro-batch's fixed cost spread over its own tokens. Under the shipped H200 profile
      this one is 1-2.5% higher (the first
      charges each token the curve's cheapest rate, at a fill the fewest micro-batches do
      not have, and no fixed cost beyond theirs).
    Reported, and used only to stop trying starting layouts early (`build_schedule`), so
    plain numpy sums. Like the costliest sample alone, a true bound for a token curve that
    does not fall as tokens grow (calibrated curves are checked monotone; a hand-made model
    whose curve falls can be beaten: alone, a sample may cost more than beside another).
    """
    over = desc > cap
    fits = int(desc[~over].sum())
    fixed = cost.fixed_cost()
    total = int(over.sum()) * fixed + float(cost.sequence_costs(desc).sum())
    if over.any():
        total += float(cost.token_costs(desc[over].astype(np.float64)).sum())
    if fits:
        per_token, with_fixed = _cheapest_per_token(cost, min(cap, fits), fixed)
        total += max((n_bins - int(over.sum())) * fixed + fits * per_token, fits * with_fixed)
    return max(total / dp, _costliest_alone(cost, desc))


def _cheapest_per_token(cost: Cost, top: int, fixed: float = 0.0) -> tuple[float, float]:
    """Lower bounds on token_costs(T) / T and on (fixed + token_costs(T)) / T over whole T
    in 1..top (`_fill_rates`)."""
    _, per_token, with_fixed = _fill_rates(cost, top, fixed)
    return float(per_token.min()), float(with_fixed.min())


def cheapest_fill(cost: Cost, top: int) -> tuple[int, float]:
    """The fill T in 1..top whose micro-batch costs least per token, fixed cost included:
    (T, (fixed + token_costs(T)) / T) of a separable cost (past _EXACT_FILLS, of the geometric
    cell starting at T, a lower bound: `_fill_rates`). The cap where the curve has no steps;
    below it where a fill under the cap is cheaper per token (GEMM waves)."""
    fills, _, with_fixed = _fill_rates(cost, top, cost.fixed_cost())
    best = with_fixed.size - 1 - int(np.argmin(with_fixed[::-1]))  # of equals, the fullest
    return int(fills[best]), float(with_fixed[best])


def cheapest_fill_below(cost: Cost, cap: int) -> tuple[int, float]:
    """`cheapest_fill` under ``cap``, and how much cheaper per token than a full micro-batch
    of ``cap`` tokens it is (a fraction, <= 0): where the scheduler may fill micro-batches
    (`schedule._cheapest_fill_count`), for `report` and a GPU session's summary."""
    fill, rate = cheapest_fill(cost, cap)
    return fill, rate / float(cost_per_token(cost, np.array([cap]))[0]) - 1.0


def cost_per_token(cost: Cost, fills: np.ndarray) -> np.ndarray:
    """A separable cost's micro-batch per token at each fill, fixed cost included (its
    sequences' own costs aside): (fixed + token_costs(T)) / T."""
    fills = np.asarray(fills, dtype=np.float64)
    return (cost.fixed_cost() + cost.token_costs(fills)) / fills


def _fill_rates(cost: Cost, top: int, fixed: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fills, token_costs per token, (fixed + token_costs) per token) over whole fills
    1..top: exact up to _EXACT_FILLS; above, token_costs does not fall as T grows (curves are
    checked monotone), so on each cell [a, b] of a fine grid the time per token is at least
    token_costs(a) / b (and (fixed + token_costs(a)) / b), given at a."""
    fills = np.arange(1, min(top, _EXACT_FILLS) + 1, dtype=np.float64)
    ends = fills
    if top > _EXACT_FILLS:
        cells = math.ceil(math.log(top / _EXACT_FILLS) / math.log(_CELL_RATIO))
        edges = np.unique(np.floor(portable.geomspace(_EXACT_FILLS, top, cells + 1)))
        edges[-1] = top  # geomspace's last point can round below it
        fills = np.concatenate([fills, edges[:-1]])
        ends = np.concatenate([ends, edges[1:]])
    costs = cost.token_costs(fills)
    return fills, costs / ends, (fixed + costs) / ends
