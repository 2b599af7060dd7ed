"""`build_schedule`: pack samples into micro-batches and spread them over DP ranks.

The step ends when the slowest rank ends; the schedule minimises that makespan under the
cost the caller chose, with hard guarantees (every sample exactly once; no micro-batch of
several samples over the token cap; the same number of micro-batches on every rank, a
multiple of ``align``, none empty; the same result in every process).

How (each step justified by ``benchmarks/bench_scheduler.py``):

1. Micro-batches per rank, ``m`` (`counts`): the fewest that can hold the samples — a
   bin-packing lower bound (samples over the cap alone; no two samples over half the cap
   together; total tokens / cap), spread over the ranks, rounded up to a multiple of
   ``align``, and raised just enough that a level fill leaves room for the shortest
   samples. Full micro-batches amortise the fixed cost per micro-batch, so no more are
   asked for unless packing fails, in which case ``m`` grows by about 1%.
2. Without groups (`pack`): pack all samples by tokens into ``dp × m`` level micro-batches,
   give each rank ``m`` of them balancing their true costs (also from fewer micro-batches
   where levelling missed them: best fit's own count, or a count that ties in total; and,
   under a cost that prices how full a micro-batch is, from best fit's full micro-batches,
   the fullest split to the count, where those fills cost less in all; the search below
   runs from each start and keeps the best), then (`refine`) move and swap
   single samples (or batches of small ones) between paired ranks, judged by the true cost
   of the micro-batches they change; where that ends over 0.5% above the ranks' mean (away
   from the bound), the same at up to two more micro-batches per rank, kept where shorter
   (more samples over the cap than ranks can leave the fewest no room to balance). With
   groups (`groups`): balance whole groups over
   ranks (marginal costs, a calibrated curve's slope around the fill: `Cost.marginal_costs`'
   ``around``; within a token budget per rank), pack each rank, then
   (`group_search`) move and swap whole groups between paired ranks on true costs, each
   piece of a group into a micro-batch with room; where two ranks hold few groups,
   (`pair_repack`) split the most loaded one's groups again with a light rank's and pack
   both from scratch. Here ``m`` can also be too large (a rank
   with few samples cannot fill ``m`` micro-batches), so failures move it either way.
   Feasibility with groups is bin packing under a sample-count constraint (NP-hard): on
   tiny, tight inputs the search may report failure where a placement exists.
3. Run order inside each rank (`order`), by the micro-batch costs the schedule reports.

Costs are quantised to integers (a power-of-two scale, so the rounding is exact
arithmetic) before any sum or comparison: no result depends on floating-point summation
order, hash seeds or set order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from costmodel.checks import positive_int, true_or_false
from costmodel.flops import MAX_LENGTH, as_lengths
from costmodel.scheduler.bounds import (
    cheapest_fill,
    cost_per_token,
    lower_bound,
    microbatch_range,
    round_up,
)
from costmodel.scheduler.costs import Cost, as_cost, quantise
from costmodel.scheduler.counts import bin_costs_of, level_layout, pack_and_assign, start_m
from costmodel.scheduler.group_search import group_local_search
from costmodel.scheduler.grouped_counts import Grouped, heavy_groups_apart, place_grouped
from costmodel.scheduler.groups import first_appearance_ids
from costmodel.scheduler.order import ORDERS, run_orders
from costmodel.scheduler.pair_repack import pair_repack
from costmodel.scheduler.refine import MAX_SWEEPS, BinState, batch_search, local_search
from costmodel.scheduler.sorting import as_lists, longest_first, members_of

logger = logging.getLogger(__name__)

__all__ = ["Schedule", "build_schedule", "token_cap"]

# Quantised costs sum to about 2**44: exact integer sums with room (2**9) for
# non-additive micro-batch costs up to 2**53 (float64-exact integers).
_QUANT_BITS = 44
# A placement this close to the lower bound is not worth another start of the local search.
_AT_THE_BOUND = 5e-4
# Sweeps of the local search from an extra start at fewer micro-batches (`pack_and_assign`).
_EXTRA_SWEEPS = MAX_SWEEPS // 4
# A schedule still this far over its ranks' mean after the search, and not at the lower
# bound, may have lacked room: with more samples over the cap than ranks (`heavy_apart`
# sets at most dp - 1 heavy ranks apart) the level packing fills the heavy ranks' other
# micro-batches to the cap, and no move fits anywhere. Up to _ROOM_COUNTS more micro-batches
# per rank are searched too, each kept where its step is shorter (8,192 geometric lengths
# of mean cap / 4, 143 over the cap, dp 64, H200 profile: max/mean 1.059 at the fewest
# count, 1.0001 at one more, a 5.5% shorter step).
_ROOM_IMBALANCE = 5e-3
_ROOM_COUNTS = 2
# Where a calibrated model's micro-batch is this much cheaper per token (fixed cost
# included) at some fill below the schedule's mean fill, the count that fills there is
# searched too (`_at_the_cheapest_fill`).
_CHEAPER_FILL = 0.01


@dataclass(frozen=True, repr=False)
class Schedule:
    """Per-rank micro-batches, in execution order, with their predicted costs.

    ``microbatches[r][k]`` lists the global sample indices (ascending) of rank r's k-th
    micro-batch. Costs are in the cost's units (tokens, FLOPs, or milliseconds for a cost
    model).
    """

    microbatches: list[list[list[int]]]
    microbatch_costs: list[list[float]]
    microbatch_tokens: list[list[int]]
    rank_costs: list[float]
    lower_bound: float
    max_tokens_per_microbatch: int
    cost_name: str
    stats: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def dp_size(self) -> int:
        return len(self.microbatches)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per rank (the same on every rank)."""
        return len(self.microbatches[0]) if self.microbatches else 0

    @property
    def makespan(self) -> float:
        """Predicted cost of the slowest rank: when the step ends."""
        return max(self.rank_costs)

    @property
    def mean_cost(self) -> float:
        return math.fsum(self.rank_costs) / len(self.rank_costs)

    @property
    def imbalance(self) -> float:
        """max / mean of the predicted rank costs (1.0 is perfect balance)."""
        mean = self.mean_cost
        return self.makespan / mean if mean > 0 else 1.0

    @property
    def makespan_over_lower_bound(self) -> float:
        return self.makespan / self.lower_bound if self.lower_bound > 0 else 1.0

    @property
    def cap_violations(self) -> int:
        """Micro-batches of several samples over the cap (always 0 by construction; an
        evaluated schedule, `evaluate_schedule`, may have them)."""
        return sum(1 for samples in self._sizes_over_cap() if samples > 1)

    @property
    def oversized(self) -> int:
        """Single samples longer than the cap, each alone in its micro-batch."""
        return sum(1 for samples in self._sizes_over_cap() if samples == 1)

    def _sizes_over_cap(self) -> list[int]:
        """How many samples each micro-batch over the cap holds."""
        cap = self.max_tokens_per_microbatch
        return [len(mb) for rank_mbs, rank_tok in zip(self.microbatches, self.microbatch_tokens)
                for mb, tok in zip(rank_mbs, rank_tok) if tok > cap]

    @classmethod
    def from_microbatches(
        cls, per_rank: Sequence[Sequence[int]], members: Sequence[list[int]], costs: Sequence[float],
        tokens: Sequence[int], *, lower_bound: float, cap: int, cost_name: str,
        stats: dict[str, Any] | None = None,
    ) -> Schedule:
        """A schedule from each rank's micro-batch ids in run order and, per id, its samples,
        predicted cost and tokens (a rank's cost is the exact sum of its micro-batches')."""
        mb_costs = [[float(costs[b]) for b in rank] for rank in per_rank]
        return cls(
            microbatches=[[members[b] for b in rank] for rank in per_rank],
            microbatch_costs=mb_costs,
            microbatch_tokens=[[int(tokens[b]) for b in rank] for rank in per_rank],
            rank_costs=[math.fsum(c) for c in mb_costs],
            lower_bound=lower_bound,
            max_tokens_per_microbatch=cap,
            cost_name=cost_name,
            stats=stats or {},
        )

    def __repr__(self) -> str:
        # A summary: the dataclass's repr listed every sample index (tens of KB in a log line).
        samples = sum(len(mb) for rank in self.microbatches for mb in rank)
        return (f"Schedule(dp_size={self.dp_size}, num_microbatches={self.num_microbatches}, "
                f"samples={samples}, cap={self.max_tokens_per_microbatch}, "
                f"cost={self.cost_name!r}, makespan={self.makespan:.6g}, "
                f"imbalance={self.imbalance:.4f})") if self.rank_costs else "Schedule(empty)"

    def digest(self) -> str:
        """A stable hash of the assignment (rank → micro-batches → samples), for checking
        that independently computed schedules agree."""
        payload = json.dumps(self.microbatches, separators=(",", ":")).encode()
        return hashlib.sha256(payload).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """The schedule and its figures as plain JSON types (`costmodel schedule --json`)."""
        return {
            "cost": self.cost_name,
            "dp_size": self.dp_size,
            "num_microbatches": self.num_microbatches,
            "max_tokens_per_microbatch": self.max_tokens_per_microbatch,
            "makespan": self.makespan,
            "mean_cost": self.mean_cost,
            "imbalance": self.imbalance,
            "lower_bound": self.lower_bound,
            "makespan_over_lower_bound": self.makespan_over_lower_bound,
            "cap_violations": self.cap_violations,
            "oversized": self.oversized,
            "rank_costs": self.rank_costs,
            "microbatches": self.microbatches,
            "microbatch_costs": self.microbatch_costs,
            "microbatch_tokens": self.microbatch_tokens,
            "digest": self.digest(),
            "stats": self.stats,
        }


