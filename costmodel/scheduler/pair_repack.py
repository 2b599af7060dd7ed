"""Re-split two ranks' groups and pack both again (grouped samples, few groups per rank).

`group_search` moves and swaps whole groups piece by piece into micro-batches that already
hold samples. With a few groups per rank (groups of 16 RL responses, 4-6 of them on a
rank) a group fills most of a rank's micro-batches, the level fills leave no micro-batch
room for another piece, and the search stops with ranks ~1% apart where samples alone
balance within 0.02%. This pass lifts that limit for the most loaded rank A and the
least loaded ranks B: pool their groups and list every split of them in two (up to
`MAX_POOLED` groups: 2**12 splits, their sums by doubling; a pair with more, up to
`MAX_POOLED` a rank, lists the splits of its `MAX_POOLED` largest groups, the rest staying
where they are: `_pooled`); of the splits that give each side
at least ``m`` samples and tokens that fit, pack the few whose sides would cost least if
levelled, each side from scratch into its ``m`` micro-batches (`pack.pack_tokens`: the cap
holds by construction), and price its ``m`` micro-batches exactly (a side at the best pair
maximum so far or above rules its split out before the other is packed). The split with the
lowest pair maximum is applied if it lowers A's load (B stays below A's old load, so the
makespan never rises); then the most loaded rank again. Additive and separable costs only
(`BinState.priced`, as `group_search`). All sums are of integers under 2**53: the same
result on every process. Groups of 16 at 4 per rank (rl and bimodal, n 1-4k, dp 16-64,
seed 0, the H200 profile): max/mean 1.006-1.026 -> 1.003-1.013, for 8-24 ms more. At dp
256-1024 the tries run out first: 1.012-1.047 -> 1.006-1.021.
"""

from __future__ import annotations

import numpy as np

from costmodel.scheduler.pack import pack_tokens
from costmodel.scheduler.refine import BinState
from costmodel.scheduler.sorting import members_of, subset_sums

__all__ = ["MAX_POOLED", "pair_repack"]

# Groups two ranks may hold together for their splits to be listed (2**MAX_POOLED of them).
MAX_POOLED = 12
# Splits packed and priced per pair, light ranks tried per heavy rank, and pairs tried in
# all: bounds the time (a pair's two packs take 0.3-2 ms). Four splits instead of two, or
# 16 partners instead of 8, bought under 0.1% on the cases above for 2x the time.
_SPLITS = 2
_PARTNERS = 8
_MAX_TRIES = 64
# What a try of a pair with MAX_POOLED + 1 to 2 * MAX_POOLED groups counts towards its pass's
# _MAX_TRIES (16 such tries at most): one lists a subset's splits (`_pooled`), and past the
# first few they bought little. Groups of 4-8 RL responses at 8 a rank (48 batches: n
# 256-2,048, dp 8-64, rl and bimodal, train and forward, the H200 profile), against no
# subsets: with 64 such tries makespans 0.73% lower on average (at most 2.98%) for 2.6x
# the time (median; at most 145 ms); with 16, 0.66% lower (at most 2.61%) for 2.4x (at
# most 69 ms; measured as one pass with the others, the same with two).
_SUBSET_TRY = 4
# Rounds of level filling a side's first packing may take (all of them if that fails), as
# grouped placement packs its ranks: the default rounds put one sample per round into 2-4
# micro-batches, ~1 ms for 100 samples (fuzzed: 19 -> 200 ms; with 4, 60 ms).
_ROUNDS = 4
# Stop once the most loaded rank is this close to the mean: little is left to gain, and a
# try costs milliseconds (a fuzzed case at 1.00016 took 150 ms more for 0.015%).
_BALANCED = 2e-4


def pair_repack(st: BinState, groups: np.ndarray) -> int:
    """Re-split and re-pack heavy/light rank pairs of ``st`` (``groups[i]``: sample i's dense
    group id) while that lowers the most loaded rank; returns the pairs changed.

    Two passes: pairs of at most `MAX_POOLED` groups (every split listed), then pairs of
    more, up to twice that (a subset's splits, `_pooled`). The second starts where the first
    ended and only lowers the most loaded rank, so no schedule ends above what the first pass
    alone gives: interleaved, a large re-split taken early led the greedy elsewhere, and 45
    of 11,798 fuzzed grouped schedules ended up to 1.35% above (a review's)."""
    if not (st.additive or st.separable):
        return 0
    # Each side packed so far, by its lengths (samples ascending): a heavy rank's tries with
    # its partners pack the same side again and again (at n 16-65k, groups of 16, 40-50% of
    # the packings were repeats). A packing depends on the lengths, ``m`` and cap alone.
    packed: dict[bytes, np.ndarray | None] = {}
    return sum(_pass(st, groups, packed, subsets) for subsets in (False, True))


