"""Local search over whole groups, on true micro-batch costs (samples that share a rank).

`groups.place_groups` balances the groups' marginal costs over the ranks, then packs each
rank. Under a calibrated model a micro-batch's cost is not the sum of its samples' marginal
costs (the token curve has steps), so the packed ranks came out 0.7-2.9% apart under the
H200 profile on RL-like batches in groups of 2-16, where samples alone balance within
0.02%. This pass works on the packed placement: for each pair of a heavy rank A and a light
rank B (as `refine` pairs them), it prices exactly

- every move of one of A's groups to B, and
- swaps of a group of A with one of B (the two whose marginal costs lie either side of
  half the gap, as `refine.swap_partners` finds them),

and applies the one that lowers the pair's maximum the most. A group's samples sit in one
or more micro-batches of its rank (its pieces, largest first). A move sends its i-th piece
into B's i-th roomiest micro-batch; a swap sends each group's j-th piece into the
micro-batch of the other's (j mod its piece count)-th piece, so the largest take the room
the largest left. No micro-batch may be left empty or go over the cap. Costs are the
placement's own integers, so every priced change is what the placement gets: sweeps cannot
cycle, and every process gets the same result. Additive and separable costs only (a generic
cost would need every candidate micro-batch evaluated).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from costmodel.scheduler.refine import BinState, local_search, pair_ranks, swap_partners
from costmodel.scheduler.sorting import first_min_per_pair, run_starts, segments, stable_order

__all__ = ["group_local_search"]

_NONE = np.iinfo(np.int64).max
# Sweeps per search: on bench_grouped-like batches (n 2k-65k, dp 16-1024, groups of 2-16)
# the first 16 took all but 0.1% of what 64 reached (makespan), in 6-60% less time.
_MAX_SWEEPS = 16


def group_local_search(st: BinState, groups: np.ndarray) -> int:
    """Balance ``st`` by moving and swapping whole groups (``groups[i]`` is sample i's dense
    group id); returns the number of changes applied. Not for a generic cost: 0."""
    if not (st.additive or st.separable):
        return 0
    by_group = stable_order(groups)  # samples by group, once: groups never change
    st.tabulate_tokens()  # each sweep prices every group's pieces on the token curve
    return local_search(st, lambda st_, tol, fold: _sweep(st_, groups, by_group, tol, fold),
                        max_sweeps=_MAX_SWEEPS)


class _Pieces(NamedTuple):
    """The groups on paired ranks, each cut into pieces: its samples in one micro-batch."""

    samples: np.ndarray  # sample ids, by group then micro-batch
    piece_start: np.ndarray  # where each piece's samples start in ``samples`` (and an end)
    bin: np.ndarray  # per piece: its micro-batch
    tokens: np.ndarray  # per piece
    part: np.ndarray  # per piece: the samples' summed parts (`BinState.part`)
    count: np.ndarray  # type: ignore[assignment]  # per piece: samples (shadows tuple.count)
    by_size: np.ndarray  # piece ids, by group, largest first (ties: lower micro-batch)
    first: np.ndarray  # per group: its first entry in ``by_size`` (and an end)
    rank: np.ndarray  # per group
    q: np.ndarray  # per group: summed marginal costs (to find swap partners)

    @property
    def size(self) -> np.ndarray:  # per group: its number of pieces
        return np.diff(self.first)


def _pieces(st: BinState, by_group: np.ndarray, groups: np.ndarray) -> _Pieces:
    """The pieces of the groups whose samples ``by_group`` (ordered by group) lists."""
    # Within a group, by micro-batch: nearly sorted already, which a stable sort runs through.
    key = groups[by_group] * (st.dp * st.m) + st.bin_of[by_group]
    samples = by_group[np.argsort(key, kind="stable")]
    g, b = groups[samples], st.bin_of[samples]
    new_group = run_starts(g)
    new_piece = new_group | run_starts(b)
    piece_start = np.flatnonzero(new_piece)
    tokens = np.add.reduceat(st.lengths[samples], piece_start)
    piece_group = np.cumsum(new_group)[piece_start] - 1
    first = np.searchsorted(piece_group, np.arange(piece_group[-1] + 2))
    return _Pieces(
        samples=samples,
        piece_start=np.append(piece_start, samples.size),
        bin=b[piece_start],
        tokens=tokens,
        part=np.add.reduceat(st.part[samples], piece_start),
        count=np.diff(np.append(piece_start, samples.size)),
        # One integer key, nearly sorted already: by group, then most tokens (ties: first).
        by_size=np.argsort(piece_group * (int(tokens.max()) + 1) - tokens, kind="stable"),
        first=first,
        rank=b[piece_start[first[:-1]]] // st.m,
        q=np.add.reduceat(st.q[samples], piece_start[first[:-1]]),
    )


class _Side(NamedTuple):
    """What a change does to one rank: per candidate, its load change and whether legal."""

    delta: np.ndarray
    ok: np.ndarray


def _side(
    st: BinState,
    slot_bin: np.ndarray,
    slot_out: np.ndarray,
    slot_start: np.ndarray,
    in_slot: np.ndarray,
    in_piece: np.ndarray,
    pc: _Pieces,
) -> _Side:
    """Price one rank's side of each candidate. Candidate c owns the micro-batches
    ``slot_bin[slot_start[c]:slot_start[c+1]]``; ``slot_out`` is the piece leaving each
    (-1: none), and piece ``in_piece[e]`` comes into slot ``in_slot[e]``."""
    def into(values: np.ndarray) -> np.ndarray:  # float sums of integers under 2**53: exact
        return np.bincount(in_slot, weights=values[in_piece], minlength=slot_bin.size).astype(np.int64)

    d_tok, d_part, d_count = into(pc.tokens), into(pc.part), into(pc.count)
    out = slot_out >= 0
    d_tok[out] -= pc.tokens[slot_out[out]]
    d_part[out] -= pc.part[slot_out[out]]
    d_count[out] -= pc.count[slot_out[out]]
    count = st.count[slot_bin] + d_count
    fill = st.fill[slot_bin]
    legal = (count >= 1) & ((fill + d_tok <= st.cap) | (count == 1))
    # An illegal slot's price is never read (its candidate is dropped): price it at the cap,
    # on the token table, not on the curve.
    d_tok = np.where(legal, d_tok, np.minimum(d_tok, st.cap - fill))
    delta = st.priced(slot_bin, d_tok, d_part) - st.bin_q[slot_bin]
    starts = slot_start[:-1]
    return _Side(np.add.reduceat(delta, starts), np.logical_and.reduceat(legal, starts))


class _Slots(NamedTuple):
    """The pieces of some groups, each group's largest first, group after group: the slots a
    change of those groups fills (a piece leaves its micro-batch, another may come in)."""

    pieces: np.ndarray
    start: np.ndarray  # where each group's pieces start in ``pieces`` (and an end)
    group: np.ndarray  # per piece: its group's place in the groups asked for
    place: np.ndarray  # per piece: its place among its group's pieces

    def swapped_in(self, other: _Slots) -> np.ndarray:
        """For a swap of each group with the other's (the same places in their lists): the
        slot of the other group's piece that each of these pieces goes into, its j-th into
        the (j mod their piece count)-th, so the largest take the room the largest left."""
        return other.start[self.group] + self.place % np.diff(other.start)[self.group]


def _slots(pc: _Pieces, groups_: np.ndarray) -> _Slots:
    group, place = segments(pc.size[groups_])
    return _Slots(pc.by_size[pc.first[groups_][group] + place],
                  np.append(0, np.cumsum(pc.size[groups_])), group, place)


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
    a = np.flatnonzero(on_a)
    pa = pair_of[a]
    load_a, load_b = st.load[a_ranks[pa]], st.load[b_ranks[pa]]

    # Group a leaves A (its pieces' micro-batches lose them): shared by moves and swaps.
    sa = _slots(pc, a)
    none = np.zeros(0, dtype=np.int64)
    leave = _side(st, pc.bin[sa.pieces], sa.pieces, sa.start, none, none, pc)

    # Moves: a's i-th piece into B's i-th roomiest micro-batch.
    m = st.m
    roomy = np.argsort(st.fill.reshape(st.dp, m), axis=1, kind="stable") + (np.arange(st.dp) * m)[:, None]
    move = _side(st, roomy[b_ranks[pa[sa.group]], sa.place], np.full(sa.pieces.size, -1),
                 sa.start, np.arange(sa.pieces.size), sa.pieces, pc)
    # Per kind of change (the move, then each swap partner), each group's new pair maximum.
    values = [np.where(leave.ok & move.ok,
                       np.maximum(load_a + leave.delta, load_b + move.delta), _NONE)]
    partners = []

    # Swaps: a with a group h of B, each piece into the other's pieces' micro-batches.
    pair_b_of = np.where(on_a, -1, pair_of)
    for h in swap_partners(pa, pc.q[a], gap[pa], pair_b_of, pc.q, int(gap.max())):
        sh = _slots(pc, h)
        into_a = _side(st, pc.bin[sa.pieces], sa.pieces, sa.start, sh.swapped_in(sa),
                       sh.pieces, pc)
        into_b = _side(st, pc.bin[sh.pieces], sh.pieces, sh.start, sa.swapped_in(sh),
                       sa.pieces, pc)
        ok = (pair_b_of[h] == pa) & into_a.ok & into_b.ok
        values.append(np.where(ok, np.maximum(load_a + into_a.delta, load_b + into_b.delta), _NONE))
        partners.append(h)

    kind = np.argmin(values, axis=0)  # ties: the move, then the first partner
    best = np.min(values, axis=0)
    cand = np.flatnonzero(best < load_a)  # strictly lowers the pair's maximum
    if cand.size == 0:
        return 0
    win = cand[first_min_per_pair(pa[cand], best[cand])]  # ties: the lower group
    # Applied as priced above, all at once: each pair changes its own ranks' groups, and
    # every destination is read from the sweep's start (pc, roomy).
    moved, swapped = win[kind[win] == 0], win[kind[win] > 0]
    sm = _slots(pc, a[moved])
    sent, to = [sm.pieces], [roomy[b_ranks[pa[moved]][sm.group], sm.place]]
    if swapped.size:
        g, h = a[swapped], np.stack(partners)[kind[swapped] - 1, swapped]
        sg, sh = _slots(pc, g), _slots(pc, h)
        sent += [sh.pieces, sg.pieces]
        to += [pc.bin[sg.pieces[sh.swapped_in(sg)]],
               pc.bin[sh.pieces[sg.swapped_in(sh)]]]
    _send(st, pc, np.concatenate(sent), np.concatenate(to))
    st.refresh()
    return int(win.size)


def _send(st: BinState, pc: _Pieces, pieces: np.ndarray, to: np.ndarray) -> None:
    """Put each piece's samples into micro-batch ``to`` (books: `BinState.refresh`)."""
    seg, j = segments(pc.count[pieces])
    st.bin_of[pc.samples[pc.piece_start[pieces][seg] + j]] = to[seg]