# -- input checks ----------------------------------------------------------------------


def token_cap(value: Any) -> int:
    cap = positive_int(value, "max_tokens_per_microbatch")
    if cap > MAX_LENGTH:  # no sample is longer; larger caps would overflow int64 budgets
        raise ValueError(f"max_tokens_per_microbatch must be at most {MAX_LENGTH:,} (2^31 - 1, "
                         f"the longest sample allowed), got {cap:,}")
    return cap


def _dense_groups(group_ids: Sequence[Any] | np.ndarray, n: int) -> np.ndarray:
    if isinstance(group_ids, (str, bytes)) or not hasattr(group_ids, "__len__"):
        raise ValueError(f"group_ids must be a sequence with one id per sample, got "
                         f"{group_ids!r:.60}")
    if len(group_ids) != n:
        raise ValueError(f"group_ids has {len(group_ids)} entries for {n} lengths")
    try:
        arr = np.asarray(group_ids)
    except ValueError:  # ragged: ids of different shapes, refused one by one below
        arr = np.empty(0, dtype=object)
    if arr.ndim > 1:  # an (n, 1) column read row by row would make every sample a group
        raise ValueError(f"group_ids must hold one id per sample, got an array of shape "
                         f"{arr.shape}; flatten it")
    # Numbered by first appearance, whatever the ids are: the schedule depends on which
    # samples share a group, not on what the ids are (ints sorted, strings not, split ranks
    # that named the same groups differently).
    return first_appearance_ids(group_ids, "group_ids")


