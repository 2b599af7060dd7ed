"""Placement when samples come in groups that must share a rank (one prompt's responses).

Distribute, then pack:

1. Groups, costliest first, go to the least-loaded rank (by marginal cost) whose token
   budget still has room for them; the budget is what the token packer can fit into ``m``
   micro-batches (``m · (cap − room for a short sample)``).
2. Sweeps of group moves and swaps between paired ranks (the same scheme as `refine`, on
   whole groups) balance the ranks' costs within the token budgets, keeping at least ``m``
   samples on every rank (no micro-batch may be empty).
3. Each rank's samples are packed into exactly ``m`` micro-batches by `pack.pack_tokens`
   (from 16 ranks, all at once by `pack_ranks`: the same micro-batches).

When a rank cannot get ``m`` samples, the caller retries with fewer micro-batches per rank;
when a rank cannot be packed, with more. When neither way is left, the caller tries again
with ``tight``: a best-fit packer where levelling fails, and a rank that still does not
pack swaps or hands over one group (`_repair`).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Set
from typing import Any, NamedTuple

import numpy as np

from costmodel.checks import refuse_meta
from costmodel.scheduler.pack import MAX_ROUNDS, best_fit_pack, pack_tokens
from costmodel.scheduler.pack_ranks import pack_each_rank
from costmodel.scheduler.partition import karmarkar_karp_labels
from costmodel.scheduler.refine import MAX_SWEEPS, pair_ranks, swap_partners
from costmodel.scheduler.sorting import first_min_per_pair, longest_first, members_of, stable_order

__all__ = ["first_appearance_ids", "place_groups"]

_NONE = np.iinfo(np.int64).max
# Group sweeps: a finer tolerance than the samples' (whole groups move in coarse steps, and
# the samples' local search comes after), at most as many sweeps.
_GROUP_REL_TOL = 5e-5
# Rounds of level filling one rank's packing may take at least (see `_pack_ranks`).
_RANK_ROUNDS = 4
# From this many ranks, `pack_ranks` packs them all at once (same micro-batches): below it
# its set-up costs more than the loop over ranks saves (break-even at about 8 ranks).
_BATCH_MIN_DP = 16


def first_appearance_ids(ids: Any, what: str) -> np.ndarray:
    """Dense numbers 0, 1, ... for hashable ids, in the order they first appear (not hash
    order: the same on every process). ValueError for an id that cannot be one: unhashable,
    or NaN (never equal to itself, so "the same" NaN ids would split)."""
    # A dict or set iterates over its keys, in an order that is not the samples': refused.
    # A 0-d array or tensor has __len__ but no length (TypeError "len() of unsized object").
    if (isinstance(ids, (str, bytes, Mapping, Set)) or not hasattr(ids, "__len__")
            or getattr(ids, "ndim", 1) == 0):
        raise ValueError(f"{what} must be a sequence of ids, one per sample in order, got "
                         f"{type(ids).__name__} {ids!r:.60}")
    refuse_meta(ids, what, "ids to read",
                "give the ids themselves (a list, or a tensor on the CPU or a GPU)")
    by_value = _numbered_by_value(ids)
    if by_value is not None:
        return by_value
    seen: dict[Any, int] = {}
    out = np.empty(len(ids), dtype=np.int64)
    for i, g in enumerate(ids):
        if getattr(g, "ndim", None) is not None:  # a numpy or torch scalar, or an array
            if g.ndim != 0:
                raise ValueError(f"{what}[{i}] = {g!r:.60} is not a single id (shape "
                                 f"{tuple(g.shape)}): give one id per sample")
            g = g.item()  # a torch tensor hashes by identity: every sample its own group
        if isinstance(g, (float, np.floating)) and g != g:
            raise ValueError(f"{what}[{i}] is NaN, which cannot name a group: use integers or "
                             "strings")
        try:
            out[i] = seen.setdefault(g, len(seen))
        except TypeError as err:
            raise ValueError(f"{what}[{i}] = {g!r:.60} cannot be a group id ({err}): use "
                             "hashable ids such as integers or strings") from None
    return out


def _numbered_by_value(ids: Any) -> np.ndarray | None:
    """`first_appearance_ids` at numpy speed for integer ids (an array, a tensor on the CPU
    or a list) and a numpy array of strings; None for any other ids, which take the loop.
    (65,536 ids in a numpy array took 0.3 s one by one, their ``.item()`` most of it.)

    A list of strings takes the loop, as fast (65,536 uuids: 29 ms either way): numpy would
    copy it into strings as wide as the longest id (a prompt's text as its id, 16,384 of
    4,000 characters: 228 ms instead of 7) and drop trailing NULs ("a\\0" and "a" would
    merge)."""
    if isinstance(ids, (list, tuple)) and ids and isinstance(ids[0], str):
        return None
    try:
        arr = np.asarray(ids)
    except (ValueError, TypeError, RuntimeError):  # ragged, or a tensor on a GPU
        return None
    if arr.dtype.kind == "U" and not isinstance(ids, np.ndarray):
        return None  # strings among other ids: numpy made strings of all, 1 and "1" would merge
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iubU":
        return None
    _, inverse = np.unique(arr, return_inverse=True)  # numbered by value
    inverse = inverse.reshape(-1).astype(np.int64)
    n = arr.size
    first = np.full(int(inverse.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(n, dtype=np.int64))  # each value's first sample
    appears = np.zeros(n, dtype=bool)
    appears[first] = True
    return (np.cumsum(appears) - 1)[first][inverse]  # values counted in order of appearance


class _Units(NamedTuple):
    """Per group: its quantised cost, its tokens (an oversized sample counts as the cap:
    it takes a whole micro-batch), and its number of samples."""

    cost: np.ndarray
    tokens: np.ndarray
    count: np.ndarray  # type: ignore[assignment]  # shadows tuple.count, which no one calls


def _greedy(units: _Units, dp: int, budget: int) -> tuple[np.ndarray, bool]:
    """Costliest group first, to the least-loaded rank with token room (else the roomiest).
    Also returns whether some rank lacked room for a group (the budget bound).

    Where no group costs anything (a cost by the micro-batch alone, or one that falls as
    tokens grow: every marginal cost is 0), to the rank with the fewest tokens instead: by
    the tied loads, ties by rank index, rank 0 took every group up to the token budget,
    then rank 1, ...; ranks of samples over the cap then packed at no count, and groups of
    one or two samples were refused after seconds of search."""
    uq, ut, _ = units
    loads = [0] * dp
    uq_l, ut_l = uq.tolist(), ut.tolist()
    if not uq.any():
        uq_l = ut_l  # every cost 0: the tokens spread groups instead

    def add(r: int, u: int) -> None:
        loads[r] += uq_l[u]

    order = np.lexsort((np.arange(uq.size), -ut, -uq)).tolist()
    return _least_with_room(order, ut_l, dp, budget, loads.__getitem__, add, True)


def _greedy_by_count(units: _Units, dp: int, budget: int) -> np.ndarray:
    """Largest group first, to the rank with the fewest samples that has token room (else
    the fewest samples anywhere).

    The fallback when the cost-first greedy leaves a rank short of samples: with few
    samples per rank (m close to n / dp), counts, not costs, decide what is feasible.
    """
    _, ut, uc = units
    counts, tokens = [0] * dp, [0] * dp
    uc_l, ut_l = uc.tolist(), ut.tolist()

    def add(r: int, u: int) -> None:
        counts[r] += uc_l[u]
        tokens[r] += ut_l[u]

    order = np.lexsort((np.arange(uc.size), -ut, -uc)).tolist()
    return _least_with_room(order, ut_l, dp, budget, lambda r: (counts[r], tokens[r]), add,
                            False)[0]


def _least_with_room(order, unit_tokens, dp, budget, key, add, else_roomiest
                     ) -> tuple[np.ndarray, bool]:
    """Each unit in ``order`` to the rank of least ``(key(r), r)`` whose tokens stay within
    ``budget``; with no such rank, the roomiest (``else_roomiest``) or the least-keyed.
    ``add(r, u)`` books unit u on rank r (keys only grow). Also returns whether the budget
    bound: some rank it looked at had no room for a unit.

    Two heaps of (value, rank), stale entries skipped as they surface: by key, and by
    tokens, which says at once when no rank has room (samples at the cap leave none) —
    scanning every rank for every group took seconds at dp 1024. With a roomiest fallback,
    a rank met without room for a unit is parked (a third heap, most room first) until a
    unit it has room for comes: pushed straight back, ranks near their budget were popped
    again by every unit (~15 pops a unit, 0.1 s a placement at dp 1024). Without one, the
    least-keyed of all ranks may be picked, so none is parked.
    """
    out = np.empty(len(unit_tokens), dtype=np.int64)
    tokens = [0] * dp
    by_key = [(key(r), r) for r in range(dp)]
    by_tokens = [(0, r) for r in range(dp)]
    parked: list[tuple[int, int]] = []  # (-room when parked, rank); room only shrinks
    bound = False
    heapq.heapify(by_key)
    for u in order:
        t = unit_tokens[u]
        while parked and -parked[0][0] >= t:
            r = heapq.heappop(parked)[1]
            heapq.heappush(by_key, (key(r), r))
        while by_tokens[0][0] != tokens[by_tokens[0][1]]:
            heapq.heappop(by_tokens)
        room = by_tokens[0][0] + t <= budget
        bound |= not room
        if not room and else_roomiest:
            r = by_tokens[0][1]
        else:
            skipped = []
            while True:
                k, r = heapq.heappop(by_key)
                if k != key(r):
                    continue
                if not room or tokens[r] + t <= budget:
                    break
                bound = True
                if else_roomiest:
                    heapq.heappush(parked, (tokens[r] - budget, r))
                else:
                    skipped.append((k, r))
            for item in skipped:
                heapq.heappush(by_key, item)
        out[u] = r
        add(r, u)
        tokens[r] += t
        heapq.heappush(by_key, (key(r), r))
        heapq.heappush(by_tokens, (tokens[r], r))
    return out, bound


class _Seen:
    """The checks of a spread (see `_Spread`) that a lower budget or sample minimum could
    turn: the largest token total a check allowed, and the largest sample count left on a
    rank by a change refused for it alone."""

    def __init__(self) -> None:
        self.tokens, self.short = 0, -1

    def add(self, other: np.ndarray, most: np.ndarray, least: np.ndarray, budget: int,
            min_count: int) -> np.ndarray:
        """Record one kind of change (``other``: its conditions that do not depend on the
        budget or minimum; ``most``: the larger token total of its two ranks after it,
        ``least``: the smaller sample count); returns which are allowed."""
        fits = other & (most <= budget)
        ok = fits & (least >= min_count)
        if ok.any():
            self.tokens = max(self.tokens, int(most[ok].max()))
        refused = fits & ~ok
        if refused.any():
            self.short = max(self.short, int(least[refused].max()))
        return ok


def _sweep(
    rank_of_unit: np.ndarray,
    units: _Units,
    dp: int,
    budget: int,
    min_count: int,
    tol: float,
    fold: bool,
    seen: _Seen,
    by_cost: np.ndarray | None = None,
) -> int:
    """One sweep of group moves/swaps between paired ranks. Returns changes applied;
    ``seen`` records its checks. ``by_cost``: the groups by cost (`stable_order(units.cost)`),
    for `swap_partners`."""
    uq, ut, uc = units
    load = np.bincount(rank_of_unit, weights=uq, minlength=dp).astype(np.int64)
    tok = np.bincount(rank_of_unit, weights=ut, minlength=dp).astype(np.int64)
    cnt = np.bincount(rank_of_unit, weights=uc, minlength=dp).astype(np.int64)
    pairs = pair_ranks(load, tol, fold)
    if pairs is None:
        return 0
    a_ranks, b_ranks, gap, pair_a, pair_b = pairs

    pa_all = pair_a[rank_of_unit]
    ua = np.flatnonzero(pa_all >= 0)
    pa = pa_all[ua]
    qa, ta, ca = uq[ua], ut[ua], uc[ua]
    g = gap[pa]
    ra, rb = a_ranks[pa], b_ranks[pa]

    best_v = np.full(ua.size, -1, dtype=np.int64)  # -1: a move
    # The two ranks' tokens and samples once the group has gone from A to B: shared by the
    # move and the swaps (at 1-2k groups a sweep's time is mostly numpy calls).
    tok_b, tok_a = tok[rb] + ta, tok[ra] - ta
    cnt_a, cnt_b = cnt[ra] - ca, cnt[rb] + ca

    ok = seen.add((qa > 0) & (qa < g), tok_b, cnt_a, budget, min_count)
    err = np.abs(2 * qa - g)
    best_err = np.where(ok, err, _NONE)

    pb_all = pair_b[rank_of_unit]
    for v in swap_partners(pa, qa, g, pb_all, uq, int(gap.max()), by_cost):
        d = qa - uq[v]
        tv, cv = ut[v], uc[v]
        ok = seen.add((pb_all[v] == pa) & (d > 0) & (d < g), np.maximum(tok_b - tv, tok_a + tv),
                      np.minimum(cnt_a + cv, cnt_b - cv), budget, min_count)
        err = np.abs(2 * d - g)
        win = ok & (err < best_err)
        best_err[win] = err[win]
        best_v[win] = v[win]
    valid = np.flatnonzero(best_err < _NONE)
    if valid.size == 0:
        return 0
    pick = valid[first_min_per_pair(pa[valid], best_err[valid])]  # ties: lower group index
    u, v = ua[pick], best_v[pick]
    rank_of_unit[u] = rb[pick]
    swap = v >= 0
    rank_of_unit[v[swap]] = ra[pick][swap]
    return int(pick.size)


def _fix_counts(rank_of_unit: np.ndarray, units: _Units, dp: int, min_count: int) -> bool:
    """Give every rank at least ``min_count`` samples by moving small groups (in place).
    False if no rank can spare one more.

    Short ranks in order, each until it has enough; every move takes, from the ranks with
    the most samples, the cheapest group (ties by index) whose rank keeps ``min_count``.
    Heaps, not a pass over every group per move: a rank holding a sample far over a share
    gets nothing from the greedy and may need hundreds of groups (it stopped after 4·dp + 16
    moves, and the placement fell back to balancing sample counts: 1.2x the lower bound),
    and at dp 1,024 those passes took seconds.
    """
    uq, _, uc = units
    counts = np.bincount(rank_of_unit, weights=uc, minlength=dp).astype(np.int64).tolist()
    short = [r for r in range(dp) if counts[r] < min_count]
    if not short:
        return True
    cost, size = uq.tolist(), uc.tolist()
    order = np.lexsort((np.arange(uq.size), uq, rank_of_unit))  # by rank, cheapest first
    bounds = np.searchsorted(rank_of_unit[order], np.arange(dp + 1)).tolist()
    mine = [order[bounds[r] : bounds[r + 1]].tolist() for r in range(dp)]
    seen = [0] * dp  # mine[r][:seen[r]]: moved away, or more than r can spare (it only loses)
    heap: list[tuple[int, int, int, int]] = []  # (-count, cost, group, rank) of a rank's best

    def offer(r: int) -> None:
        groups, i = mine[r], seen[r]
        while i < len(groups) and (rank_of_unit[groups[i]] != r
                                   or counts[r] - size[groups[i]] < min_count):
            i += 1
        seen[r] = i
        if i < len(groups):
            heapq.heappush(heap, (-counts[r], cost[groups[i]], groups[i], r))

    for r in range(dp):
        offer(r)
    for r in short:
        while counts[r] < min_count:
            while heap:
                neg, _, u, d = heapq.heappop(heap)
                if -neg == counts[d] and rank_of_unit[u] == d and counts[d] - size[u] >= min_count:
                    break
                offer(d)  # stale: offer what the rank has now
            else:
                return False
            rank_of_unit[u] = r
            counts[d] -= size[u]
            counts[r] += size[u]
            offer(d)
        # r has enough now and may spare groups to the next ones: all of its groups again.
        mine[r] = sorted(np.flatnonzero(rank_of_unit == r).tolist(), key=lambda g: (cost[g], g))
        seen[r] = 0
        offer(r)
    return True


# `_split_counts`: groups, and ranks looked at in all, beyond which it gives up (a last
# resort for the few groups of tight inputs, kept to ~10 ms a call on this machine's CPU).
_SPLIT_MAX_GROUPS = 64
_SPLIT_MAX_STEPS = 10_000


def _split_counts(sizes: np.ndarray, dp: int, m: int) -> np.ndarray | None:
    """Each group's rank such that every rank holds at least ``m`` samples, by a bounded
    depth-first search (largest groups first; of the ranks with equal counts only one is
    tried), or None. Every sample beyond ``dp * m`` is slack: a placement that puts more
    than that over ``m`` in all would leave some rank short, so it is cut there."""
    if sizes.size > _SPLIT_MAX_GROUPS:
        return None
    order = np.argsort(-sizes, kind="stable").tolist()
    size = sizes.tolist()
    slack = sum(size) - dp * m
    counts, rank_of = [0] * dp, [0] * len(size)
    steps = 0

    def place(i: int, over: int) -> bool:
        nonlocal steps
        if i == len(order):
            return True  # over <= slack all along: no rank is short
        steps += dp
        if steps > _SPLIT_MAX_STEPS:
            return False
        s, tried = size[order[i]], set()
        for r in sorted(range(dp), key=counts.__getitem__):
            extra = max(0, counts[r] + s - m) - max(0, counts[r] - m)
            if counts[r] in tried or over + extra > slack:
                continue
            tried.add(counts[r])
            counts[r] += s
            rank_of[order[i]] = r
            if place(i + 1, over + extra):
                return True
            counts[r] -= s
        return False

    return np.array(rank_of, dtype=np.int64) if slack >= 0 and place(0, 0) else None


def place_groups(
    lens: np.ndarray,
    q: np.ndarray,
    groups: np.ndarray,
    dp: int,
    m: int,
    cap: int,
    short: int,
    tight: int = 0,
    by_count: bool = False,
    spreads: list[_Spread] | None = None,
) -> np.ndarray | str:
    """Micro-batches (ids ``rank * m + slot``) for grouped samples, or why not:
    "samples" when some rank cannot get ``m`` samples, "tokens" when some rank's samples do
    not pack into ``m`` micro-batches. ``short``: room to leave per micro-batch for the
    shortest samples (see `counts.start_m`). ``tight``: when not 0, before saying
    "tokens", try a best-fit packer and swaps of groups between ranks that pack at most this
    many samples in all (slower: for when no other ``m`` worked). ``by_count``: when the
    ranks cannot get ``m`` samples each within the token budget, place by count alone
    and let the packer judge (the very last resort). ``spreads``: the spreads of earlier
    calls with the same samples, groups, ``dp`` and ``cap`` (see `_Spread`), added to."""
    members, starts = members_of(groups, int(groups.max()) + 1)
    seg = starts[:-1]
    units = _Units(
        cost=np.add.reduceat(q[members], seg),
        tokens=np.add.reduceat(np.minimum(lens, cap)[members], seg),
        count=np.diff(starts),
    )
    budget = m * (cap - short + 1)
    known = next((x for x in spreads or [] if x.holds_for(budget, m)), None)
    if known is not None:
        rank_of_unit = known.rank_of_unit.copy()
    else:
        spread = _spread(units, dp, m, budget, by_count)
        if spread is None:
            return "samples"
        rank_of_unit = spread.rank_of_unit.copy()
        if spreads is not None and spread.reusable:
            spreads.append(spread)
    rank_of = np.empty(lens.size, dtype=np.int64)
    rank_of[members] = np.repeat(rank_of_unit, units.count)
    bin_of = _pack_ranks(lens, rank_of, dp, m, cap, bool(tight))
    if bin_of is None and tight:
        packs = _Packs(lens, members, starts, m, cap, tight)
        for r in range(dp):
            if not packs.fit(rank_of_unit == r) and not _repair(packs, rank_of_unit, r, units, dp, m):
                return "tokens"
        rank_of[members] = np.repeat(rank_of_unit, units.count)
        bin_of = _pack_ranks(lens, rank_of, dp, m, cap, True)
    return "tokens" if bin_of is None else bin_of


class _Spread(NamedTuple):
    """Groups spread over the ranks for ``m`` micro-batches each (`_spread`), before packing,
    and the other counts it is the spread for.

    A count enters the spread only through checks "a rank's tokens <= the budget" and "a
    rank's samples >= m". With a budget and an ``m`` no higher, every check comes out as it
    did, and so the spread, while the budget still covers the largest total a check allowed
    (``tokens``) and ``m`` is above the largest count a check refused (``short``). So
    `grouped_counts.place_grouped` trying fewer micro-batches spreads once, not once a count (64
    sweeps each at dp 1,024). Kept only where the greedy never lacked room and no rank was
    short (``reusable``): those steps are not recorded.
    """

    rank_of_unit: np.ndarray
    budget: int
    m: int
    tokens: int
    short: int
    reusable: bool

    def holds_for(self, budget: int, m: int) -> bool:
        return self.tokens <= budget <= self.budget and self.short < m <= self.m


def _spread(units: _Units, dp: int, m: int, budget: int, by_count: bool) -> _Spread | None:
    """Each group's rank for ``m`` micro-batches per rank within the token budget, or None
    when some rank cannot get ``m`` samples (see `place_groups`)."""
    rank_of_unit, bound = _greedy(units, dp, budget)
    # Without a rank lacking room, every token check the greedy passed totals at most what
    # the fullest rank ended with; without a short rank, `_fix_counts` moves nothing.
    greedy_tokens = int(np.bincount(rank_of_unit, weights=units.tokens, minlength=dp).max())
    reusable = not bound and int(np.bincount(rank_of_unit, weights=units.count,
                                             minlength=dp).min()) >= m
    counts_ok = _fix_counts(rank_of_unit, units, dp, m)
    if not counts_ok:
        rank_of_unit = _greedy_by_count(units, dp, budget)
        counts_ok = _fix_counts(rank_of_unit, units, dp, m)
    if not counts_ok and by_count:
        # The token budget is a guess at what packs; here the packer judges instead
        # (groups of 4, 3, 2 and 1 samples split 5/5 only over it).
        rank_of_unit = _greedy_by_count(units, dp, np.iinfo(np.int64).max)
        counts_ok = _fix_counts(rank_of_unit, units, dp, m)
        if not counts_ok:
            # Where the ranks need nearly every sample, counts are a number partition that
            # greedy moves miss: groups of {1,1,3,3,4,4,5,6,6} into 3 ranks of 11 (a fuzzer's);
            # Karmarkar-Karp over the groups' sizes finds most such splits, a search the rest.
            rank_of_unit = karmarkar_karp_labels(units.count, dp)
            counts_ok = _fix_counts(rank_of_unit, units, dp, m)
            exact = None if counts_ok else _split_counts(units.count, dp, m)
            if exact is not None:
                rank_of_unit, counts_ok = exact, True
    if not counts_ok:
        return None
    tol = _GROUP_REL_TOL * int(units.cost.sum()) / dp
    seen = _Seen()
    by_cost = stable_order(units.cost)  # the same for every sweep (`swap_partners`)
    for sweep in range(MAX_SWEEPS):
        if _sweep(rank_of_unit, units, dp, budget, m, tol, sweep % 2 == 0, seen, by_cost) == 0:
            break
    return _Spread(rank_of_unit, budget, m, max(seen.tokens, greedy_tokens), seen.short, reusable)


def _pack_rank(
    lens: np.ndarray, m: int, cap: int, tight: bool, max_rounds: int = MAX_ROUNDS
) -> np.ndarray | None:
    """One rank's samples into ``m`` micro-batches under the cap, or None."""
    bins, _ = pack_tokens(lens, m, cap, max_rounds=max_rounds)
    if bins is None and tight:  # levelling fills can strand a sample that a tight fit would place
        bins = best_fit_pack(lens, m, cap, longest_first(lens))
    return bins