def _pass(st: BinState, groups: np.ndarray, packed: dict[bytes, np.ndarray | None],
          subsets: bool) -> int:
    """One pass of `pair_repack`: pairs of at most `MAX_POOLED` groups (the heavy rank
    fewer), or with ``subsets`` those of `MAX_POOLED` + 1 to twice that (the heavy rank at
    most `MAX_POOLED`), each such try counting `_SUBSET_TRY`."""
    changed = tries = 0
    members: list[np.ndarray] | None = None  # each rank's samples, ascending (`_by_rank`)
    own_most = MAX_POOLED if subsets else MAX_POOLED - 1  # with any partner's group: too many
    while tries < _MAX_TRIES and st.load.max() * st.dp > st.load.sum() * (1 + _BALANCED):
        by_load = np.lexsort((np.arange(st.dp), -st.load))
        heavy = int(by_load[0])
        if members is None:
            members = np.split(*_by_rank(st))
        own = np.unique(groups[members[heavy]]).size
        if own > own_most:
            return changed  # small groups: `group_search` moves their pieces
        for light in by_load[::-1][: min(_PARTNERS, st.dp - 1)].tolist():
            if subsets and not (MAX_POOLED < own + np.unique(groups[members[light]]).size
                                <= 2 * MAX_POOLED):
                continue  # the first pass's pair, or too many groups to list
            tries += _SUBSET_TRY if subsets else 1
            if _repack(st, groups, members, heavy, light, packed,
                       2 * MAX_POOLED if subsets else MAX_POOLED):
                changed += 1
                break
        else:
            return changed
    return changed


