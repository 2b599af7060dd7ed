"""Packing by tokens, then micro-batches to ranks by cost (the fast path: no groups).

`pack_tokens` fills exactly ``dp × m`` micro-batches under the token cap, levelling their
fills (longest-processing-time by tokens, in vectorised rounds); `assign_bins` hands each
rank ``m`` of them, balancing their true costs (Karmarkar-Karp for few micro-batches per
rank, rounds of longest-processing-time for many). `refine.local_search` then moves and
swaps single samples between ranks to even out what whole micro-batches could not.

Why this order: packing first makes the cap hold by construction and keeps every
micro-batch about equally full (so each pays its fixed cost for a full load of tokens and
runs its GEMMs at the same efficiency); balancing afterwards at the sample level has far
finer granularity than balancing whole micro-batches (slime's pack-then-distribute stops
there). All loops are over rounds, not samples: a few dozen numpy calls in all.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from costmodel.scheduler.partition import karmarkar_karp_labels
from costmodel.scheduler.sorting import longest_first, stable_order

__all__ = [
    "BestFit", "assign_bins", "best_fit_decreasing", "best_fit_pack", "pack_tokens", "rank_makespan",
    "search_pack", "spread_best_fit", "tight_pack",
]

# Up to this many micro-batches per rank, ranks are balanced with Karmarkar-Karp.
_KK_MAX_ROUNDS = 64
# Past that, rounds of longest-processing-time; up to this many ranks a round runs on lists.
_LIST_ROUNDS_MAX_DP = 8
# At most about this many rounds of level filling in `pack_tokens` (see there).
MAX_ROUNDS = 512


def pack_tokens(
    lengths: np.ndarray,
    k: int,
    cap: int,
    order: np.ndarray | None = None,
    *,
    max_rounds: int = MAX_ROUNDS,
) -> tuple[np.ndarray | None, int]:
    """Pack samples into exactly ``k`` non-empty micro-batches under the cap, by tokens.

    Longest first (``order``: the samples longest first, ties by index, if the caller has
    it). Samples over the cap each take an empty micro-batch of their own. The rest go in
    rounds: each round hands the next samples, longest first, to the emptiest half of the
    micro-batches, emptiest first — longest-processing-time by tokens, which levels the
    fills (a level fill keeps every micro-batch's GEMMs at the same efficiency and leaves
    room everywhere for the balancing swaps that follow). Samples that do not fit where
    their round put them wait; at the end they go, longest first, to the micro-batches with
    the most room, in rounds, as long as any fits.

    ``max_rounds``: about how many rounds short samples may take (see `_pack_tokens`); a
    caller packing many ranks one by one shares `MAX_ROUNDS` among them.

    Returns ``(micro-batch of each sample, 0)``, or ``(None, tokens that did not fit)``.
    """
    if k == 1 and lengths.size and (lengths.size == 1 or int(lengths.sum()) <= cap):
        # One micro-batch that holds them all: the rounds below would take up to
        # MAX_ROUNDS numpy passes to find that (13 ms for 1,000 short samples; grouped
        # placement packs each rank on its own, so 64 ranks of them took 0.86 s).
        return np.zeros(lengths.size, dtype=np.int64), 0
    if order is None:
        order = longest_first(lengths)
    bins, left, leveled, watered = _pack_tokens(lengths, k, cap, order, max_rounds=max_rounds)
    if bins is None and watered:
        # Water-filling the waiting samples can strand one that pairing would place, where
        # rooms are tight (1 in ~40,000 fuzzed inputs): those retry with pairing alone.
        bins, left, leveled, _ = _pack_tokens(lengths, k, cap, order, max_rounds=max_rounds,
                                              water=False)
    if bins is None and leveled:
        # Water-filled rounds can fail on a cap with no room to spare where one sample per
        # round fits (5 of 5000 fuzzed inputs): those few retry the slow way.
        bins, left, _, _ = _pack_tokens(lengths, k, cap, order, max_rounds=0, water=False)
    return bins, left


def _pack_tokens(
    lengths: np.ndarray, k: int, cap: int, order: np.ndarray, *, max_rounds: int,
    water: bool = True,
) -> tuple[np.ndarray | None, int, bool, bool]:
    """`pack_tokens`, whether a `_level_round` ran in the rounds (never with ``max_rounds``
    0), and whether waiting samples were water-filled (never without ``water``)."""
    n = lengths.size
    lo = lengths[order]
    n_over = int((lo > cap).sum())
    leveled = False
    if n_over > k or n < k:
        return None, int(lo[k:].sum()) if n_over > k else 0, leveled, False
    fill = np.zeros(k, dtype=np.int64)
    bin_sorted = np.full(n, -1, dtype=np.int64)
    bin_sorted[:n_over] = np.arange(n_over)
    fill[:n_over] = lo[:n_over]
    # The micro-batches rounds may choose: all but the closed (oversized) ones.
    open_ids = np.arange(n_over, k, dtype=np.int64)
    open_bins = k - n_over
    if open_bins == 0 and n > n_over:
        return None, int(lo[n_over:].sum()), leveled, False  # all hold an oversized one
    # First round: the open_bins longest samples, one into each empty micro-batch.
    first = min(open_bins, n - n_over)
    bin_sorted[n_over : n_over + first] = open_ids[:first]
    fill[n_over : n_over + first] = lo[n_over : n_over + first]
    half = max(1, open_bins // 2)
    waiting: list[np.ndarray] = []
    pos = n_over + first
    # Many short samples per micro-batch (a few micro-batches for thousands of samples):
    # rounds of `half` would be thousands of numpy passes (0.3 s for 65k one-token samples
    # in 4). So once a round of `many` samples (enough for at most MAX_ROUNDS rounds)
    # exceeds the open micro-batches and its longest sample is at most an even share of
    # its tokens (short samples: each micro-batch gets several), the round water-fills the
    # emptiest micro-batches instead (`_level_round`); a long sample's round stays one each.
    many = -(-(n - pos) // max_rounds) if max_rounds > 0 else 0
    while pos < n:
        c = min(many, n - pos)
        if c > open_bins and int(lo[pos]) * open_bins <= int(lo[pos : pos + c].sum()):
            leveled = True
            placed = np.arange(pos, pos + c)
            ok = _level_round(lo[pos : pos + c], placed, fill, open_ids, bin_sorted, cap)
            if not ok.all():
                waiting.append(placed[~ok])
            pos += c
            continue
        c = min(half, n - pos)
        sel = _emptiest_first(fill, open_ids)[:c]
        chunk = lo[pos : pos + c]
        f = fill[sel]
        ok = f + chunk <= cap
        placed = np.arange(pos, pos + c)
        if not ok.all():
            waiting.append(placed[~ok])
            sel, chunk, f, placed = sel[ok], chunk[ok], f[ok], placed[ok]
        fill[sel] = f + chunk
        bin_sorted[placed] = sel
        pos += c
    watered = False
    if waiting:
        all_placed, watered = _place_waiting(lo, np.concatenate(waiting), fill, open_ids,
                                             bin_sorted, cap, water)
        if not all_placed:
            return None, int(lo[bin_sorted < 0].sum()), leveled, watered
    bin_of = np.empty(n, dtype=np.int64)
    bin_of[order] = bin_sorted
    return bin_of, 0, leveled, watered


def _emptiest_first(fill: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Micro-batches ``ids`` (ascending) emptiest first, ties by id. One stable sort by
    fill: a radix sort where fills fit 16 bits (caps under 65,536), 9x faster than the
    partition and sort of keys fill · k + id it replaces (13,000 micro-batches: 0.05 ms
    against 0.47 ms a round, and 65,536 samples take ~50 rounds a schedule)."""
    return ids[stable_order(fill[ids])]