# -- the scheduler -----------------------------------------------------------------------


# Batches already warned about (a digest of their lengths, and the cap): a command that
# schedules one batch several ways says it once, a training run once per batch that has
# such samples.
_WARNED_OVERSIZED: set[tuple[str, int]] = set()


def _warn_oversized(lens: np.ndarray, over: np.ndarray, cap: int) -> None:
    """Not an error by default (slime and verl also let such a sample run alone), but never
    silent: a micro-batch over the cap is what runs out of memory on a cluster."""
    key = (hashlib.sha1(lens.tobytes()).hexdigest(), cap)
    if key in _WARNED_OVERSIZED:
        return
    if len(_WARNED_OVERSIZED) > 1024:  # a long run: keep the set small
        _WARNED_OVERSIZED.clear()
    _WARNED_OVERSIZED.add(key)
    logger.warning(
        "%d sample(s) longer than the token cap of %d (the longest %d tokens) each run alone "
        "in a micro-batch over the cap: raise the cap, truncate them, or refuse them "
        "(build_schedule's strict=True)", int(over.size), cap, int(over.max()))


def build_schedule(
    lengths: ArrayLike,
    *,
    dp_size: int,
    max_tokens_per_microbatch: int,
    cost: Any = "tokens",
    spec: Any = None,
    align: int = 1,
    group_ids: Sequence[Any] | np.ndarray | None = None,
    order: str = "none",
    strict: bool = False,
    mode: str = "train",
    min_num_microbatches: int | None = None,
) -> Schedule:
    """Pack ``lengths`` into micro-batches under a token cap and spread them over ranks.

    Args:
        lengths: tokens per sample.
        dp_size: data-parallel ranks.
        max_tokens_per_microbatch: the token cap of one micro-batch. A single sample longer
            than the cap sits alone in its micro-batch (or, with ``strict``, is an error).
        cost: "tokens", "flops" (exact analytic FLOPs of ``spec``), a cost model (object,
            file path, or shipped name such as "h200/qwen3-8b"), or a callable on one
            micro-batch's lengths (a Python call each time: about twice per distinct length,
            to probe each sample's marginal cost, and several times per micro-batch during
            the search; ~100 ms at 16k samples: prefer a cost model, whose costs are
            vectorised).
        spec: the model (`ModelSpec` or preset name), for ``cost="flops"``.
        align: micro-batches per rank must be a multiple of this: for Megatron's interleaved
            (virtual) pipeline, its micro-batch group per virtual stage
            (``microbatch_group_size_per_vp_stage``, the pipeline-parallel size by default),
            not the number of virtual stages; 1 without virtual stages.
        group_ids: samples sharing an id (one prompt's responses) stay on one rank.
        order: run order inside a rank: "none", "longest-first" or "pipeline".
        strict: raise instead of letting an over-cap sample sit alone.
        mode: "train" (forward + backward) or "forward", passed to cost models.
        min_num_microbatches: at least this many micro-batches per rank, and exactly this
            many (rounded up to ``align``) whenever the cap needs no more and a packing into
            that many is found: ranks that schedule their own samples use it to agree on one
            count (verl's ``same_micro_num_in_dp``).

    Returns:
        A `Schedule`.
    """
    if _ndim(lengths) == 0:  # a number, None, a generator: not one length per sample
        raise ValueError(f"lengths must be a list or array with one length per sample, got "
                         f"{lengths!r:.60}")
    lens = as_lengths(lengths, "lengths")
    dp = positive_int(dp_size, "dp_size")
    cap = token_cap(max_tokens_per_microbatch)
    align = positive_int(align, "align")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    min_m = (
        1
        if min_num_microbatches is None
        else positive_int(min_num_microbatches, "min_num_microbatches")
    )
    n = lens.size
    over = lens > cap
    if true_or_false(strict, "strict") and over.any():
        i = int(np.flatnonzero(over)[0])
        raise ValueError(
            f"sample {i} has {int(lens[i])} tokens, over the cap of {cap} "
            f"(strict=True; {int(over.sum())} sample(s) over the cap in all)"
        )
    if n < dp * align:
        raise ValueError(
            f"{n} samples cannot fill dp_size × align = {dp} × {align} = {dp * align} "
            f"micro-batches (each rank needs at least {align}, none empty): give at least "
            f"{dp * align} samples, or lower dp_size or align"
        )
    groups = None
    if group_ids is not None:
        groups = _dense_groups(group_ids, n)
        n_groups = int(groups.max()) + 1
        if n_groups < dp:
            raise ValueError(
                f"{n_groups} groups cannot cover {dp} ranks (a group stays on one rank, and "
                f"no rank may be empty): give at least {dp} groups, or lower dp_size"
            )
        if n_groups == n:
            groups = None  # every sample alone: the fast path applies
    cost_obj = as_cost(cost, spec, mode)
    if over.any():  # after the input checks: a batch refused is not warned about too
        _warn_oversized(lens, lens[over], cap)

    m_lb, m_max = microbatch_range(lens, cap, dp, align, min_m, groups)

    by_length = longest_first(lens)
    m_start, short = start_m(lens[by_length], dp, cap, m_lb, m_max, align)
    # A binding min_num_microbatches is a count the caller must get (ranks agreeing on one):
    # start there, and pack it tightly if levelling fails, before taking more.
    exact = min_num_microbatches is not None and m_lb == round_up(min_m, align)
    if exact and groups is None:
        m_start = m_lb
    fill_tokens = min(cap, max(1, int(lens.sum()) // (dp * m_start)))
    s = cost_obj.marginal_costs(lens, fill_tokens, around=groups is not None)
    # The scale comes from an upper bound of every schedule's total cost: the marginal
    # costs plus a fixed cost for each of at most n micro-batches. From the marginal costs
    # alone, a few short samples under a model with a large fixed cost (the measured
    # profiles: ~20 ms against microseconds) would scale micro-batch costs past int64.
    one_token = np.ones(1, dtype=np.int64)
    fixed = float(cost_obj.evaluate(one_token, np.array([0, 1], dtype=np.int64))[0])
    total = _total(s, lens.size * fixed)
    if not math.isfinite(total):
        raise ValueError(f"cost {cost_obj.name!r}: the samples' costs sum past the largest "
                         "float; give the cost in larger units (ms, not ns)")
    exponent = _QUANT_BITS - _ceil_log2(total) if total > 0 else 0
    if exponent > 1000:  # 2.0 ** exponent would overflow
        raise ValueError(f"cost {cost_obj.name!r}: the samples' costs sum to {total:.3g}, too "
                         "small to tell apart; give the cost in smaller units (ms, not hours)")
    scale = 2.0**exponent
    q = quantise(s, scale, cost_obj.name)

    # Starts (bin_of, m, bin costs), the costs None where BinState works them out.
    layouts: Sequence[tuple[np.ndarray, int, np.ndarray | None]]
    extra: Sequence[tuple[np.ndarray, int, np.ndarray | None]]
    split: Sequence[tuple[np.ndarray, int, np.ndarray | None]] = []
    if groups is None:
        layouts, extra, split = pack_and_assign(
            lens, by_length, q, cost_obj, scale, dp=dp, m_range=(m_lb, m_start, m_max),
            align=align, cap=cap, exact=exact,
        )
    else:
        grouped = Grouped(lens, q, groups, dp, align, cap, short)
        placed = place_grouped(grouped, (m_lb, m_start, m_max),
                               bin_costs_of(lens, q, cost_obj, scale), exact)
        apart = None if exact else heavy_groups_apart(grouped, placed[1], m_max)
        layouts = [(*layout, None) for layout in (placed, apart) if layout is not None]
        extra = []
    lb = lower_bound(cost_obj, lens, cap, dp, order=by_length, sample_costs=s)
    state: BinState | None = None
    usual: tuple[BinState, float, int] | None = None  # the winner of `layouts`
    unsplit: tuple[BinState, float, int] | None = None  # the winner before the split start
    for i, (bin_of, m, bin_q) in enumerate([*layouts, *extra, *split]):  # lowest maximum wins
        if state is not None and state.load.max() <= lb * scale * (1 + _AT_THE_BOUND):
            break  # at a true bound no start does better (for a callable's reference: close)
        tried = BinState(lens, q, bin_of, dp, m, cap, cost_obj, scale, bin_q)
        tried_imbalance = _imbalance(tried.load)
        beat = None if state is None else int(state.load.max())
        if groups is None:
            sweeps = MAX_SWEEPS if i < len(layouts) else _EXTRA_SWEEPS
            tried_steps = local_search(tried, beat=beat, max_sweeps=sweeps)
        else:  # each start repacked too: it can change which start ends lower
            tried_steps = group_local_search(tried, groups) + pair_repack(tried, groups)
        if state is None or int(tried.load.max()) < int(state.load.max()):
            state, greedy_imbalance, steps = tried, tried_imbalance, tried_steps
        if i == len(layouts) - 1:
            usual = state, greedy_imbalance, steps
        if i == len(layouts) + len(extra) - 1:
            unsplit = state, greedy_imbalance, steps
    assert state is not None  # layouts holds at least one start, and the first is taken
    if groups is None:
        # The search ends (batch moves, then more room) from each contender, the lowest
        # kept, ties to the earlier: the usual winner, the winner before the split start,
        # and the winner of the single moves. A start that won the single moves can still
        # end above another's batch moves (2 of 13,644 fuzzed schedules, by 0.19% and
        # 0.30%), or, ending more level, stop the search for room short of what another
        # finds there (7 of 19,133 under a callable with bumps, up to 12.7%, a review's).
        best: tuple[BinState, float, int] | None = None
        done: list[BinState] = []
        roomier: dict[int, tuple[BinState, float, int] | None] = {}  # shared by contenders
        for contender in (usual, unsplit, (state, greedy_imbalance, steps)):
            if contender is None or any(contender[0] is st for st in done):
                continue
            done.append(contender[0])
            ended = _end_search(contender, exact, lens, by_length, (q, cost_obj, scale),
                                (align, m_max), lb * scale, roomier)
            if best is None or int(ended[0].load.max()) < int(best[0].load.max()):
                best = ended
        assert best is not None
        state, greedy_imbalance, steps = best
        # Not for whole groups: placing them again at that count took 1.1-2x the time of
        # the whole schedule for 0.15-0.6% shorter steps in 4 of 20 grouped RL batches.
        at_bound = state.load.max() <= lb * scale * (1 + _AT_THE_BOUND)
        m_fill = None if exact or at_bound or not cost_obj.separable else _cheapest_fill_count(
            cost_obj, lens, cap, dp, state.m, align)
        if m_fill is not None and m_fill <= m_max:
            cheaper = _at_the_cheapest_fill(state, lens, by_length, (q, cost_obj, scale),
                                            m_fill, roomier)
            if cheaper is not None:
                state, greedy_imbalance, steps = cheaper

    _check_invariants(state, align, groups)
    return _finish(
        state,
        cost_obj,
        order,
        s,
        lb,
        stats={
            "greedy_imbalance": greedy_imbalance,
            "local_search_steps": steps,
            "min_microbatches_per_rank": m_lb,
            "microbatches_per_rank": state.m,
        },
    )


def _end_search(contender: tuple[BinState, float, int], exact: bool, lens: np.ndarray,
                by_length: np.ndarray, costs: tuple[np.ndarray, Cost, float],
                counts: tuple[int, int], bound: float,
                roomier: dict[int, tuple[BinState, float, int] | None]
                ) -> tuple[BinState, float, int]:
    """``contender`` (state, greedy imbalance, steps) after the batch moves and, unless the
    count is one the caller asked for (``exact``), the search for more room (``roomier``:
    `_with_more_room`'s searched counts, shared by the contenders)."""
    st, imbalance, steps = contender
    steps += batch_search(st)
    if not exact:
        more = _with_more_room(st, lens, by_length, costs, counts, bound, roomier)
        if more is not None:
            return more[0], more[1], steps + more[2]
    return st, imbalance, steps


def _with_more_room(st: BinState, lens: np.ndarray, by_length: np.ndarray,
                    costs: tuple[np.ndarray, Cost, float], counts: tuple[int, int],
                    bound: float, searched: dict[int, tuple[BinState, float, int] | None]
                    ) -> tuple[BinState, float, int] | None:
    """Where ``st`` ended more than _ROOM_IMBALANCE over its ranks' mean and above the bound
    (quantised), the level start at each of up to _ROOM_COUNTS more micro-batches per rank,
    searched as the usual one; the best that ends lower than ``st`` (state, its greedy
    imbalance, its steps), or None. ``searched``: each count's searched start (None: no
    level packing), added to; a count searched before is not searched again (contenders
    at one count reach the same ones: 7 repeats in 288 RL schedules)."""
    q, cost, scale = costs
    align, m_max = counts
    best = None
    top, m = int(st.load.max()), st.m
    for _ in range(_ROOM_COUNTS):
        if _imbalance(st.load) <= 1 + _ROOM_IMBALANCE or top <= bound * (1 + _AT_THE_BOUND):
            break
        m += align
        if m not in searched:
            searched[m] = _level_searched(lens, by_length, costs, st, m) if m <= m_max else None
        found = searched[m]
        if found is None:
            break
        st = found[0]
        if int(st.load.max()) >= top:
            break  # room did not help: more will not either
        best, top = found, int(st.load.max())
    return best


def _at_the_cheapest_fill(st: BinState, lens: np.ndarray, by_length: np.ndarray,
                          costs: tuple[np.ndarray, Cost, float], m: int,
                          searched: dict[int, tuple[BinState, float, int] | None]
                          ) -> tuple[BinState, float, int] | None:
    """The level start at ``m`` (`_cheapest_fill_count`), searched as the usual one; (state,
    its greedy imbalance, its steps) where it ends lower than ``st``, else None.
    ``searched``: as `_with_more_room`'s."""
    q, cost, scale = costs
    if m not in searched:
        layout = level_layout(lens, by_length, bin_costs_of(lens, q, cost, scale), st.dp, m,
                              st.cap)
        # Its micro-batches may not fill where the curve is cheap (samples near the cap
        # fill theirs whatever the count): search it only where its total is below what
        # the step takes now, spread evenly.
        if layout is None or int(layout[2].sum()) >= int(st.load.max()) * st.dp:
            return None
        # Its mean fill sits on the step the curve is cheap under: micro-batches on either
        # side of it give the search little to gain per sweep (a curve with a sharp step
        # took all 64, 20x the time; 16 still gain most of it).
        searched[m] = _level_searched(lens, by_length, costs, st, m, layout, _EXTRA_SWEEPS)
    found = searched[m]
    return found if found is not None and int(found[0].load.max()) < int(st.load.max()) else None


def _cheapest_fill_count(cost: Cost, lens: np.ndarray, cap: int, dp: int, m: int,
                        align: int) -> int | None:
    """Micro-batches per rank (a multiple of ``align``) whose level fills land where a
    separable cost is cheapest per token, fixed cost included (`bounds.cheapest_fill`):
    where that is above ``m`` and the curve there _CHEAPER_FILL cheaper per token than at
    the mean fill of ``m`` a rank; else None.

    The count search looks for the fewest micro-batches, whose level fills land near the
    cap. A GPU's token curve has steps (GEMM waves): under the shipped H200 profile a
    micro-batch of 10.5k tokens costs 6% less per token than one of 16k (training), one of
    30k 5% less than one of 32k (forward): of 32 RL batches (n 1,024-65,536, dp 8-64, caps
    8k-32k, both passes) 14 schedule 0.05-3.5% shorter at the count that fills there, the
    rest as before (the median schedule in 1.2x the time)."""
    over = lens > cap
    fits = int(lens[~over].sum())
    if not fits:
        return None
    n_over = int(over.sum())
    fill, rate = cheapest_fill(cost, min(cap, fits))
    now = fits / max(1, dp * m - n_over)  # the mean fill beside the oversized samples
    rate_now = float(cost_per_token(cost, np.array([now]))[0])
    cheaper = round_up(-(-(n_over + -(-fits // fill)) // dp), align)
    return cheaper if rate <= rate_now * (1 - _CHEAPER_FILL) and cheaper > m else None


def _level_searched(lens: np.ndarray, by_length: np.ndarray,
                    costs: tuple[np.ndarray, Cost, float], like: BinState,
                    m: int, layout: tuple[np.ndarray, int, np.ndarray] | None = None,
                    max_sweeps: int = MAX_SWEEPS) -> tuple[BinState, float, int] | None:
    """The level start at ``m`` micro-batches per rank (dp and cap as ``like``'s; ``layout``
    where `level_layout` built it already), searched as the usual one (at most
    ``max_sweeps`` sweeps of single moves): (state, its greedy imbalance, its steps), or None
    where levelling cannot pack that many."""
    q, cost, scale = costs
    if layout is None:
        layout = level_layout(lens, by_length, bin_costs_of(lens, q, cost, scale), like.dp,
                              m, like.cap)
    if layout is None:
        return None
    st = BinState(lens, q, layout[0], like.dp, m, like.cap, cost, scale, layout[2])
    imbalance = _imbalance(st.load)
    steps = local_search(st, max_sweeps=max_sweeps)
    steps += batch_search(st)
    return st, imbalance, steps


def _ndim(values: Any) -> int | None:
    """np.ndim, or None for ragged nesting (as_lengths says what is wrong with it)."""
    try:
        return np.ndim(values)
    except ValueError:
        return None


def _total(values: np.ndarray, extra: float) -> float:
    """Σ values + extra (values finite, >= 0), as far as `_ceil_log2` can tell: exactly
    (math.fsum) where it lies near a power of two, else numpy's pairwise sum. That sum is
    within ~1e-14 of the exact one, so 2^-20 inside a binade it has the same ceil(log2);
    math.fsum of a list took 3.7 ms at 65,536 samples, the numpy sum 0.05 ms."""
    with np.errstate(over="ignore"):  # past the largest float: math.fsum says so below
        approx = float(values.sum()) + extra
    mantissa = math.frexp(approx)[0]  # in [0.5, 1)
    if math.isfinite(approx) and 0.5 + 2.0**-20 < mantissa < 1 - 2.0**-20:
        return approx
    try:
        return math.fsum(values.tolist()) + extra
    except OverflowError:
        return math.inf


def _ceil_log2(x: float) -> int:
    """ceil(log2(x)) for x > 0, exactly: log2 of a total just above a large power of two
    rounds onto it (past ~2**50), and a C library's log2 need not be correctly rounded
    either; the scale must not depend on either."""
    mantissa, exponent = math.frexp(x)  # x = mantissa · 2**exponent, 0.5 <= mantissa < 1
    return exponent - 1 if mantissa == 0.5 else exponent


def _imbalance(load: np.ndarray) -> float:
    mean = float(load.sum()) / load.size
    return float(load.max()) / mean if mean > 0 else 1.0


def _check_invariants(st: BinState, align: int, groups: np.ndarray | None) -> None:
    """Recount what every step keeps by construction: every sample in one of the dp x m
    micro-batches, none empty, none of several samples over the cap, m a multiple of
    ``align``, each group on one rank. A step that broke it would cost an OOM on a cluster,
    a rank with nothing to run or a pipeline schedule that does not divide; here it is an
    error instead (a bug: report it with the input)."""
    k = st.dp * st.m
    lowest, highest = (int(st.bin_of.min()), int(st.bin_of.max())) if st.bin_of.size else (0, 0)
    what = ""
    split = None
    if groups is not None and st.bin_of.size:
        rank = st.bin_of // st.m  # each group's members must share their group's first rank
        first = np.full(int(groups.max()) + 1, -1, dtype=np.int64)
        first[groups[::-1]] = rank[::-1]
        split = np.flatnonzero(first[groups] != rank)
    if st.m % align:
        what = f"{st.m} micro-batches per rank, not a multiple of align={align}"
    elif split is not None and split.size:
        what = f"sample {int(split[0])}'s group is on more than one rank"
    elif lowest < 0 or highest >= k:
        what = f"a sample is in micro-batch {lowest if lowest < 0 else highest}, of 0..{k - 1}"
    else:
        count = np.bincount(st.bin_of, minlength=k)
        tokens = np.bincount(st.bin_of, weights=st.lengths, minlength=k)
        over = np.flatnonzero((tokens > st.cap) & (count > 1))
        if over.size:
            what = (f"micro-batch {int(over[0])} holds {int(count[over[0]])} samples of "
                    f"{int(tokens[over[0]])} tokens, over the cap of {st.cap}")
        elif not count.all():
            what = f"micro-batch {int(np.argmin(count))} is empty"
    if what:
        raise RuntimeError(f"costmodel's scheduler broke its own guarantee ({what}): a bug; "
                           "please report it with the lengths, dp_size, cap and cost")


def _finish(
    st: BinState,
    cost: Cost,
    order: str,
    sample_costs: np.ndarray,
    lb: float,
    stats: dict[str, Any],
) -> Schedule:
    dp, m = st.dp, st.m
    # Members of each micro-batch, ascending sample index (a stable sort keeps index order).
    flat, offsets = members_of(st.bin_of, dp * m)
    if cost.additive:
        # Same numbers as cost.evaluate, without recomputing the per-sample costs.
        # float64 with weights (numpy's stubs say int)
        bin_costs: np.ndarray = np.bincount(st.bin_of, weights=sample_costs, minlength=dp * m)
        bin_costs += cost.fixed_cost()
    else:
        bin_costs = cost.evaluate(st.lengths[flat], offsets)
    # By the costs the schedule reports, not the quantised ones: a quantum is the batch's
    # summed cost / 2^44, milliseconds beside one sample of 2^31 tokens, and a separable
    # cost's micro-batch sums several rounded parts: costs 1e-3 apart came out of order.
    per_rank = (run_orders(bin_costs.reshape(dp, m), order) + (np.arange(dp) * m)[:, None]).tolist()
    return Schedule.from_microbatches(
        per_rank, as_lists(flat, offsets), bin_costs.tolist(), st.fill.tolist(), lower_bound=lb,
        cap=st.cap, cost_name=cost.name, stats=stats,
    )
