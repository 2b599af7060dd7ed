"""How many micro-batches per rank: the search for the fewest that pack, samples placed
one by one (`pack_and_assign`; whole groups: `grouped_counts.place_grouped`).

Pack every sample by tokens into ``dp × m`` level micro-batches, growing ``m`` until that
works (and trying fewer when the first guess packed at once, kept if they cost less:
`fewer_if_no_worse`), then give each rank ``m`` of them. `build_schedule` chooses between
this and the grouped placement.
"""

from __future__ import annotations

import functools

import numpy as np

from costmodel.scheduler.baselines import expand_bins_by_splitting
from costmodel.scheduler.bounds import round_up
from costmodel.scheduler.costs import Cost, additive_bin_costs, quantise
from costmodel.scheduler.heavy import heavy_apart
from costmodel.scheduler.pack import (
    BestFit,
    assign_bins,
    best_fit_decreasing,
    pack_tokens,
    rank_makespan,
    spread_best_fit,
    tight_pack,
)
from costmodel.scheduler.sorting import members_of

__all__ = ["bin_costs_of", "fewer_if_no_worse", "fewest_that_packs", "level_layout", "next_m",
           "pack_and_assign", "start_m"]


def start_m(
    desc: np.ndarray, dp: int, cap: int, m_lb: int, m_max: int, align: int
) -> tuple[int, int]:
    """Where to start looking for the fewest micro-batches per rank that pack.

    The packer levels the micro-batches' fills, and its last rounds place the shortest
    samples; they fit only if a level fill leaves about that much room. So ask for room
    for a short sample (the length an eighth of the way up from the shortest micro-batch
    count's worth of samples), then let failures raise ``m`` from there. ``desc``: the
    lengths, longest first. Returns ``(m, that room in tokens)``.
    """
    n = desc.size
    n_over = int((desc > cap).sum())
    tokens = int(desc[n_over:].sum())
    m = m_lb
    short = 0
    for _ in range(3):
        k_open = dp * m - n_over
        short = int(desc[min(n - 1, n - max(1, k_open // 8))])
        if short >= cap:
            break
        # Fills are whole tokens: a level fill averaging under cap − short + 1 leaves the
        # emptiest micro-batch at most cap − short full, room for `short`. ("cap − short"
        # alone asked for twice the micro-batches needed with cap 2 and 1-token samples.)
        need = -(-(-(-tokens // (cap - short + 1)) + n_over) // dp)
        m = max(m_lb, min(round_up(need, align), m_max))
    return m, min(short, cap - 1)


def next_m(m: int, left_tokens: int, dp: int, align: int, cap: int) -> int:
    # Enough extra micro-batches for what did not fit, and at least 1% more, so a tight
    # fill converges in a few tries.
    extra_bins = -(-left_tokens // cap) + 1
    grow = max(-(-extra_bins // dp), -(-m // 100), 1)
    return m + round_up(grow, align)


_FEWER_MAX_M = 64
# Past _FEWER_MAX_M per rank, packing by tokens bisects for the fewest count where the one
# that packed is at least 1/_BISECT_FROM above the floor (it was 1/4: 16,384 samples of
# 1-4,096 tokens at cap 4,096, dp 8, under the H200 profile kept 1,094 per rank, 6% over
# the 1,030 that pack, and a step 3.3% slower). Grouped placements keep 1/4: each try
# places every group again, and fewer left whole groups less room (in 150 random grouped
# batches with samples over the cap: 20 better, 15 worse by up to 0.8%, 70% more time).
_BISECT_FROM = 100
# A bisection tries the floor first where the count that packed is 1/_FLOOR_FIRST_FROM or
# more above it (see `fewer_if_no_worse`).
_FLOOR_FIRST_FROM = 4
# Samples up to which the one-rank search for fewer micro-batches also tries best fit: one
# pass, a Python loop over samples (RL lengths, caps 8-32k, on the 2-core dev machine:
# 2 ms at 4,096 samples, 9-10 ms at 16,384; 45-50 ms at 65,536, more than the rest of the
# schedule, for 1-3% fewer micro-batches).
_TIGHT_FEWER_MAX = 16384
# Best fit's own count is also tried up to this many samples (one rank under a cost model:
# priced; several ranks: a second start where levelling failed). At 16,384 one rank's
# took verl's per-rank call from 15-18 to 30-45 ms and changed no schedule of
# bench_one_rank's (rl, bimodal, at-limit).
_BEST_FIT_COUNT_MAX = 4096
# Samples up to which best fit's full micro-batches split to the count are a start
# (`_filled_then_split_start`). Its search runs only where the start costs less in all than
# the level one, so the time goes where it gains: under the H200 profile, 48 batches of
# 8,192-16,384 RL samples (dp 32-64, align 1 and 4, caps 16-32k, train and forward) with
# 16,384 against 4,096: 14 shorter by 0.1-2.15%, none longer, those 14 taking 20-54 ms
# instead of 5-13; the others 1.07x (median). Not past best fit's own limit (above). One
# rank keeps _BEST_FIT_COUNT_MAX: there, at 8,192-16,384 samples (verl's per-rank call,
# rl and bimodal, train and forward), it took 10-17 ms to 22-44 ms in 6 of 8 batches for at
# most 0.06% less.
_SPLIT_START_MAX = _TIGHT_FEWER_MAX
# Samples up to which the split start is built without asking `_full_fills_may_cost_less`
# (microseconds of best fit): in a review's fuzzing the gate turned it down where it won in
# 75 batches of under 64 samples (by up to 2.5%), 35 of 64-255 (0.84%), 82 of 256-1,023.
_UNGATED_SAMPLES = 64
# A best-fit start more than this above the level start (assigned, before any search) is
# not searched: in the 1,200 digests none that gained started further above.
_BEST_FIT_START_SLACK = 1.02
# Samples per rank up to which fewer micro-batches that tie (a cost without a fixed part)
# are a start for the search too: 80 random batches of 2-8 a rank (dp 8-64, tokens and
# FLOPs), 11 better by up to 17.5%, none worse; at 12-16 a rank 2 by <= 0.11%, at 24-32
# none, while without a limit 32 batches of 256-16,384 samples took 7-20% more time.
_TIE_START_PER_RANK = 8


def bin_costs_of(lens: np.ndarray, q: np.ndarray, cost: Cost, scale: float):
    """``costs(bins, k)``: the quantised costs of ``k`` micro-batches, sample i in bins[i]
    (``q``: the samples' quantised costs, for an additive cost)."""

    def costs(bins: np.ndarray, k: int) -> np.ndarray:
        if cost.additive:
            return additive_bin_costs(cost, q, bins, k, scale)
        order, offsets = members_of(bins, k)
        return quantise(cost.evaluate(lens[order], offsets), scale, cost.name)

    return costs


def pack_and_assign(
    lens: np.ndarray,
    by_length: np.ndarray,
    q: np.ndarray,
    cost: Cost,
    scale: float,
    *,
    dp: int,
    m_range: tuple[int, int, int],
    align: int,
    cap: int,
    exact: bool = False,
) -> tuple[list[tuple[np.ndarray, int, np.ndarray]], list[tuple[np.ndarray, int, np.ndarray]],
           list[tuple[np.ndarray, int, np.ndarray]]]:
    """Pack by tokens into dp × m micro-batches (fewest m that works), then give each
    rank m of them balancing their true costs. Returns layouts (bin_of, m, bin costs),
    micro-batch ids ``rank * m + slot``, for the local search to start from: this one, and
    where samples over the cap outweigh a micro-batch, `heavy_apart`'s before; and extra
    layouts at fewer micro-batches that levelling missed (best fit's, a tie's); and, under a
    cost that prices fill, the split start (`_filled_then_split_start`), apart: the caller
    checks that it never leaves the schedule above what the others reach.
    ``q``: the samples' quantised costs, ``scale`` the quantisation's (bin costs of a
    non-additive ``cost`` are quantised the same way).

    ``m_range``: (lowest possible, where to start, highest possible), as `place_grouped`.
    The search starts at a guess that leaves room for a level fill and grows on failure.
    When the guess packs at once, fewer micro-batches are tried (`fewer_if_no_worse`),
    kept while their total cost is lower: a micro-batch saved is a fixed cost saved, but
    fuller micro-batches can cost more per token (a measured H200 profile of Qwen3-8B has
    both), so the cost decides, not the count. ``exact``: the start is a count the caller
    asked for; when levelling fails there, best-fit packing is tried at that count too
    before growing.
    """
    m_floor, m_start, m_max = m_range
    bin_costs = bin_costs_of(lens, q, cost, scale)
    m = m_start
    tried: list[int] = []
    while True:
        tried.append(m)
        bins, left = pack_tokens(lens, dp * m, cap, by_length)
        # A tighter packing where no more are allowed or asked for, and at the fewest the
        # tokens allow under a cost with a fixed part: levelling can fail there by a hair
        # (2% of 16,384 samples at cap 2,048 and the rest of 1-63 tokens, dp 64, H200
        # profile: 9 per rank failed, 10 packed, 1.040x the lower bound against 1.005x at
        # 9 with best fit). Without a fixed part, fewer micro-batches save nothing the cost
        # sees, and best fit's uneven fills balanced worse (7% once, in 200 random batches).
        if bins is None and (m >= m_max or (exact and m == m_start) or (
                m == m_floor and lens.size <= _TIGHT_FEWER_MAX and _pays_per_microbatch(cost))):
            bins = tight_pack(lens, dp * m, cap, by_length)
        if bins is not None:
            break
        if m >= m_max:
            raise ValueError(
                f"could not pack {lens.size} samples into {dp} ranks × m micro-batches of at "
                f"most {cap} tokens (tried m = {tried}): raise max_tokens_per_microbatch, or "
                f"lower dp_size or align"
            )
        m = min(next_m(m, left, dp, align, cap), m_max)
    bin_q = bin_costs(bins, dp * m)
    # One rank under a cost that sums per sample (plus a fixed part): a packing costs the
    # same whatever the split and fewer micro-batches never more, so the fewest are taken,
    # as verl, slime and first fit take them (a framework pays a fixed time per
    # micro-batch; a cost model, which sees how fill changes the time, decides itself).
    # They are looked for after growth too, which overshoots (6 failed, 8 packed, 7
    # untried), and with best fit where levelling fails. verl asks rank by rank.
    # One rank under any other cost: its total is its makespan and a count is taken only
    # where it costs less (`no_worse`), so growth's overshoot is looked under too, with best
    # fit where levelling fails (a plain callable or the H200 profile kept 4 where 3 cost
    # 11% or 5% less). Not where the guess packed: there best fit's uneven fills led the
    # steps down elsewhere (2 of 1,200 digest schedules 0.05-0.14% worse, none better).
    one_rank_sum = dp == 1 and cost.additive
    one_rank_grown = dp == 1 and len(tried) > 1
    level_failed = [len(tried) > 1]  # levelling failed at some count below the one taken
    tied: list[int] = []  # fewer per rank that packed at the same total, unevenly

    @functools.cache
    def best_fit() -> BestFit | None:  # once, for every use below
        return best_fit_decreasing(lens, cap, by_length) if lens.size <= _TIGHT_FEWER_MAX else None

    if len(tried) == 1 or one_rank_sum or one_rank_grown:

        def pack_fewer(k: int) -> np.ndarray | None:
            fewer = pack_tokens(lens, dp * k, cap, by_length)[0]
            level_failed.append(fewer is None)
            if (fewer is None and (one_rank_sum or one_rank_grown)
                    and (bf := best_fit()) is not None):
                # best fit, once, spread over each count the bisection tries (the
                # exhaustive search, ~20 ms a count on a few dozen samples, made small
                # batches 20x slower)
                fewer = spread_best_fit(bf, k, lens)
            return fewer

        def no_worse(fewer_q: np.ndarray, k: int, q_now: np.ndarray, m_now: int) -> bool:
            # A lower total, or the same total already balanced perfectly over the ranks.
            # A cost without a fixed part (tokens, FLOPs) ties at every count, and taking
            # the fewest on any tie cost up to 1.45x in makespan (fuller micro-batches leave
            # the rank of a long sample no room to be light); but where the fewer split
            # evenly, no count can do better, and on a GPU each micro-batch costs a fixed
            # time such a cost does not see (equal lengths, which verl asks about rank by
            # rank, got twice the micro-batches they needed).
            fewer_total, total = int(fewer_q.sum()), int(q_now.sum())
            if fewer_total != total:
                return fewer_total < total
            if _assigned_makespan(fewer_q, dp, k) <= -(-total // dp):
                return True
            tied.append(k)  # not taken, but a start for the search (see below)
            return False

        bins, bin_q, m = fewer_if_no_worse(
            pack_fewer, lambda b, k: bin_costs(b, dp * k), (bins, bin_q, m), m_floor, align,
            no_worse, straight_to_fewest=one_rank_sum, bisect_from=_BISECT_FROM)
        if (dp == 1 and not one_rank_sum and lens.size <= _BEST_FIT_COUNT_MAX
                and (bf := best_fit()) is not None):
            # Best fit at its own count and at this one as well, taken where it costs less:
            # exact fills the level steps down miss ({2, 2, 2} and {3, 3} at cap 6: 2
            # micro-batches, not 3; in the 1,200 digest schedules, 30 of one rank under the
            # H200 profile up to 1.05% less), and fills the cost curve prefers to level ones.
            for k in sorted({_best_fit_count(bf, 1, m_floor, align), m}):
                fewer = _spread_and_priced(bf, k, 1, lens, bin_costs) if k <= m else None
                if fewer is not None and int(fewer[1].sum()) < int(bin_q.sum()):
                    bins, bin_q, m = fewer[0], fewer[1], k
    rank_of_bin = assign_bins(bin_q, dp, m)
    layouts = [_by_rank(bins, rank_of_bin, bin_q, m)]
    extra: list[tuple[np.ndarray, int, np.ndarray]] = []  # starts at fewer (see build_schedule)
    # A tie at fewer micro-batches (a cost without a fixed part) is searched from too, with
    # few samples a rank: an uneven split can still be the better schedule ({5} | {2, 2, 2}
    # at cap 6 on two ranks makes 6 with one each, where two each make 7).
    for k in tied[-1:] if lens.size <= _TIE_START_PER_RANK * dp else []:
        if k < m and (fewer := pack_tokens(lens, dp * k, cap, by_length)[0]) is not None:
            fewer_q = bin_costs(fewer, dp * k)
            extra.append(_by_rank(fewer, assign_bins(fewer_q, dp, k), fewer_q, k))
    # Where levelling failed below the count taken, best fit may pack fewer (best fit: 4.5
    # ms at 4,096 samples, plus its search): in the 1,200 digests 40 schedules 0.5-5.1%
    # cheaper, none dearer; over 7,500 fuzzed batches of up to 4,096 samples on several ranks
    # (a review's) 15-26% more time in all, +47 ms at most (3,220 samples, 39 -> 86 ms).
    if (dp > 1 and not exact and m > m_floor and any(level_failed)
            and lens.size <= _BEST_FIT_COUNT_MAX and (bf := best_fit()) is not None):
        level_makespan = rank_makespan(rank_of_bin, bin_q, dp)
        extra += _best_fit_start(bf, lens, dp, (m_floor, m, align), bin_costs,
                                 level_makespan)
    # A cost that prices how full a micro-batch is may prefer full ones and a few split
    # ones to level ones: the baseline's shape, one more start where it costs less in all.
    split: list[tuple[np.ndarray, int, np.ndarray]] = []
    if (not cost.additive and lens.size <= (_SPLIT_START_MAX if dp > 1 else _BEST_FIT_COUNT_MAX)
            and _full_fills_may_cost_less(cost, lens, dp * m, cap)
            and (bf := best_fit()) is not None):
        split = _filled_then_split_start(bf, lens, dp, m, bin_costs, int(bin_q.sum()))
    # Heavy samples' ranks apart, first: usually the better start, and often at the bound
    # (with more micro-batches per rank where it needs them; not past a count asked for).
    apart = heavy_apart(lens, (bins, bin_q), dp, (m, m if exact else m_max, align), cap,
                        bin_costs)
    return [_by_rank(*layout) for layout in apart] + layouts, extra, split


def level_layout(lens: np.ndarray, by_length: np.ndarray, bin_costs, dp: int, m: int,
                 cap: int) -> tuple[np.ndarray, int, np.ndarray] | None:
    """The level packing by tokens at ``m`` micro-batches per rank, assigned to ranks by
    cost, as `pack_and_assign` builds its usual start (bin_of, m, bin costs); None where
    levelling cannot pack that many. ``bin_costs``: `bin_costs_of`'s."""
    bins = pack_tokens(lens, dp * m, cap, by_length)[0]
    if bins is None:
        return None
    bin_q = bin_costs(bins, dp * m)
    return _by_rank(bins, assign_bins(bin_q, dp, m), bin_q, m)


def _best_fit_count(packed: BestFit, dp: int, m_floor: int, align: int) -> int:
    """Micro-batches per rank that best fit's packing ``packed`` needs (at least ``m_floor``,
    a multiple of ``align``)."""
    return max(m_floor, round_up(-(-len(packed.members) // dp), align))


def _spread_and_priced(packed: BestFit, k: int, dp: int, lens: np.ndarray, bin_costs):
    """``packed`` spread over ``dp × k`` micro-batches and their costs, or None where it
    needs more or there are too few samples (`spread_best_fit`)."""
    bins = spread_best_fit(packed, dp * k, lens)
    return None if bins is None else (bins, bin_costs(bins, dp * k))


def _best_fit_start(packed: BestFit, lens: np.ndarray, dp: int, counts: tuple[int, int, int],
                    bin_costs, level_makespan: int) -> list[tuple[np.ndarray, int, np.ndarray]]:
    """Best fit decreasing (``packed``) at its own count ``k`` per rank, where that is below
    ``m``, as one more start for the local search (empty otherwise). Levelling misses exact
    fills ({5} and {2, 2, 2} at cap 6 on two ranks: one micro-batch each, where levelling
    needed two); the search from both starts keeps the better."""
    m_floor, m, align = counts
    k = _best_fit_count(packed, dp, m_floor, align)
    fewer = _spread_and_priced(packed, k, dp, lens, bin_costs) if k < m else None
    if fewer is None:
        return []
    bins, bin_q = fewer
    rank_of_bin = assign_bins(bin_q, dp, k)
    if rank_makespan(rank_of_bin, bin_q, dp) >= level_makespan * _BEST_FIT_START_SLACK:
        return []  # too far behind to be worth a search
    return [_by_rank(bins, rank_of_bin, bin_q, k)]


def _full_fills_may_cost_less(cost: Cost, lens: np.ndarray, k: int, cap: int) -> bool:
    """Whether full micro-batches and split ones may cost less than ``k`` level ones: for a
    separable cost (a cost model), the only part a packing changes is the price of each
    micro-batch's token count, so both shapes are priced as ideal fills (the samples under
    the cap filling ``ceil(tokens / cap)`` micro-batches to the brim, the fullest split in
    two until there are as many as the level ones); other costs are asked by packing.
    Building the start costs a best-fit pass (~5 ms at 4,096 samples), which under the
    H200 profile in training mode, where level fills are the cheaper, bought nothing. Up to
    _UNGATED_SAMPLES it is built anyway: there best fit's fills are far from ideal ones."""
    if not cost.separable or lens.size <= _UNGATED_SAMPLES:
        return True
    under = lens[lens <= cap]
    k_under = k - (lens.size - under.size)  # a sample over the cap has one of its own
    tokens = int(under.sum())
    full = -(-tokens // cap)
    if k_under <= full:
        return False  # no room for a split one: level and full are the same fills
    halvings = (k_under // full).bit_length() - 1  # every full one split this many times
    whole = full << halvings  # then `split` of those split once more
    split = k_under - whole
    fills = np.array([tokens / k_under, tokens / whole, tokens / (2 * whole)])
    level, unsplit, halves = cost.token_costs(fills)
    return (whole - split) * unsplit + 2 * split * halves < k_under * level


def _filled_then_split_start(packed: BestFit, lens: np.ndarray, dp: int, m: int, bin_costs,
                             level_total: int) -> list[tuple[np.ndarray, int, np.ndarray]]:
    """Best fit decreasing's micro-batches (``packed``, filled towards the cap), the fullest
    split in two by tokens until there are ``dp × m``, as one more start for the local
    search where they cost less in all than the level packing (``level_total``); empty
    otherwise. The local search moves samples between ranks, not between one rank's
    micro-batches, so the fills it ends with are mostly the start's. A cost model's token
    curve has steps (GEMM tiles and waves), and the common baseline, which packs this way,
    beat the level start under the H200 profile in 14 of 288 RL batches of 16-128 samples
    a rank (dp 8-64, forward mode, cap 16k; by up to 1.7%: 16k and 8k micro-batches
    against level ones of 14.2k, where that profile's forward curve costs more per token).
    Priced per GPU at context parallelism 8 (4k tokens a GPU, near the curve's knee), this
    start made training schedules 1.2-2.5% shorter (`bench_context_parallel.py`).
    """
    k = dp * m
    if len(packed.members) > k:
        return []
    members = [list(b) for b in packed.members]
    expand_bins_by_splitting(members, k, lens.tolist())  # reaches k: lens.size >= k
    bins = np.empty(lens.size, dtype=np.int64)
    bins[np.concatenate(members)] = np.repeat(np.arange(k), [len(b) for b in members])
    bin_q = bin_costs(bins, k)
    if int(bin_q.sum()) >= level_total:
        return []
    return [_by_rank(bins, assign_bins(bin_q, dp, m), bin_q, m)]


def _assigned_makespan(bin_q: np.ndarray, dp: int, m: int) -> int:
    """The most a rank gets of ``dp × m`` micro-batches of costs ``bin_q`` (`assign_bins`)."""
    return rank_makespan(assign_bins(bin_q, dp, m), bin_q, dp)


def _by_rank(
    bins: np.ndarray, rank_of_bin: np.ndarray, bin_q: np.ndarray, m: int
) -> tuple[np.ndarray, int, np.ndarray]:
    """Micro-batches renumbered rank by rank (id = rank * m + slot): (bin_of, m, costs)."""
    k = rank_of_bin.size
    by_rank = np.lexsort((np.arange(k), rank_of_bin))
    new_id = np.empty(k, dtype=np.int64)
    new_id[by_rank] = np.arange(k, dtype=np.int64)
    renumbered_q = np.empty(k, dtype=np.int64)
    renumbered_q[new_id] = bin_q
    return new_id[bins], m, renumbered_q


def fewest_that_packs(pack, lo: int, hi: int, align: int, found=None):
    """Bisect [lo, hi) for the fewest count ``pack`` takes: ``lo`` untried, ``hi`` packs
    (as ``found``, where known). Returns (its bins or ``found``, that count)."""
    while lo < hi:
        mid = lo + (hi - lo) // (2 * align) * align
        bins = pack(mid)
        if bins is None:
            lo = mid + align
        else:
            hi, found = mid, bins
    return found, hi


def _pays_per_microbatch(cost: Cost) -> bool:
    """Whether every micro-batch costs something of its own (a plain callable, or a
    cost-model object whose ``fixed_cost`` is missing or takes no ``mode``, may)."""
    try:
        return cost.fixed_cost() > 0
    except (NotImplementedError, AttributeError, TypeError):
        return True


def fewer_if_no_worse(pack, costs, packed, m_floor: int, align: int, no_worse,
                       straight_to_fewest: bool = False, bisect_from: int = 4):
    """A count that packed: try fewer micro-batches per rank, kept while
    ``no_worse(fewer costs, fewer m, current costs, current m)``.

    Two steps down, while one micro-batch per rank is worth a pass over every sample (past
    _FEWER_MAX_M per rank, one fewer saves under 1/64 of the fixed costs). If both were
    worth it the trend goes on, so the fewest count that packs is bisected for, down to
    ``m_floor``; also, past _FEWER_MAX_M, when the guess is ``1 / bisect_from`` or more
    above ``m_floor`` (it asks for room a level fill of equal samples never needs: samples
    of half the cap got one per micro-batch), and at once with ``straight_to_fewest`` (the
    caller knows fewer cannot cost more). ``pack(m)``: bins or None; ``costs(bins, m)``;
    ``packed``: (bins, costs, m) at the count that packed.
    """
    bins, bin_q, m = packed

    def take_if_no_worse(k: int, fewer: np.ndarray) -> bool:
        nonlocal bins, bin_q, m
        fewer_q = costs(fewer, k)
        if not no_worse(fewer_q, k, bin_q, m):
            return False
        bins, bin_q, m = fewer, fewer_q, k
        return True

    step = m <= _FEWER_MAX_M and not straight_to_fewest
    for _ in range(2 if step else 0):
        fewer = pack(m - align) if m - align >= m_floor else None
        if fewer is None or not take_if_no_worse(m - align, fewer):
            return bins, bin_q, m
    if not step and not straight_to_fewest and (m - m_floor) * bisect_from < m_floor:
        return bins, bin_q, m
    # Bisect in [m_floor, m): lo is untried, hi packs; `fewest` packs at hi once found.
    # The floor itself first where the guess is far above it: samples that tile the cap
    # (65,536 of exactly half of it, in pairs) pack there, and the bisection took a dozen
    # tries to find it (grouped: 14 placements of every group, 0.55 s).
    lo, hi, fewest = m_floor, m, None
    if (m - m_floor) * _FLOOR_FIRST_FROM >= m_floor:
        found = pack(m_floor)
        if found is None:
            lo = m_floor + align
        else:
            hi, fewest = m_floor, found
    fewest, hi = fewest_that_packs(pack, lo, hi, align, fewest)
    if fewest is not None:
        take_if_no_worse(hi, fewest)
    return bins, bin_q, m
