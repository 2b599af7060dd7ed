"""`build_schedule`: pack samples into micro-batches and spread them over DP ranks.

The step ends when the slowest rank ends; the schedule minimises that makespan under the
cost the caller chose, with hard guarantees (every sample exactly once; no micro-batch of
several samples over the token cap; the same number of micro-batches on every rank, a
multiple of ``align``, none empty; the same result in every process).

How (each step justified by ``benchmarks/bench_scheduler.py``):

1. Micro-batches per rank, ``m``: the fewest that can hold the samples — a bin-packing
   lower bound (samples over the cap alone; no two samples over half the cap together;
   total tokens / cap), spread over the ranks, rounded up to a multiple of ``align``, and
   raised just enough that a level fill leaves room for the shortest samples. Full
   micro-batches amortise the fixed cost per micro-batch, so no more are asked for unless
   packing fails, in which case ``m`` grows by about 1%.
2. Without groups (`pack`): pack all samples by tokens into ``dp × m`` level micro-batches,
   give each rank ``m`` of them balancing their true costs, then (`refine`) move and swap
   single samples between paired ranks, judged by the true cost of the micro-batches they
   change. With groups (`groups`): balance whole groups over ranks (marginal costs, within
   a token budget per rank), then pack each rank. Here ``m`` can also be too large (a rank
   with few samples cannot fill ``m`` micro-batches), so failures move it either way.
   Feasibility with groups is bin packing under a sample-count constraint (NP-hard): on
   tiny, tight inputs the search may report failure where a placement exists.
3. Run order inside each rank (`order`).

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

from costmodel.checks import positive_int
from costmodel.flops import MAX_LENGTH, as_lengths
from costmodel.scheduler.bounds import lower_bound, microbatch_range, round_up
from costmodel.scheduler.costs import Cost, as_cost, quantise
from costmodel.scheduler.groups import first_appearance_ids, place_groups
from costmodel.scheduler.order import ORDERS, run_order
from costmodel.scheduler.pack import assign_bins, best_fit_pack, pack_tokens
from costmodel.scheduler.refine import BinState, local_search

logger = logging.getLogger(__name__)

__all__ = ["Schedule", "build_schedule", "token_cap"]

# Quantised costs sum to about 2**44: exact integer sums with room (2**9) for
# non-additive micro-batch costs up to 2**53 (float64-exact integers).
_QUANT_BITS = 44


@dataclass(frozen=True)
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
        """Micro-batches of several samples over the cap (always 0 by construction)."""
        cap = self.max_tokens_per_microbatch
        return sum(
            1
            for rank_mbs, rank_tok in zip(self.microbatches, self.microbatch_tokens)
            for mb, tok in zip(rank_mbs, rank_tok)
            if tok > cap and len(mb) > 1
        )

    @property
    def oversized(self) -> int:
        """Single samples longer than the cap, each alone in its micro-batch."""
        cap = self.max_tokens_per_microbatch
        return sum(1 for rank_tok in self.microbatch_tokens for tok in rank_tok if tok > cap)

    def digest(self) -> str:
        """A stable hash of the assignment (rank → micro-batches → samples), for checking
        that independently computed schedules agree."""
        payload = json.dumps(self.microbatches, separators=(",", ":")).encode()
        return hashlib.sha256(payload).hexdigest()

    def to_dict(self) -> dict[str, Any]:
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


def _dense_groups(group_ids: Sequence[Any], n: int) -> np.ndarray:
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
    if arr.ndim == 1 and arr.dtype.kind in "iub":
        _, dense = np.unique(arr, return_inverse=True)
        return dense.astype(np.int64)
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
    group_ids: Sequence[Any] | None = None,
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
    if strict and over.any():
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
        n_groups = int(groups.max()) + 1 if n else 0
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

    by_length = np.lexsort((np.arange(n), -lens))  # longest first, ties by index
    m_start, short = _start_m(lens[by_length], dp, cap, m_lb, m_max, align)
    # A binding min_num_microbatches is a count the caller must get (ranks agreeing on one):
    # start there, and pack it tightly if levelling fails, before taking more.
    exact = min_num_microbatches is not None and m_lb == round_up(min_m, align)
    if exact and groups is None:
        m_start = m_lb
    fill_tokens = min(cap, max(1, int(lens.sum()) // (dp * m_start)))
    s = cost_obj.marginal_costs(lens, fill_tokens)
    # The scale comes from an upper bound of every schedule's total cost: the marginal
    # costs plus a fixed cost for each of at most n micro-batches. From the marginal costs
    # alone, a few short samples under a model with a large fixed cost (the measured
    # profiles: ~20 ms against microseconds) would scale micro-batch costs past int64.
    one_token = np.ones(1, dtype=np.int64)
    fixed = float(cost_obj.evaluate(one_token, np.array([0, 1], dtype=np.int64))[0])
    try:
        total = math.fsum(s.tolist()) + lens.size * fixed
    except OverflowError:
        total = math.inf
    if not math.isfinite(total):
        raise ValueError(f"cost {cost_obj.name!r}: the samples' costs sum past the largest "
                         "float; give the cost in larger units (ms, not ns)")
    exponent = _QUANT_BITS - math.ceil(math.log2(total)) if total > 0 else 0
    if exponent > 1000:  # 2.0 ** exponent would overflow
        raise ValueError(f"cost {cost_obj.name!r}: the samples' costs sum to {total:.3g}, too "
                         "small to tell apart; give the cost in smaller units (ms, not hours)")
    scale = 2.0**exponent
    q = np.rint(s * scale).astype(np.int64)

    if groups is None:
        rank_of, bin_of, m, bin_q = _pack_and_assign(
            lens, by_length, q, dp, m_lb, m_start, m_max, align, cap, cost_obj, scale, exact
        )
    else:
        grouped = _Grouped(lens, q, groups, dp, align, cap, short)
        rank_of, bin_of, m = _place_groups(grouped, (m_lb, m_start, m_max), exact)
        bin_q = None
    state = BinState(lens, q, rank_of, bin_of, dp, m, cap, cost_obj, scale, bin_q)
    greedy_imbalance = _imbalance(state.load)
    steps = 0
    if groups is None:
        steps = local_search(state)

    return _finish(
        state,
        cost_obj,
        order,
        s,
        lower_bound(cost_obj, lens, cap, dp, order=by_length, sample_costs=s),
        stats={
            "greedy_imbalance": greedy_imbalance,
            "local_search_steps": steps,
            "min_microbatches_per_rank": m_lb,
            "microbatches_per_rank": m,
        },
    )


def _start_m(
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


def _next_m(m: int, left_tokens: int, dp: int, align: int, cap: int) -> int:
    # Enough extra micro-batches for what did not fit, and at least 1% more, so a tight
    # fill converges in a few tries.
    extra_bins = -(-left_tokens // cap) + 1
    grow = max(-(-extra_bins // dp), -(-m // 100), 1)
    return m + round_up(grow, align)


_FEWER_MAX_M = 64


def _pack_and_assign(
    lens: np.ndarray,
    by_length: np.ndarray,
    q: np.ndarray,
    dp: int,
    m_floor: int,
    m_start: int,
    m_max: int,
    align: int,
    cap: int,
    cost: Cost,
    scale: float,
    exact: bool = False,
) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """Pack by tokens into dp × m micro-batches (fewest m that works), then give each
    rank m of them balancing their true costs. Returns (rank_of, bin_of, m, bin costs).
    ``exact``: ``m_start`` is a count the caller asked for; when levelling fails there,
    best-fit packing is tried at that count too before growing.

    The search starts at ``m_start`` (a guess that leaves room for a level fill) and grows
    on failure. When the guess packs at once, fewer micro-batches are tried down to
    ``m_floor``, kept while their total cost is lower: a micro-batch saved is a fixed cost
    saved, but fuller micro-batches can cost more per token (a measured H200 profile of
    Qwen3-8B has both), so the cost decides, not the count.
    """

    def bin_costs(bins: np.ndarray, k: int) -> np.ndarray:
        if cost.additive:
            return np.bincount(bins, weights=q, minlength=k).astype(np.int64)
        order = np.argsort(bins, kind="stable")
        offsets = np.concatenate([[0], np.cumsum(np.bincount(bins, minlength=k))])
        return quantise(cost.evaluate(lens[order], offsets.astype(np.int64)), scale, cost.name)

    def total(bin_q: np.ndarray) -> float:
        return float(bin_q.sum()) + (getattr(cost, "fixed", 0.0) * scale * bin_q.size
                                     if cost.additive else 0.0)

    m = m_start
    tried: list[int] = []
    while True:
        tried.append(m)
        bins, left = pack_tokens(lens, dp * m, cap, by_length)
        if bins is None and (m >= m_max or (exact and m == m_start)):  # a tighter packing
            bins = best_fit_pack(lens, dp * m, cap, by_length)
        if bins is not None:
            break
        if m >= m_max:
            raise ValueError(
                f"could not pack {lens.size} samples into {dp} ranks × m micro-batches of at "
                f"most {cap} tokens (tried m = {tried}): raise max_tokens_per_microbatch, or "
                f"lower dp_size or align"
            )
        m = min(_next_m(m, left, dp, align, cap), m_max)
    bin_q = bin_costs(bins, dp * m)
    # At most two steps down, and only while one micro-batch per rank is worth it (past
    # _FEWER_MAX_M per rank, one fewer saves under 1/64 of the fixed costs, and each try
    # is another pass over every sample).
    for _ in range(2 if len(tried) == 1 and m <= _FEWER_MAX_M else 0):
        if m - align < m_floor:
            break
        fewer, _ = pack_tokens(lens, dp * (m - align), cap, by_length)
        if fewer is None:
            break
        fewer_q = bin_costs(fewer, dp * (m - align))
        if total(fewer_q) >= total(bin_q):
            break
        bins, bin_q, m = fewer, fewer_q, m - align
    k = dp * m
    rank_of_bin = assign_bins(bin_q, dp, m)
    # Renumber micro-batches rank by rank: id = rank * m + slot.
    by_rank = np.lexsort((np.arange(k), rank_of_bin))
    new_id = np.empty(k, dtype=np.int64)
    new_id[by_rank] = np.arange(k, dtype=np.int64)
    bin_of = new_id[bins]
    renumbered_q = np.empty(k, dtype=np.int64)
    renumbered_q[new_id] = bin_q
    return bin_of // m, bin_of, m, renumbered_q


# Counts tried again tightly: enough to walk down from a count one sample short to the
# fewest that fit in the tight cases found (m of 2-6), few enough to bound the time.
_LAST_TRIES = 8
# Samples the tight retries may pack in all: a few dozen packings of ranks of thousands of
# samples, so that an input no heuristic places is refused in well under a second.
_REPAIR_SAMPLES = 1 << 17


@dataclass(frozen=True)
class _Grouped:
    """Grouped samples and the constraints every placement try shares."""

    lens: np.ndarray
    q: np.ndarray
    groups: np.ndarray
    dp: int
    align: int
    cap: int
    short: int

    def place(self, m: int, tight: int = 0) -> tuple[np.ndarray, np.ndarray] | str:
        return place_groups(
            self.lens, self.q, self.groups, self.dp, m, self.cap, self.short, tight=tight
        )


def _place_groups(
    g: _Grouped, m_range: tuple[int, int, int], exact: bool = False
) -> tuple[np.ndarray, np.ndarray, int]:
    """Place whole groups for the fewest micro-batches per rank that work.

    ``m_range``: (lowest possible, where to start, highest possible). A failure says which
    way to go: a rank with too few samples for ``m`` micro-batches asks for fewer, a rank
    whose samples do not pack asks for more. Each try narrows the range, so the search ends.
    ``exact``: the lowest is a count the caller asked for (ranks agreeing on one): it is
    tried first, with the tight packer too, so a count a schedule came out with is found
    again when asked for.
    """
    lo, m, hi = m_range
    if exact:
        placed = g.place(lo)
        if placed == "tokens":
            placed = g.place(lo, tight=_REPAIR_SAMPLES)
        if not isinstance(placed, str):
            return placed[0], placed[1], lo
    dp, align, cap = g.dp, g.align, g.cap
    # Whole groups balance less finely than samples, and balancing cost moves tokens
    # around: leave each rank room for 1% more tokens plus half a group.
    n_groups = int(g.groups.max()) + 1
    tokens = int(np.minimum(g.lens, cap).sum())
    need = tokens * 1.01 + dp * tokens / (2 * n_groups)
    m = max(m, min(round_up(math.ceil(need / (dp * (cap - g.short + 1))), align), hi))
    failed: list[tuple[int, str]] = []  # (m, why) of every try so far
    shrunk = False
    while True:
        placed = g.place(m)
        if not isinstance(placed, str):
            return placed[0], placed[1], m
        failed.append((m, placed))
        if placed == "samples":
            hi, shrunk = m - align, True
        else:
            lo = m + align
        if lo > hi:
            return _place_groups_tight(g, m_range, failed)
        if placed == "samples" or shrunk:
            m = lo + (hi - lo) // (2 * align) * align  # bisect what is left
        else:
            m = min(_next_m(m, 0, dp, align, cap), hi)


def _place_groups_tight(
    g: _Grouped, m_range: tuple[int, int, int], failed: list[tuple[int, str]]
) -> tuple[np.ndarray, np.ndarray, int]:
    """The last resort of `_place_groups`, or the ValueError that says what to change.

    Placement is a heuristic: a failure at one m does not prove the others fail (a rank one
    sample short at m + 1 may pack at m; a rank that did not pack may after a swap of
    groups). So every count below the fewest that left a rank short of samples is tried
    again, most room first, with the tight packer and group swaps, under one budget for
    all. Rarely reached: tight inputs only (a few samples per micro-batch).
    """
    short_at = min([x for x, why in failed if why == "samples"], default=m_range[2] + 1)
    retried = list(range(m_range[0], short_at, g.align))[::-1][:_LAST_TRIES]
    for m in retried:
        placed = g.place(m, tight=_REPAIR_SAMPLES // len(retried))
        if not isinstance(placed, str):
            return placed[0], placed[1], m
    again = f", then {retried} with a tighter packer and swaps of groups" if retried else ""
    raise ValueError(
        f"could not pack {g.lens.size} samples in {int(g.groups.max()) + 1} groups into {g.dp} "
        f"ranks × m micro-batches of at most {g.cap} tokens (tried m = {[x for x, _ in failed]}"
        f"{again}); a group stays on one rank and every rank needs m samples: raise "
        f"max_tokens_per_microbatch, lower dp_size or align, or use smaller groups"
    )


def _imbalance(load: np.ndarray) -> float:
    mean = float(load.sum()) / load.size
    return float(load.max()) / mean if mean > 0 else 1.0


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
    flat = np.argsort(st.bin_of, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(st.count)]).astype(np.int64)
    if cost.additive:
        # Same numbers as cost.evaluate, without recomputing the per-sample costs.
        bin_costs = np.bincount(st.bin_of, weights=sample_costs, minlength=dp * m)
        bin_costs += getattr(cost, "fixed", 0.0)
    else:
        bin_costs = cost.evaluate(st.lengths[flat], offsets)
    if st.members is not None:
        members = [sorted(b) for b in st.members]
    else:
        flat_list = flat.tolist()
        bounds = offsets.tolist()
        members = [flat_list[bounds[b] : bounds[b + 1]] for b in range(dp * m)]
    tokens = st.fill.tolist()
    mbs: list[list[list[int]]] = []
    mb_costs: list[list[float]] = []
    mb_tokens: list[list[int]] = []
    rank_costs: list[float] = []
    for r in range(dp):
        base = r * m
        seq = run_order(st.bin_q[base : base + m], order)
        mbs.append([members[base + k] for k in seq])
        costs_r = [float(bin_costs[base + k]) for k in seq]
        mb_costs.append(costs_r)
        mb_tokens.append([int(tokens[base + k]) for k in seq])
        rank_costs.append(math.fsum(costs_r))
    return Schedule(
        microbatches=mbs,
        microbatch_costs=mb_costs,
        microbatch_tokens=mb_tokens,
        rank_costs=rank_costs,
        lower_bound=lb,
        max_tokens_per_microbatch=st.cap,
        cost_name=cost.name,
        stats=stats,
    )
