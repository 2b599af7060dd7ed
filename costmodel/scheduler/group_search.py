"""Local search over whole groups, on true micro-batch costs (samples that share a rank).

`groups.place_groups` balances the groups' marginal costs over the ranks, then packs each
rank. Under a calibrated model a micro-batch's cost is not the sum of its samples' marginal
costs (the token curve has steps), so the packed ranks came out 0.7-2.9% apart under the
H200 profile on RL-like batches in groups of 8-16, where samples alone balance within
0.02%. This pass works on the packed placement: for each pair of a heavy rank A and a light
rank B (as `refine` pairs them), it prices exactly

- every move of one of A's groups into B's roomiest micro-batch, and
- swaps of a group of A with one of B (the two whose marginal costs lie either side of
  half the gap, as `refine.swap_partners` finds them), each group going into the
  micro-batch that held most of the other's tokens,

and applies the one that lowers the pair's maximum the most. A group's samples may sit in
several micro-batches of its rank; each loses its share, and none may be left empty or go
over the cap. Costs are the placement's own integers, so every priced change is what the
placement gets: sweeps cannot cycle, and every process gets the same result. Additive and
separable costs only (a generic cost would need every candidate micro-batch evaluated).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from costmodel.scheduler.refine import (
    BinState,
    first_min_per_pair,
    local_search,
    pair_ranks,
    swap_partners,
)
from costmodel.scheduler.sorting import stable_order

__all__ = ["group_local_search"]


def group_local_search(st: BinState, groups: np.ndarray) -> int:
    """Balance ``st`` by moving and swapping whole groups (``groups[i]`` is sample i's dense
    group id); returns the number of changes applied. Not for a generic cost: 0."""
    if not (st.additive or st.separable):
        return 0
    by_group = stable_order(groups)  # samples by group, once: groups never change
    return local_search(st, lambda st_, tol, fold: _sweep(st_, groups, by_group, tol, fold))


class _Pieces(NamedTuple):
    """The groups on paired ranks, and the pieces they leave behind in each micro-batch."""

    samples: np.ndarray  # sample ids, by group then micro-batch
    group_start: np.ndarray  # where each group's samples start in ``samples``
    bin: np.ndarray  # per piece (a group's samples in one micro-batch): the micro-batch
    tokens: np.ndarray  # per piece
    part: np.ndarray  # per piece: the samples' summed parts (`BinState.part`)
    left: np.ndarray  # per piece: its micro-batch's cost change once the piece leaves
    rank: np.ndarray  # per group
    leave_delta: np.ndarray  # per group: what its rank's load changes by when it leaves
    can_leave: np.ndarray  # per group: no micro-batch of its rank is left empty
    total_tokens: np.ndarray  # per group
    total_part: np.ndarray  # per group
    q: np.ndarray  # per group: summed marginal costs (to find swap partners)
    main: np.ndarray  # per group: the piece with the most tokens


def _pieces(st: BinState, by_group: np.ndarray, groups: np.ndarray) -> _Pieces:
    """The pieces of the groups whose samples ``by_group`` (ordered by group) lists."""
    # Within a group, by micro-batch: nearly sorted already, which a stable sort runs through.
    key = groups[by_group] * (st.dp * st.m) + st.bin_of[by_group]
    samples = by_group[np.argsort(key, kind="stable")]
    g, b = groups[samples], st.bin_of[samples]
    new_group = np.concatenate([[True], g[1:] != g[:-1]])
    new_piece = new_group | np.concatenate([[True], b[1:] != b[:-1]])
    piece_start = np.flatnonzero(new_piece)
    group_start = np.flatnonzero(new_group)
    bins = b[piece_start]
    tokens = np.add.reduceat(st.lengths[samples], piece_start)
    part = np.add.reduceat(st.part[samples], piece_start)
    count = np.diff(np.append(piece_start, samples.size))
    first_piece = np.searchsorted(piece_start, group_start)
    left = st.priced(bins, -tokens, -part) - st.bin_q[bins]
    # The piece with the most tokens (ties: the first) takes the other group in a swap.
    piece_group = np.cumsum(new_group)[piece_start] - 1
    most = np.flatnonzero(tokens == np.maximum.reduceat(tokens, first_piece)[piece_group])
    return _Pieces(
        samples=samples,
        group_start=group_start,
        bin=bins,
        tokens=tokens,
        part=part,
        left=left,
        rank=b[group_start] // st.m,
        leave_delta=np.add.reduceat(left, first_piece),
        can_leave=np.minimum.reduceat(st.count[bins] - count, first_piece) >= 1,
        total_tokens=np.add.reduceat(tokens, first_piece),
        total_part=np.add.reduceat(part, first_piece),
        q=np.add.reduceat(st.q[samples], group_start),
        main=most[np.searchsorted(most, first_piece)],
    )


def _sweep(st: BinState, groups: np.ndarray, by_group: np.ndarray, tol: float, fold: bool) -> int:
    """One sweep of group moves and swaps over all rank pairs; returns changes applied."""
    pairs = pair_ranks(st.load, tol, fold)
    if pairs is None:
        return 0
    a_ranks, b_ranks, gap, pair_a, pair_b = pairs
    rank = st.bin_of[by_group] // st.m
    pc = _pieces(st, by_group[(pair_a[rank] >= 0) | (pair_b[rank] >= 0)], groups)
    on_a = pair_a[pc.rank] >= 0
    pair_of = np.where(on_a, pair_a[pc.rank], pair_b[pc.rank])
    a = np.flatnonzero(on_a & pc.can_leave)
    if a.size == 0:
        return 0
    pa = pair_of[a]
    load_a, load_b = st.load[a_ranks[pa]], st.load[b_ranks[pa]]

    # Moves: group a into B's roomiest micro-batch.
    m = st.m
    roomiest = np.argmin(st.fill.reshape(st.dp, m), axis=1) + np.arange(st.dp) * m
    dst = roomiest[b_ranks[pa]]
    fits = st.fill[dst] + pc.total_tokens[a] <= st.cap
    into = st.priced(dst, pc.total_tokens[a], pc.total_part[a]) - st.bin_q[dst]
    value = np.where(fits, np.maximum(load_a + pc.leave_delta[a], load_b + into), _NONE)
    choice = [(value, np.full(a.size, -1), dst)]

    # Swaps: group a with a group h of B, each into the micro-batch that held most of the
    # other's tokens (its main piece).
    pair_b_of = np.where(on_a, -1, pair_of)
    pair_b_of[~pc.can_leave] = -1
    for h in swap_partners(pa, pc.q[a], gap[pa], pair_b_of, pc.q, int(gap.max())):
        ma, mh = pc.main[a], pc.main[h]
        ba, bh = pc.bin[ma], pc.bin[mh]
        # Each main micro-batch: what it lost (priced in leave_delta) undone, then priced
        # with the lost piece gone and the other group in.
        new_a = st.priced(ba, pc.total_tokens[h] - pc.tokens[ma], pc.total_part[h] - pc.part[ma])
        new_h = st.priced(bh, pc.total_tokens[a] - pc.tokens[mh], pc.total_part[a] - pc.part[mh])
        ok = (
            (pair_b_of[h] == pa)
            & (st.fill[ba] - pc.tokens[ma] + pc.total_tokens[h] <= st.cap)
            & (st.fill[bh] - pc.tokens[mh] + pc.total_tokens[a] <= st.cap)
        )
        after_a = load_a + pc.leave_delta[a] - pc.left[ma] + new_a - st.bin_q[ba]
        after_b = load_b + pc.leave_delta[h] - pc.left[mh] + new_h - st.bin_q[bh]
        choice.append((np.where(ok, np.maximum(after_a, after_b), _NONE), h, bh))

    values = np.stack([c[0] for c in choice])
    kind = np.argmin(values, axis=0)  # ties: the move, then the first partner
    best = values[kind, np.arange(a.size)]
    cand = np.flatnonzero(best < load_a)  # strictly lowers the pair's maximum
    if cand.size == 0:
        return 0
    win = cand[first_min_per_pair(pa[cand], best[cand])]  # ties: the lower group
    for c in win.tolist():
        k = int(kind[c])
        g = int(a[c])
        if k == 0:
            _send(st, pc, g, int(dst[c]))
        else:
            h = int(choice[k][1][c])
            _send(st, pc, h, int(pc.bin[pc.main[g]]))
            _send(st, pc, g, int(choice[k][2][c]))
    st.refresh()
    return int(win.size)


def _send(st: BinState, pc: _Pieces, g: int, to: int) -> None:
    """Put every sample of group position ``g`` into micro-batch ``to`` (books: `refresh`)."""
    end = pc.group_start[g + 1] if g + 1 < pc.group_start.size else pc.samples.size
    st.bin_of[pc.samples[pc.group_start[g] : end]] = to


_NONE = np.iinfo(np.int64).max