def _by_rank(st: BinState) -> tuple[np.ndarray, np.ndarray]:
    """The samples by rank (ascending within one), and where each rank's but the first
    starts: once a search, not a pass over every sample per try (64 tries at 65,536 samples
    took ~25 ms in such passes)."""
    order, bounds = members_of(st.bin_of // st.m, st.dp)
    return order, bounds[1:-1]


def _repack(st: BinState, groups: np.ndarray, members: list[np.ndarray], a: int, b: int,
            packed: dict[bytes, np.ndarray | None], most: int = 2 * MAX_POOLED) -> bool:
    """Apply the best re-split of ranks ``a`` and ``b`` (``members``: each rank's samples,
    ascending; kept up to date) if it lowers ``a``'s load; none where they hold more than
    ``most`` groups. ``packed``: the sides packed before (`_pack_side`), added to."""
    m, cap = st.m, st.cap
    if a == b:
        return False  # no pair (and no split lowers a rank's load by moving within it)
    samples = np.sort(np.concatenate([members[a], members[b]]))
    local, group_of = np.unique(groups[samples], return_inverse=True)
    g = local.size
    if not 2 <= g <= most:
        return False
    lengths = st.lengths[samples]

    def per_group(values: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(group_of, weights=values, minlength=g)

    count, part, length = per_group(), per_group(st.part[samples]), per_group(lengths)
    clipped = per_group(np.minimum(lengths, cap))  # an oversized sample fills one micro-batch
    now_a = np.zeros(g, dtype=bool)  # each group's side as placed
    now_a[group_of[st.bin_of[samples] // m == a]] = True
    free = _pooled(now_a, clipped)
    # Every split of the pooled groups (bit j of a mask puts the j-th on rank a), the others
    # where they are: what side a holds of each sum, one entry per mask. Sums of integers
    # under 2**53 (float): exact in any order.
    per = np.stack([count, clipped, part, length])
    kept = np.where(now_a, 1.0, 0.0)
    kept[free] = 0.0
    on_a = subset_sums(per[:, free]) + (per @ kept)[:, None]
    n_a, c_a, p_a, l_a = on_a
    fits = (n_a >= m) & (count.sum() - n_a >= m) & (c_a <= m * cap) & (clipped.sum() - c_a <= m * cap)
    fits[int((now_a[free].astype(np.int64) << np.arange(free.size)).sum())] = False  # as it is
    cand = np.flatnonzero(fits)
    if cand.size == 0:
        return False
    # Each side's cost as a level fill would make it: packing is what costs time, so only
    # the splits this puts lowest are packed and priced.
    p_a, l_a = p_a[cand], l_a[cand]
    est_a = _level_cost(st, p_a, l_a)
    est_b = _level_cost(st, part.sum() - p_a, length.sum() - l_a)
    cheapest = _lowest(np.maximum(est_a, est_b), _SPLITS)
    bins = (a * m + np.arange(m), b * m + np.arange(m))
    best_max, best = int(st.load[a]), None  # best: (each sample's micro-batch, their costs)
    for i in cheapest.tolist():
        on = now_a.copy()
        on[free] = (int(cand[i]) >> np.arange(free.size)) & 1
        to_a = on[group_of]
        sides = [(to_a, 0, est_a[i]), (~to_a, 1, est_b[i])]
        # A side that costs the best maximum or more rules the split out, the other side
        # unpacked (a quarter of the packings on grouped batches, for the same result): one
        # packed before first, then the one a level fill puts higher.
        sides.sort(key=lambda side: (lengths[side[0]].tobytes() not in packed, -side[2]))
        new_bins, priced = np.empty(samples.size, dtype=np.int64), [np.zeros(0), np.zeros(0)]
        for side, s, _ in sides:
            slots = _pack_side(lengths[side], m, cap, packed)
            if slots is None:
                break
            new_bins[side] = bins[s][slots]
            priced[s] = _priced(st, samples, side, slots, bins[s])
            if int(priced[s].sum()) >= best_max:
                break
        else:
            best_max = int(max(priced[0].sum(), priced[1].sum()))
            best = new_bins, np.concatenate(priced)
    if best is None:
        return False
    new_bins, cost = best
    st.bin_of[samples] = new_bins
    st.recount(samples, np.concatenate(bins), cost)
    now_on_a = new_bins // m == a
    members[a], members[b] = samples[now_on_a], samples[~now_on_a]
    return True


def _pooled(now_a: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """The groups whose splits are listed (indices, ascending): all of them up to
    `MAX_POOLED`; past it, each rank's groups of most tokens, half of `MAX_POOLED` from each
    (more from one where the other has fewer), the rest staying where they are. The large
    groups are the ones no piece move shifts (a group of 8 RL responses lies in most of its
    rank's micro-batches). Pooling the smallest instead lowered the cases of `_SUBSET_TRY`
    0.61% on average against 0.66%; the largest and smallest alternately, 0.66%."""
    g = now_a.size
    if g <= MAX_POOLED:
        return np.arange(g)
    order = np.lexsort((np.arange(g), -tokens))  # most tokens first, ties: lower group
    on_a, on_b = order[now_a[order]], order[~now_a[order]]
    k_a = min(on_a.size, max(MAX_POOLED // 2, MAX_POOLED - on_b.size))
    return np.sort(np.concatenate([on_a[:k_a], on_b[: MAX_POOLED - k_a]]))


def _lowest(values: np.ndarray, k: int) -> np.ndarray:
    """``np.argsort(values, kind="stable")[:k]``: the ``k`` lowest, ties to the lower index,
    without sorting all of them (a stable sort of 4,096 splits took ~0.1 ms a pair)."""
    if values.size > 8 * k:
        kth = np.partition(values, k - 1)[k - 1]
        low = np.flatnonzero(~(values > kth))  # all but the larger ones (NaN: none larger)
        return low[np.argsort(values[low], kind="stable")[:k]]
    return np.argsort(values, kind="stable")[:k]


def _level_cost(st: BinState, part: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """A side's cost if its ``tokens`` filled its ``m`` micro-batches evenly: its samples'
    parts, the fixed costs, and (separable costs) the token curve at an even share. Exact
    for an additive cost."""
    fixed = float(st.m * st.fixed_q)
    if not st.separable:
        return part + fixed
    return part + fixed + st.m * st.token_q(np.ceil(tokens / st.m).astype(np.int64)).astype(np.float64)


def _pack_side(mine: np.ndarray, m: int, cap: int,
               packed: dict[bytes, np.ndarray | None]) -> np.ndarray | None:
    """Each of samples ``mine``'s (lengths, ascending by sample) micro-batch slot (0..m-1),
    or None if they do not pack. ``packed``: the sides packed so far (None: it does not
    pack) by their lengths' bytes, added to."""
    key = mine.tobytes()
    if key not in packed:
        packed[key], _ = pack_tokens(mine, m, cap, max_rounds=_ROUNDS)
        if packed[key] is None:  # fewer rounds can fail where more succeed
            packed[key], _ = pack_tokens(mine, m, cap)
    return packed[key]


def _priced(st: BinState, samples: np.ndarray, side: np.ndarray, slots: np.ndarray,
            bins: np.ndarray) -> np.ndarray:
    """Exact costs of one rank's micro-batches ``bins`` (consecutive) once ``samples[side]``
    sit in ``bins[slots]`` and every other of ``samples`` leaves them (each of ``bins``
    keeps at least one sample: the packer fills exactly ``m``)."""
    old = st.bin_of[samples] - bins[0]
    was = (old >= 0) & (old < bins.size)
    k = bins.size

    def change(weights: np.ndarray) -> np.ndarray:  # float sums of integers under 2**53: exact
        moved = (np.bincount(slots, weights=weights[side], minlength=k)
                 - np.bincount(old[was], weights=weights[was], minlength=k))
        return moved.astype(np.int64)

    return st.priced(bins, change(st.lengths[samples]), change(st.part[samples]))