def _pack_ranks(
    lens: np.ndarray, rank_of: np.ndarray, dp: int, m: int, cap: int, tight: bool
) -> np.ndarray | None:
    """Micro-batch ids (``rank * m + slot``) of every sample, or None if a rank fails."""
    # The ranks share one packing's rounds: with rounds of a few samples each, 64 ranks of
    # 1,000 short samples in 9 micro-batches took 16,000 numpy rounds (130 ms). Fewer,
    # larger water-filled rounds still level the fills: in 69 random grouped cases the
    # makespans moved by -0.3% to +0.3% (mean 0.000%) against 512 rounds per rank.
    # A tight try packs as `_Packs.fit` judged each rank: with the full rounds (fewer can
    # fail where more succeed, and the other way round).
    rounds = MAX_ROUNDS if tight else max(_RANK_ROUNDS, MAX_ROUNDS // dp)
    # Most ranks at once from _BATCH_MIN_DP: 64 ranks of 64 samples 8.5 -> 1.3 ms.
    slots = pack_each_rank(lens, rank_of, dp, m, cap, rounds,
                           lambda mine: _pack_rank(mine, m, cap, tight, rounds),
                           batched=dp >= _BATCH_MIN_DP)
    return None if slots is None else rank_of * m + slots


class _Packs:
    """Whether groups pack together into ``m`` micro-batches, remembered; packs at most
    ``budget`` samples in all (then every new question is answered False)."""

    def __init__(
        self, lens: np.ndarray, members: np.ndarray, starts: np.ndarray, m: int, cap: int,
        budget: int,
    ):
        self.lens, self.members, self.starts, self.m, self.cap = lens, members, starts, m, cap
        self.left = budget
        self._known: dict[bytes, bool] = {}

    def fit(self, chosen: np.ndarray) -> bool:
        """Whether the groups where ``chosen`` is True (or the group ids in it) pack."""
        units = np.flatnonzero(chosen) if chosen.dtype == bool else np.sort(chosen)
        key = units.tobytes()
        if key not in self._known:
            sizes = np.diff(self.starts)[units]
            if self.left < sizes.sum():
                return False
            self.left -= int(sizes.sum())
            first = np.repeat(self.starts[units] - np.cumsum(sizes) + sizes, sizes)
            idx = np.sort(self.members[first + np.arange(first.size)])
            self._known[key] = _pack_rank(self.lens[idx], self.m, self.cap, True) is not None
        return self._known[key]


def _repair(
    packs: _Packs,
    rank_of_unit: np.ndarray,
    r: int,
    units: _Units,
    dp: int,
    min_count: int,
) -> bool:
    """Make rank ``r`` pack by moving one of its groups to another rank, or swapping one for
    a smaller group there, such that both ranks pack and keep ``min_count`` samples.

    Placement balances cost under a token budget, which does not see how samples fit
    together: three samples pairwise over the cap need three micro-batches whatever their
    total. Only tight inputs get here (a few samples per micro-batch, no more micro-batches
    allowed); feasibility comes first, so balance is not checked. False if nothing works
    within the packer's sample budget.
    """
    _, ut, uc = units
    units_of = [np.flatnonzero(rank_of_unit == s) for s in range(dp)]
    mine = units_of[r][np.lexsort((units_of[r], -ut[units_of[r]]))]  # most tokens first
    if uc[mine[0]] > packs.m and not packs.fit(mine[:1]):
        return False  # its largest group alone does not pack: no move or swap helps
    # (With m samples or fewer a group packs alone, one sample per micro-batch; the packer
    # asks for m non-empty ones, so it is not asked.)
    cnt = np.bincount(rank_of_unit, weights=uc, minlength=dp).astype(np.int64)
    tok = np.bincount(rank_of_unit, weights=ut, minlength=dp).astype(np.int64)
    others = [s for s in np.argsort(tok, kind="stable").tolist() if s != r]
    for u in mine.tolist():
        for s in others:
            theirs = units_of[s]
            for v in [-1] + theirs[ut[theirs] < ut[u]].tolist():  # -1: a move
                packs.left -= 1  # a look costs a sample of budget: bounded even if none packs
                if packs.left <= 0:
                    return False
                give = uc[u] - (uc[v] if v >= 0 else 0)  # samples r hands to s, net
                if cnt[r] - give < min_count or cnt[s] + give < min_count:
                    continue
                rank_of_unit[u] = s
                if v >= 0:
                    rank_of_unit[v] = r
                if packs.fit(rank_of_unit == r) and packs.fit(rank_of_unit == s):
                    return True
                rank_of_unit[u] = r
                if v >= 0:
                    rank_of_unit[v] = s
    return False