def _place_waiting(lo, rest, fill, open_ids, bin_sorted, cap, water) -> tuple[bool, bool]:
    """Place the samples their round left waiting (sorted positions ``rest``, longest
    first): in passes, each to the micro-batch with the most room (of ``open_ids``), as long
    as any fits.
    Where few micro-batches have room for many (half the samples at the cap, the rest of a
    few tokens: one pass placed as many as there were such micro-batches, 2 s for 65,536
    samples), they are water-filled into those instead, if ``water``. Returns (all placed,
    water-filled)."""
    watered = False
    if int(lo[rest].sum()) > int((cap - fill[open_ids]).sum()):
        return False, watered
    while rest.size:
        room = cap - fill[open_ids]
        useful = room >= lo[rest[-1]]  # could take the shortest waiting sample
        roomiest = open_ids[useful][np.lexsort((open_ids[useful], -room[useful]))]
        if not roomiest.size or lo[rest[0]] > cap - fill[roomiest[0]]:
            return False, watered  # the longest fits nowhere, and rooms only shrink
        c = min(rest.size, roomiest.size)
        ok = lo[rest[:c]] <= cap - fill[roomiest[:c]]
        # Over twice as many waiting as micro-batches with room, or a pass that would place
        # under half of those it pairs: water-fill.
        if water and (2 * int(ok.sum()) < c or c < rest.size // 2):
            watered = True
            # Only those with room take part.
            ok = _level_round(lo[rest], rest, fill, np.sort(roomiest), bin_sorted, cap)
            if not ok.any():  # cannot happen (the longest fits the emptiest): no endless loop
                return False, watered
            rest = rest[~ok]
            continue
        b = roomiest[:c][ok]
        fill[b] += lo[rest[:c][ok]]
        bin_sorted[rest[:c][ok]] = b
        rest = np.concatenate([rest[:c][~ok], rest[c:]])
    return True, watered


def _level_round(
    chunk: np.ndarray,
    placed: np.ndarray,
    fill: np.ndarray,
    open_ids: np.ndarray,
    bin_sorted: np.ndarray,
    cap: int,
) -> np.ndarray:
    """Deal ``chunk`` (samples longest first, at sorted positions ``placed``) to the open
    micro-batches ``open_ids`` (ascending) by water-filling: find the level T to which the
    chunk's tokens raise the emptiest ones (Σ max(0, T − fill) = the chunk's tokens), lay
    the samples end to end over those deficits, emptiest first, and give each sample to the
    micro-batch where it starts. Fills end level to within a sample; fuller micro-batches
    (one long sample) get nothing until the others catch up. A sample that would overflow
    its micro-batch is left out (False in the result), and so are the later ones dealt to
    it (their running sums are larger still). Updates ``fill`` and ``bin_sorted`` in place."""
    sel = _emptiest_first(fill, open_ids)
    sel_fill = fill[sel]
    f = sel_fill.astype(np.float64)
    ends = np.cumsum(chunk)
    total = float(chunk.sum())
    # Level with the j emptiest: T_j = (total + Σ_{i<j} f_i) / j; the right j is the last
    # whose level reaches its own fill (fills ascending, so those j form a prefix).
    levels = (total + np.cumsum(f)) / np.arange(1, f.size + 1)
    j = int(np.flatnonzero(levels >= f)[-1])
    deficits = np.maximum(levels[j] - f, 0.0)
    starts = ends - chunk
    slot = np.minimum(np.searchsorted(np.cumsum(deficits), starts, side="right"), f.size - 1)
    first = np.searchsorted(slot, slot, side="left")  # each sample's first chunk mate in its slot
    ok = sel_fill[slot] + ends - starts[first] <= cap
    b = sel[slot[ok]]
    np.add.at(fill, b, chunk[ok])
    bin_sorted[placed[ok]] = b
    return ok


class BestFit(NamedTuple):
    """A best-fit decreasing packing with as many micro-batches as it needed: sample i in
    ``bins[i]``, ``members[b]`` the samples of micro-batch b (samples over the cap first,
    one each)."""

    bins: np.ndarray
    members: list[list[int]]


def best_fit_decreasing(
    lengths: np.ndarray, cap: int, order: np.ndarray, max_bins: int | None = None
) -> BestFit | None:
    """Each sample, longest first (``order``), where it leaves the least room under the
    cap, in a new micro-batch when none has room; one over the cap takes one of its own.
    None as soon as more than ``max_bins`` would be needed.

    The count it reaches is where `best_fit_pack` starts to succeed: with ``k`` micro-batches
    given up front, an empty one is the roomiest, so best fit takes one exactly where this
    opens one. A loop over samples (rooms kept sorted as one integer each, room · n + id).
    """
    import bisect

    n = lengths.size
    n_over = int((lengths > cap).sum())
    limit = n if max_bins is None else max_bins
    if n_over > limit:
        return None
    bins = [0] * n
    members: list[list[int]] = [[] for _ in range(n_over)]
    rooms: list[int] = []  # room * n + micro-batch, sorted
    # A room under the shortest sample can never be used: left out, the list stays short.
    shortest = int(lengths.min()) if n else 0
    over = 0
    # Python ints from one tolist, not a numpy scalar read and write per sample (2,048
    # bimodal samples: 1.94 -> 1.29 ms).
    for i, length in zip(order.tolist(), lengths[order].tolist()):
        if length > cap:
            b, over = over, over + 1
        else:
            pos = bisect.bisect_left(rooms, length * n)
            if pos == len(rooms):
                if len(members) == limit:
                    return None
                b, room = len(members), cap
                members.append([])
            else:
                key = rooms.pop(pos)
                b, room = key % n, key // n
            if room - length >= shortest:
                bisect.insort(rooms, (room - length) * n + b)
        bins[i] = b
        members[b].append(i)
    return BestFit(np.array(bins, dtype=np.int64), members)


def spread_best_fit(packed: BestFit, k: int, lengths: np.ndarray) -> np.ndarray | None:
    """``packed`` as exactly ``k`` non-empty micro-batches, or None (it needed more, or there
    are fewer than k samples): each micro-batch beyond its own takes the shortest sample of
    one holding several (a sample moved out only makes room). ``packed`` is left as it was."""
    if len(packed.members) > k or lengths.size < k:
        return None
    bins = packed.bins.copy()
    if len(packed.members) == k:
        return bins
    members = list(packed.members)  # a donor's list is copied before it changes
    sizes = np.fromiter(map(len, members), dtype=np.int64, count=len(members))
    donors = np.flatnonzero(sizes > 1)
    donors = donors[np.argsort(-sizes[donors], kind="stable")].tolist()  # most samples first
    next_donor = 0
    for b in range(len(packed.members), k):
        while len(members[donors[next_donor]]) < 2:
            next_donor += 1
        d = donors[next_donor]
        if members[d] is packed.members[d]:
            members[d] = list(members[d])
        i = min(members[d], key=lambda j: (int(lengths[j]), j))
        members[d].remove(i)
        bins[i] = b
    return bins


def best_fit_pack(lengths: np.ndarray, k: int, cap: int, order: np.ndarray) -> np.ndarray | None:
    """Exactly ``k`` non-empty micro-batches under the cap by best-fit decreasing, or None.

    The fallback when `pack_tokens` fails and no more micro-batches are allowed: levelling
    fills can strand a sample that fits only by filling some micro-batches to the brim
    (caps of a few samples each). Only failures get here.
    """
    packed = best_fit_decreasing(lengths, cap, order, max_bins=k)
    return None if packed is None else spread_best_fit(packed, k, lengths)


# `search_pack` takes inputs of at most this many samples, and gives up after this many
# placements (tens of milliseconds): tiny tight inputs only.
_SEARCH_MAX_SAMPLES = 32
_SEARCH_PLACEMENTS = 20_000


class _OutOfPlacements(Exception):
    pass


def search_pack(
    lengths: np.ndarray,
    k: int,
    cap: int,
    order: np.ndarray,
    groups: np.ndarray | None = None,
    per_rank: int = 1,
) -> np.ndarray | None:
    """Exactly ``k`` non-empty micro-batches under the cap by depth-first search, or None
    (none exists, or none found within the search's bound, or too many samples to try).

    After `best_fit_pack`, for a handful of samples in a handful of micro-batches: best fit
    strands a sample where only an exact fill works (four 10s and 5, 4, 3, 3, 3, 2 in six
    micro-batches of 10 need {5, 3, 2} and {4, 3, 3}). Samples go longest first (``order``),
    each into every micro-batch it fits, one of each fill (micro-batches equally full are
    interchangeable); a sample over the cap takes an empty micro-batch of its own.

    ``groups`` (dense group ids): micro-batch ``b`` belongs to rank ``b // per_rank``, and
    a group's samples all go to one rank (the last resort of grouped placement). Then
    micro-batches are interchangeable only within a rank, and ranks only while empty.
    """
    n = lengths.size
    if n > _SEARCH_MAX_SAMPLES or n < k:
        return None
    items = [int(lengths[i]) for i in order.tolist()]
    gids = [-1] * n if groups is None else [int(groups[i]) for i in order.tolist()]
    fill = [0] * k
    closed = [False] * k  # holds a sample over the cap
    where = [0] * n
    rank_count = [0] * (k // per_rank + 1)  # samples placed in each rank
    group_rank: dict[int, int] = {}  # rank of each group with a sample placed
    room_needed = [0] * (n + 1)  # tokens of the samples from j on that fit the cap
    for j in range(n - 1, -1, -1):
        room_needed[j] = room_needed[j + 1] + (items[j] if items[j] <= cap else 0)
    room = [k * cap]  # room left in the micro-batches not closed, kept as samples move
    budget = [_SEARCH_PLACEMENTS]

    def place(j: int, empty: int) -> bool:
        if n - j < empty:  # too few samples left to fill the empty micro-batches
            return False
        if j == n:
            return True
        if room_needed[j] > room[0]:
            return False
        budget[0] -= 1
        if budget[0] < 0:
            raise _OutOfPlacements
        x, g = items[j], gids[j]
        fixed = group_rank.get(g, -1) if groups is not None else -1
        tried: set[tuple[int, int]] = set()
        for b in range(k):
            f, r = fill[b], b // per_rank if groups is not None else 0
            if closed[b] or (x > cap and f) or (x <= cap and f + x > cap):
                continue
            if fixed >= 0 and r != fixed:
                continue
            key = (r if rank_count[r] else -1, f)  # empty ranks are interchangeable
            if key in tried:
                continue
            tried.add(key)
            taken = cap if x > cap else x  # an over-cap sample closes an empty micro-batch
            fill[b], closed[b], where[j] = f + x, x > cap, b
            room[0] -= taken
            rank_count[r] += 1
            if groups is not None and fixed < 0:
                group_rank[g] = r
            if place(j + 1, empty - (f == 0)):
                return True
            fill[b], closed[b] = f, False
            room[0] += taken
            rank_count[r] -= 1
            if groups is not None and fixed < 0:
                del group_rank[g]
        return False

    try:
        found = place(0, k)
    except _OutOfPlacements:
        return None
    if not found:
        return None
    bins = np.empty(n, dtype=np.int64)
    bins[order] = where
    return bins


def rank_makespan(rank_of_bin: np.ndarray, bin_q: np.ndarray, dp: int) -> int:
    """The most any rank carries of micro-batches of costs ``bin_q`` on ranks ``rank_of_bin``."""
    return int(np.bincount(rank_of_bin, weights=bin_q, minlength=dp).max())


def assign_bins(bin_q: np.ndarray, dp: int, m: int) -> np.ndarray:
    """Spread ``dp * m`` micro-batches over ranks, ``m`` each, balancing their costs.

    Karmarkar-Karp with equal set sizes when ``m`` is small (where it beats greedy by a
    wide margin and costs ``m`` merges); with many micro-batches per rank,
    longest-processing-time in rounds of ``dp`` (costliest of a round to the least-loaded
    rank), which is as good there and linear. Returns the rank of each micro-batch.
    """
    k = dp * m
    if dp == 1:
        return np.zeros(k, dtype=np.int64)
    if m <= _KK_MAX_ROUNDS:
        return karmarkar_karp_labels(bin_q, dp, equal_size=True)
    rank_of_bin = np.empty(k, dtype=np.int64)
    order = np.lexsort((np.arange(k), -bin_q))
    if dp <= _LIST_ROUNDS_MAX_DP:  # a numpy call per round costs more than the round
        q, load, ranks_in_order = bin_q[order].tolist(), [0] * dp, []
        for t in range(0, k, dp):
            ranks = sorted(range(dp), key=load.__getitem__)  # stable: as np.argsort below
            for j, r in enumerate(ranks):
                load[r] += q[t + j]
            ranks_in_order += ranks
        rank_of_bin[order] = ranks_in_order
        return rank_of_bin
    rank_load = np.zeros(dp, dtype=np.int64)
    for t in range(m):
        by_load = np.argsort(rank_load, kind="stable")
        b = order[t * dp : (t + 1) * dp]
        rank_of_bin[b] = by_load
        rank_load[by_load] += bin_q[b]
    return rank_of_bin


def tight_pack(lengths: np.ndarray, k: int, cap: int, order: np.ndarray) -> np.ndarray | None:
    """The packers for when levelling fails and no more micro-batches are allowed:
    `best_fit_pack`, then, for a handful of samples, `search_pack` (up to ~30 ms: called
    once or twice per schedule; grouped placement, which packs many candidate ranks,
    keeps to best fit there and searches, with groups, only as its last resort)."""
    bins = best_fit_pack(lengths, k, cap, order)
    return bins if bins is not None else search_pack(lengths, k, cap, order)
